"""A LightningModule that is not GPT (tests/test_any_model.py's TinyUNet) trained with DDP on CPU,
with measured FLOPs and a time-to-target that stops training: argv[1] is the output directory,
argv[2] the number of ranks."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))

import pytorch_lightning as pl  # noqa: E402
from test_any_model import TinyUNet, Trainee  # noqa: E402

from nemo_throughput import ThroughputCallback  # noqa: E402


class LoggingTrainee(Trainee):
    def training_step(self, batch, batch_idx):
        self.log("progress", float(self.global_step))
        return super().training_step(batch, batch_idx)


def main(output_dir: str, ranks: int) -> None:
    callback = ThroughputCallback(output_dir=output_dir, micro_batch_size=4, model_name="unet",
                                  flops_formula="measured", warmup_steps=1, log_every_n_steps=2,
                                  target={"metric": "progress", "value": 5, "mode": "max", "stop": True})
    trainer = pl.Trainer(max_steps=20, accelerator="cpu", devices=ranks, strategy="ddp", callbacks=[callback],
                         logger=False, enable_progress_bar=False, enable_model_summary=False,
                         enable_checkpointing=False, default_root_dir=output_dir)
    trainer.fit(LoggingTrainee(TinyUNet(), TinyUNet.data(), 4))
    print(f"rank {trainer.global_rank} stopped at step {trainer.global_step}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
