"""NeMo 2 `llm.pretrain` of GPT-3 126M on MockDataModule, one GPU: our callback beside NeMo's own
TimingCallback and FLOPsMeasurementCallback in the same run, and both figures side by side.

    python tests/gpu/nemo2_pretrain.py --out "$OUT"              # on the GPU (writes nemo2_compare.json)
    .venv-nemo/bin/python tests/gpu/nemo2_pretrain.py --cpu-check  # here: imports, recipe, trainer build

NeMo 2.5 has no GPT-3 126M recipe module; the 175B recipe is taken with its model swapped for
`GPTConfig126M` and its parallelism set to one GPU. Without Transformer Engine and Apex (the device
image has neither) megatron-core uses its local layer spec; the fusions that need their kernels
are switched off (masked softmax, gradient-accumulation fusion, cross-entropy fusion). MockDataModule
gets a NullTokenizer: its default GPT-2 tokenizer would download its vocabulary.

What is compared (each figure says over which steps and with which FLOPs formula):
- ours: the summary's mean step time over the steps after warm-up (CUDA events, end of one optimizer
  step to the end of the next), tokens/s, TFLOPS/GPU and MFU with the formula we record;
- NeMo: `train_step_timing in s` (host wall clock from on_train_batch_start to on_train_batch_end,
  no synchronize) per step, averaged over the same steps, and the TFLOPS_per_GPU its FLOPs callback
  logs at each log step (its gpt3 formula, its averaging window).

With ``--trace-steps A:B`` a torch.profiler window over those steps of the same run checks that our
hooks launch no kernel, copy nothing and synchronize nothing on non-log steps (the trace goes to OUT).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import statistics
import sys
from pathlib import Path

import fiddle as fdl
import nemo_run as run
from lightning.pytorch import Callback
from nemo.collections import llm
from nemo.collections.common.tokenizers.null_tokenizer import NullTokenizer
from nemo.lightning.pytorch.callbacks.flops_callback import FLOPsMeasurementCallback

from nemo_throughput import ThroughputCallback, nemo_callback

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/, for the gpu package
from gpu.workloads import cuda_calls_in_hooks, label_step_hooks  # noqa: E402

GPT2_VOCAB = 50256  # NullTokenizer adds EOD: 50257 tokens, padded by NeMo to 50304


class NemoFigures(Callback):
    """Reads what NeMo's own callbacks logged, per optimizer step (runs after them)."""

    def __init__(self) -> None:
        self.step_timing_s: dict[int, float] = {}
        self.tflops_per_gpu: dict[int, float] = {}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        metrics = trainer.progress_bar_metrics
        step = trainer.global_step
        if "train_step_timing in s" in metrics:
            self.step_timing_s[step] = float(metrics["train_step_timing in s"])
        if "TFLOPS_per_GPU" in metrics:
            self.tflops_per_gpu[step] = float(metrics["TFLOPS_per_GPU"])


class HookTrace(Callback):
    """A torch.profiler window from the start of step ``first`` to the start of step ``last + 1`` (or
    the end of training), put first among the callbacks so that every hook of those steps is inside."""

    def __init__(self, first: int, last: int, out: Path) -> None:
        self.first, self.last, self.out = first, last, out
        self.profiler = None
        self.found: dict | None = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        step = trainer.global_step + 1
        if step == self.first and self.profiler is None:
            from torch.profiler import ProfilerActivity, profile

            self.profiler = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
            self.profiler.__enter__()
        elif step == self.last + 1:
            self._stop(trainer)

    def on_train_end(self, trainer, pl_module) -> None:
        self._stop(trainer)

    def _stop(self, trainer) -> None:
        if self.profiler is None or self.found is not None:
            return
        self.profiler.__exit__(None, None, None)
        self.found = cuda_calls_in_hooks(list(self.profiler.events()), ours_of(trainer).config.log_every_n_steps)
        self.found["steps"] = [self.first, self.last]
        raw = self.out / "nemo2_trace.json"
        self.profiler.export_chrome_trace(str(raw))
        with open(raw, "rb") as source, gzip.open(f"{raw}.gz", "wb") as packed:
            shutil.copyfileobj(source, packed)
        raw.unlink()


