"""Megatron-Bridge's full ``pretrain`` loop with our callback, one GPU (Python 3.12, megatron-bridge 0.6.2
with its dependencies, megatron-core >= 0.17): the part of issue 14 that cannot run on the CPU machines.

    torchrun --nproc_per_node=1 tests/gpu/bridge_pretrain.py --out "$OUT"
    tests/gpu/run_on_device.sh --only bridge .gpu-bundle/bridge   # the GPU machine: `bundle.sh bridge`'s site

First run 2026-11-27 on one H100, every check true (tests/gpu/README.md). What it does: Bridge's own
vanilla GPT recipe (mock data, NullTokenizer: nothing downloaded) shrunk to a 4-layer GPT,
megatron-core's local layer spec (the device image has no Transformer Engine), no checkpoints, no
evaluation; ``pretrain(cfg, forward_step, callbacks=[BridgeThroughputCallback(...)])``; then checks that
the summary is completed, counts every step, and read the model, batch, dtype and parallel sizes from the
ConfigContainer. Writes bridge_pretrain.json (the checks and the summary's key figures) to OUT.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from megatron.bridge.models.gpt_provider import local_layer_spec
from megatron.bridge.recipes.gpt.vanilla_gpt import vanilla_gpt_pretrain_config
from megatron.bridge.training.gpt_step import forward_step
from megatron.bridge.training.pretrain import pretrain

from nemo_throughput import BridgeThroughputCallback

STEPS = 30


def small_gpt_config():
    cfg = vanilla_gpt_pretrain_config()
    model = cfg.model
    model.num_layers, model.hidden_size, model.num_attention_heads = 4, 512, 8
    model.ffn_hidden_size = 2048
    model.seq_length = cfg.dataset.seq_length = 1024
    model.transformer_layer_spec = local_layer_spec
    model.gradient_accumulation_fusion = False  # needs Apex / TE kernels
    model.masked_softmax_fusion = False
    cfg.train.train_iters, cfg.train.global_batch_size, cfg.train.micro_batch_size = STEPS, 8, 2
    cfg.validation.eval_interval = None
    cfg.checkpoint.save = cfg.checkpoint.load = None
    cfg.logger.log_interval = 5
    cfg.logger.tensorboard_dir = None
    cfg.scheduler.lr_warmup_iters = 2
    return cfg


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    # Bridge's set-up runs `make` on megatron-core's dataset helpers, which the wheel ships compiled;
    # a machine without a compiler (the GPU machines here) fails there: keep the shipped build.
    import megatron.bridge.training.initialize as initialize

    initialize.compile_helpers = lambda: None
    cfg = small_gpt_config()
    ours = BridgeThroughputCallback(output_dir=str(args.out / "throughput"), log_every_n_steps=5, warmup_steps=5)
    pretrain(cfg, forward_step, callbacks=[ours])
    summary = json.loads(Path(ours.summary_path).read_text())
    checks = {
        "completed": summary["status"] == "completed",
        "every_step": summary["timing"]["last_step"] == STEPS,
        "measured": summary["timing"]["steps_measured"] == STEPS - 5 - summary["timing"]["skipped_steps"],
        "batch": summary["batch"]["global_batch_size"] == 8 and summary["batch"]["seq_length"] == 1024,
        "model": summary["model"]["spec"]["num_layers"] == 4 and summary["model"]["spec"]["hidden_size"] == 512,
        "dtype": summary["hardware"]["dtype"] == "bf16",
        "parallel": summary["parallel"]["data"] == 1,
    }
    result = {"checks": checks, "ok": all(checks.values()), "step_time_s": summary["timing"]["step_time_s"],
              "throughput": summary["throughput"], "hardware": summary["hardware"]}
    (args.out / "bridge_pretrain.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
