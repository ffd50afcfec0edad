"""Train the demo GPT at a tiny size with the callback; knobs to slow a rank, fail or run long.

Used by the tests as a real process: real Lightning DDP over gloo, real signals.
"""

import argparse
import os
import signal
import sys
import time
from datetime import timedelta

import pytorch_lightning as pl

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from conftest import tiny_gpt_cfg  # noqa: E402
from nemo_throughput import ThroughputCallback  # noqa: E402
from nemo_throughput.demo.gpt import DemoGPT  # noqa: E402


class InstrumentedGPT(DemoGPT):
    def __init__(self, cfg, args):
        super().__init__(cfg)
        self.args = args

    def training_step(self, batch, batch_idx):
        step = self.trainer.global_step + 1  # the optimizer step this micro-batch belongs to
        if self.args.kill_at and step == self.args.kill_at + 1 and self.trainer.global_rank == 0:
            os.killpg(0, signal.SIGKILL)  # every rank of this job, with step kill_at finished and nothing after
        if self.args.fail_at and step == self.args.fail_at:
            raise RuntimeError(f"injected failure at step {step}")
        time.sleep(self.args.step_sleep_s)
        if self.trainer.global_rank == self.args.slow_rank:
            time.sleep(self.args.slow_s)
            if step == self.args.stall_at:
                sleep_in_a_stalled_step(self.args.stall_s)
        return super().training_step(batch, batch_idx)


def sleep_in_a_stalled_step(seconds):
    """A rank that stops making progress (a hang), by a name its stack shows."""
    time.sleep(seconds)


def strategy(args):
    if args.devices == 1:
        return "auto"
    if args.process_group_timeout_s is None:
        return "ddp"
    return pl.strategies.DDPStrategy(timeout=timedelta(seconds=args.process_group_timeout_s))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--log-every", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--step-sleep-s", type=float, default=0.0)
    parser.add_argument("--slow-rank", type=int, default=-1)
    parser.add_argument("--slow-s", type=float, default=0.0)
    parser.add_argument("--fail-at", type=int, default=0)
    parser.add_argument("--stall-at", type=int, default=0, help="the slow rank sleeps --stall-s in this step")
    parser.add_argument("--stall-s", type=float, default=0.0)
    parser.add_argument("--stall-min-s", type=float, default=300.0, help="the stall watch's stall_min_s")
    parser.add_argument("--per-step-jsonl", action="store_true")
    parser.add_argument("--profile-steps", type=int, nargs=2, default=None, metavar=("FIRST", "LAST"))
    parser.add_argument("--trace-rank", type=int, action="append", default=None)
    parser.add_argument("--probe", action="store_true")
    parser.add_argument("--no-callback", action="store_true", help="train without ThroughputCallback")
    parser.add_argument("--checkpoint-every", type=int, default=0, help="save a checkpoint every N steps")
    parser.add_argument("--resume", action="store_true", help="resume from the last checkpoint, if any")
    parser.add_argument("--resume-from", default=None, help="resume from this checkpoint")
    parser.add_argument("--checkpoint-dir", default=None, help="where checkpoints go (default: OUTPUT_DIR/checkpoints)")
    parser.add_argument("--kill-at", type=int, default=0,
                        help="SIGKILL the process group (every rank) once step N is finished")
    parser.add_argument("--process-group-timeout-s", type=float, default=None,
                        help="DDPStrategy(timeout=...): how long a collective may wait for the other ranks")
    parser.add_argument("--peak-tflops", type=float, default=None)
    parser.add_argument("--prometheus-port", type=int, default=None, help="serve /metrics on 127.0.0.1:PORT")
    parser.add_argument("--linger-s", type=float, default=0.0, help="keep serving it that long after the end")
    args = parser.parse_args()

    cfg = tiny_gpt_cfg(global_batch_size=2 * args.devices)
    callback = ThroughputCallback(log_every_n_steps=args.log_every, warmup_steps=args.warmup,
                                  output_dir=args.output_dir, per_step_jsonl=args.per_step_jsonl,
                                  profile_steps=args.profile_steps, profile_trace_ranks=args.trace_rank,
                                  probe=args.probe, peak_tflops=args.peak_tflops, stall_min_s=args.stall_min_s,
                                  prometheus=None if args.prometheus_port is None else
                                  {"port": args.prometheus_port, "addr": "127.0.0.1", "linger_s": args.linger_s})
    checkpoints = args.checkpoint_dir or os.path.join(args.output_dir, "checkpoints")
    saving = [pl.callbacks.ModelCheckpoint(dirpath=checkpoints, every_n_train_steps=args.checkpoint_every,
                                           save_top_k=-1, save_last=True)] if args.checkpoint_every else []
    trainer = pl.Trainer(accelerator="cpu", devices=args.devices, strategy=strategy(args),
                         max_steps=args.steps, logger=False, enable_checkpointing=bool(saving),
                         enable_progress_bar=False, enable_model_summary=False,
                         callbacks=([] if args.no_callback else [callback]) + saving,
                         default_root_dir=args.output_dir)
    last = os.path.join(checkpoints, "last.ckpt")
    resume = args.resume_from or (last if args.resume and os.path.exists(last) else None)
    trainer.fit(InstrumentedGPT(cfg, args), ckpt_path=resume)


if __name__ == "__main__":
    main()
