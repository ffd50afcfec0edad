"""Two ranks (real Lightning DDP over gloo) train a tiny LM on packed batches, each rank its own; one
rank's micro-batch at one step is bad (non-monotonic cu_seqlens_unpadded, or lengths the host cannot
read). Used by tests/test_batches.py as a real multi-process run."""

import argparse
import os
import sys

import pytorch_lightning as pl
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from lightning_modules import tiny_lm  # noqa: E402
from nemo_throughput import ThroughputCallback  # noqa: E402

BAD = {"order": [[0, 9, 4, 16]], "unreadable": [0, 8, 16]}  # a device check fails; the host cannot read a list


def rank_batches(rank, steps, bad_rank, bad_step, bad):
    """This rank's micro-batches, one per step: two sequences (5 + rank and 3) packed in 16 slots."""
    batches = [{"tokens": torch.randint(128, (1, 16)),
                "cu_seqlens_unpadded": torch.tensor([[0, 5 + rank, 8 + rank, 8 + rank, -1]])} for _ in range(steps)]
    if rank == bad_rank:
        values = BAD[bad]
        batches[bad_step - 1]["cu_seqlens_unpadded"] = torch.tensor(values) if bad == "order" else values
    return batches


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--bad-rank", type=int, default=1)
    parser.add_argument("--bad-step", type=int, default=6)
    parser.add_argument("--bad", choices=sorted(BAD), default="order")
    args = parser.parse_args()
    rank = int(os.environ.get("LOCAL_RANK", 0))  # Lightning's launcher sets it in the processes it starts
    data = rank_batches(rank, args.steps, args.bad_rank, args.bad_step, args.bad)
    _, module = tiny_lm(data=data, batch_size=None, vocab_size=128, tokens=lambda batch: batch["tokens"])
    callback = ThroughputCallback(output_dir=args.output_dir, log_every_n_steps=3, warmup_steps=1,
                                  micro_batch_size=1, seq_length=16, global_batch_size=2,
                                  model_spec={"num_layers": 1, "hidden_size": 16, "num_attention_heads": 2,
                                              "vocab_size": 128})
    pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_steps=args.steps, logger=False,
               enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
               use_distributed_sampler=False, callbacks=[callback], default_root_dir=args.output_dir).fit(module)


if __name__ == "__main__":
    main()