def mock_dataset_makes_its_mask() -> None:
    """Work around NeMo 2.5's MockDataModule: its ``setup()`` passes ``create_attention_mask``
    positionally into ``_MockGPTDataset``'s ``seed`` parameter, so without Transformer Engine (which
    needs no mask) no attention mask is made and ``gpt_forward_step`` asserts. A boolean seed is that
    flag: put it where it belongs."""
    from nemo.collections.llm.gpt.data import mock

    init = mock._MockGPTDataset.__init__

    def init_with_mask(self, tokenizer, name, num_samples, seq_length, seed=42, *args, **kwargs):
        if isinstance(seed, bool):
            kwargs.setdefault("create_attention_mask", seed)
            seed = 42
        init(self, tokenizer, name, num_samples, seq_length, seed, *args, **kwargs)

    mock._MockGPTDataset.__init__ = init_with_mask


def ours_of(trainer) -> ThroughputCallback:
    return next(c for c in trainer.callbacks if isinstance(c, ThroughputCallback))


def build_recipe(args: argparse.Namespace, throughput_dir: str) -> run.Partial:
    recipe = llm.gpt3_175b.pretrain_recipe(name="gpt3_126m", dir=args.log_dir, num_nodes=1, num_gpus_per_node=1)
    config = run.Config(llm.GPTConfig126M, seq_length=args.seq_length, masked_softmax_fusion=False,
                        gradient_accumulation_fusion=False, cross_entropy_loss_fusion=False)
    recipe.model = run.Config(llm.GPTModel, config=config)
    strategy = recipe.trainer.strategy
    strategy.tensor_model_parallel_size = strategy.pipeline_model_parallel_size = 1
    strategy.context_parallel_size = 1
    strategy.virtual_pipeline_model_parallel_size = None
    strategy.pipeline_dtype = None
    strategy.sequence_parallel = False
    strategy.ckpt_async_save = False
    recipe.trainer.max_steps = args.steps
    recipe.trainer.log_every_n_steps = args.log_every
    recipe.trainer.val_check_interval = args.steps + 1  # no validation inside the measured steps
    recipe.trainer.limit_val_batches = 0
    recipe.trainer.enable_checkpointing = False
    recipe.log.ckpt = None
    recipe.data = run.Config(llm.MockDataModule, seq_length=args.seq_length, global_batch_size=args.global_batch_size,
                             micro_batch_size=args.micro_batch_size, num_workers=2,
                             tokenizer=run.Config(NullTokenizer, vocab_size=GPT2_VOCAB))
    # The recipe already holds NeMo's TimingCallback; its FLOPs callback and ours go beside it.
    recipe.trainer.callbacks.append(run.Config(FLOPsMeasurementCallback, model_config=config, data_config=recipe.data,
                                               model_name="gpt3"))
    recipe.trainer.callbacks.append(nemo_callback(log_every_n_steps=args.log_every, warmup_steps=args.warmup_steps,
                                                  output_dir=throughput_dir, run_label="nemo2-gpu"))
    if args.cpu_check:
        recipe.trainer.accelerator = "cpu"
    return recipe


def compare(summary: dict, nemo: NemoFigures, warmup_steps: int, nemo_flops_per_step: float | None) -> dict:
    """Both tools' figures over the same steps (after our warm-up), and each tool's own view."""
    tokens_per_step = summary["batch"]["tokens_per_step"]
    last = summary["timing"]["last_step"]
    same_steps = [s for s in range(warmup_steps + 1, (last or 0) + 1) if s in nemo.step_timing_s]
    nemo_step_s = statistics.fmean(nemo.step_timing_s[s] for s in same_steps) if same_steps else None
    ours = summary["throughput"]
    ours_flops_per_step = summary["model"]["flops_per_sample"] * summary["batch"]["global_batch_size"]
    return {
        "flops_per_step_ours_over_nemo": ours_flops_per_step / nemo_flops_per_step if nemo_flops_per_step else None,
        "steps": {"warmup": warmup_steps, "compared": [same_steps[0], same_steps[-1]] if same_steps else None},
        "ours": {
            "step_time_s": summary["timing"]["step_time_s"],
            "tokens_per_s": ours.get("tokens_per_s"),
            "model_tflops_per_gpu": ours.get("model_tflops_per_gpu"),
            "mfu": ours.get("mfu"),
            "flops_per_sample": summary["model"]["flops_per_sample"],
            "flops_formula": summary["model"]["flops_formula"],
            "peak_tflops": summary["hardware"]["peak_tflops"],
            "peak_source": summary["hardware"]["peak_source"],
            "gpu_name": summary["hardware"]["gpu_name"],
        },
        "nemo": {
            "train_step_timing_mean_s": nemo_step_s,
            "tokens_per_s": tokens_per_step / nemo_step_s if nemo_step_s else None,
            "tflops_per_gpu_same_steps": (nemo_flops_per_step / nemo_step_s / 1e12
                                          if nemo_step_s and nemo_flops_per_step else None),
            "flops_per_step": nemo_flops_per_step,
            "flops_formula": "nemo.utils.flops_formulas.gpt3 (causal attention halved, vocab 51200)",
            "TFLOPS_per_GPU_logged": nemo.tflops_per_gpu,
            "train_step_timing_s": nemo.step_timing_s,
        },
    }


