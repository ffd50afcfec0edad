"""Pretrain the demo GPT, NeMo style: ``python -m nemo_throughput.demo.train +callbacks=throughput``.

Like NeMo's ``megatron_gpt_pretraining.py`` this script knows nothing about nemo-throughput:
the callback arrives through ``+callbacks=throughput`` alone.
"""

from __future__ import annotations

import contextlib
import warnings

import hydra
import pytorch_lightning as pl
import torch
from omegaconf import DictConfig
from pytorch_lightning.loggers import CSVLogger

from nemo_throughput.demo.gpt import DemoGPT

# `lightning` (the callback's other namespace) adds a console handler to its logger on import.
# Imported here, before Hydra applies conf/hydra/job_logging/demo.yaml, that config can take the
# handler over; imported later (by the callback), every Lightning INFO line would print twice.
with contextlib.suppress(ImportError):
    import lightning.pytorch  # noqa: F401

# Lightning 2.6 still builds torch.utils._pytree.LeafSpec, which torch 2.13 deprecates, once per
# rank and run; nothing a demo user can act on. Only that warning, only from that module.
warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated", category=FutureWarning,
                        module=r"(pytorch_lightning|lightning\.pytorch)\.utilities\._pytree")
# On a host with Slurm's tools installed, Lightning suggests prefixing the command with srun; the demo
# starts its own ranks on purpose (and under srun Lightning uses Slurm's, without this warning).
warnings.filterwarnings("ignore", message=r"The `srun` command is available on your system but is not used")


def gradient_accumulation(model_cfg: DictConfig, world_size: int) -> int:
    """NeMo's rule: global batch = micro batch x accumulation x data-parallel size."""
    data_parallel = world_size // (model_cfg.tensor_model_parallel_size * model_cfg.pipeline_model_parallel_size)
    per_step = model_cfg.micro_batch_size * data_parallel
    if model_cfg.global_batch_size % per_step:
        raise ValueError(f"global_batch_size={model_cfg.global_batch_size} is not a multiple of "
                         f"micro_batch_size x data-parallel size = {per_step}")
    return model_cfg.global_batch_size // per_step


@hydra.main(version_base=None, config_path="conf", config_name="gpt_demo")
def main(cfg: DictConfig) -> None:
    pl.seed_everything(cfg.model.seed, verbose=False)
    world_size = cfg.trainer.devices * cfg.trainer.num_nodes
    trainer = pl.Trainer(
        **cfg.trainer,
        strategy="ddp" if world_size > 1 else "auto",
        accumulate_grad_batches=gradient_accumulation(cfg.model, world_size),
        logger=CSVLogger(cfg.exp_manager.exp_dir, name=cfg.exp_manager.name),
    )
    trainer.fit(DemoGPT(cfg.model))
    if torch.distributed.is_initialized():  # torch asks each process to end its groups before it exits
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