def imported_distributions() -> list[str]:
    """name==version of every installed distribution a loaded module comes from (for the wheel bundle)."""
    import importlib.metadata as metadata

    owners = metadata.packages_distributions()
    names = {dist for module in list(sys.modules) for dist in owners.get(module.partition(".")[0], [])}
    return sorted(f"{name}=={metadata.version(name)}" for name in names)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.environ.get("OUT", "nemo2-out"), help="where the JSON goes ($OUT)")
    parser.add_argument("--log-dir", default=None, help="NeMo's log dir (default: OUT/nemo_logs)")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup-steps", type=int, default=10)
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--global-batch-size", type=int, default=32)
    parser.add_argument("--micro-batch-size", type=int, default=4)
    parser.add_argument("--seq-length", type=int, default=2048)
    parser.add_argument("--cpu-check", action="store_true",
                        help="no GPU: build the recipe and the trainer, run as far as a CPU goes")
    parser.add_argument("--list-distributions", help="write the imported distributions to this file")
    parser.add_argument("--trace-steps", help="A:B, a torch.profiler window over our hooks in steps A to B")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    args.log_dir = args.log_dir or str(out / "nemo_logs")
    throughput_dir = str(out / "throughput")

    mock_dataset_makes_its_mask()
    recipe = build_recipe(args, throughput_dir)
    pretrain = fdl.build(recipe)
    trainer = pretrain.keywords["trainer"]
    nemo = NemoFigures()
    trainer.callbacks.append(nemo)  # last: after NeMo's callbacks have logged
    trace = None
    if args.trace_steps:
        first, last = (int(part) for part in args.trace_steps.split(":"))
        trace = HookTrace(first, last, out)
        label_step_hooks(ours_of(trainer))
        trainer.callbacks.insert(0, trace)  # first: its window opens before our first hook of a step
    flops = next(c for c in trainer.callbacks if isinstance(c, FLOPsMeasurementCallback))
    nemo_flops_per_step, _ = flops.eval_model_flops()
    names = [type(c).__name__ for c in trainer.callbacks]
    print(json.dumps({"callbacks": names, "nemo_flops_per_step": nemo_flops_per_step}), flush=True)

    stopped = None
    try:
        pretrain()
    except Exception as error:  # on a CPU: the missing GPU, once the model is built
        stopped = f"{type(error).__name__}: {error}"
        if not args.cpu_check:
            raise
        print(f"stopped: {stopped}")
    finally:
        if args.list_distributions:
            Path(args.list_distributions).write_text("\n".join(imported_distributions()) + "\n")
    if args.cpu_check:
        return 0 if {"TimingCallback", "FLOPsMeasurementCallback", "ThroughputCallback"} <= set(names) else 1

    summary = json.loads(Path(ours_of(trainer).summary_path).read_text())  # this run's, not an earlier one's
    result = compare(summary, nemo, args.warmup_steps, nemo_flops_per_step)
    result["trace"] = trace.found if trace else None
    (out / "nemo2_compare.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: {n: v for n, v in result[k].items() if not isinstance(v, dict)} for k in ("ours", "nemo")},
                     indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
