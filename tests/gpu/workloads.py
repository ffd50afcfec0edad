"""What the GPU tests run: matmul work of a set length, a small Lightning fit of the demo GPT, and
wrappers around ThroughputCallback's per-step hooks (guarded, counted or profiled)."""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from nemo_throughput.bench.syncs import SyncCounter

STEP_HOOKS = ("on_train_batch_start", "on_before_backward", "on_before_optimizer_step", "on_train_batch_end")


def lightning_namespace() -> str:
    try:
        importlib.import_module("lightning.pytorch")
        return "lightning.pytorch"
    except ImportError:
        return "pytorch_lightning"


class MatmulWork:
    """bf16 matrix products whose total length is asked in milliseconds (calibrated once here)."""

    def __init__(self, size: int = 4096) -> None:
        generator = torch.Generator(device="cuda").manual_seed(0)
        self.a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16, generator=generator)
        self.b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16, generator=generator) / size**0.5
        self.out = torch.empty_like(self.a)
        self.ms_per_matmul = self._calibrate()

    def _matmul(self) -> None:
        torch.matmul(self.a, self.b, out=self.out)

    def _calibrate(self, repeats: int = 200) -> float:
        for _ in range(50):  # clocks up, kernels chosen
            self._matmul()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeats):
            self._matmul()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / repeats

    def run_ms(self, ms: float) -> None:
        for _ in range(max(1, round(ms / self.ms_per_matmul))):
            self._matmul()


def gpt_cfg(**overrides: Any) -> Any:
    """The demo GPT's model section, small enough that a step takes milliseconds on a GPU."""
    cfg = OmegaConf.create({
        "micro_batch_size": 8, "global_batch_size": 8, "tensor_model_parallel_size": 1,
        "pipeline_model_parallel_size": 1, "encoder_seq_length": 256, "num_layers": 2, "hidden_size": 256,
        "ffn_hidden_size": 1024, "num_attention_heads": 4, "num_query_groups": None, "activation": "gelu",
        "make_vocab_size_divisible_by": 128, "tokenizer": {"vocab_size": 1000}, "optim": {"lr": 1e-4}, "seed": 1,
    })
    return OmegaConf.merge(cfg, overrides)


def fit(tmp_path: Path, callbacks: list, steps: int, model: Any = None, cfg: Any = None, **trainer_kwargs: Any) -> Any:
    """A real Lightning fit on the GPU in bf16; returns the trainer."""
    from nemo_throughput.demo.gpt import gpt_module_class

    namespace = lightning_namespace()
    pl = importlib.import_module(namespace)
    torch.manual_seed(0)
    model = model if model is not None else gpt_module_class(namespace)(cfg or gpt_cfg())
    settings = dict(max_steps=steps, accelerator="gpu", devices=1, precision="bf16-mixed", callbacks=callbacks,
                    logger=False, log_every_n_steps=50, enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False, default_root_dir=str(tmp_path))
    trainer = pl.Trainer(**{**settings, **trainer_kwargs})
    trainer.fit(model)
    return trainer


def step_of(hook_name: str, trainer: Any) -> int:
    """The optimizer step a hook call belongs to: on_train_batch_end runs after the step's increment."""
    return trainer.global_step + (0 if hook_name == "on_train_batch_end" else 1)


def wrap_step_hooks(callback: Any, around: Callable[[str, Any], contextlib.AbstractContextManager]) -> None:
    """Run each per-step hook of ``callback`` inside ``around(hook_name, trainer)``."""
    for name in STEP_HOOKS:
        hook = getattr(callback, name)

        def wrapped(trainer: Any, *args: Any, _hook: Any = hook, _name: str = name, **kwargs: Any) -> Any:
            with around(_name, trainer):
                return _hook(trainer, *args, **kwargs)

        setattr(callback, name, wrapped)


class SyncGuard:
    """ThroughputCallback's per-step hooks under torch.cuda.set_sync_debug_mode: "error" on non-log
    steps (any synchronization fails the fit), "warn" on log steps (synchronizations counted)."""

    def __init__(self, callback: Any) -> None:
        self.log_every = callback.config.log_every_n_steps
        self.guarded_calls = 0
        self.syncs_by_log_step: dict[int, int] = {}
        wrap_step_hooks(callback, self._around)

    @contextlib.contextmanager
    def _around(self, hook_name: str, trainer: Any) -> Iterator[None]:
        step = step_of(hook_name, trainer)
        if step % self.log_every:
            self.guarded_calls += 1
            with SyncCounter("error"):
                yield
        else:
            with SyncCounter("warn") as counter:
                yield
            self.syncs_by_log_step[step] = self.syncs_by_log_step.get(step, 0) + counter.count


# ------------------------------------------------------------------------------ profiler traces
TRACE_RANGE = "nemo_throughput"  # record_function ranges around our hooks: nemo_throughput/<hook>/step<N>


def cuda_call_kind(name: str) -> str | None:
    """What a CUDA runtime/driver call in a torch.profiler trace does, as far as the checks care."""
    if "LaunchKernel" in name or name.startswith("cuLaunch") or "GraphLaunch" in name:
        return "kernel"
    if "Memcpy" in name or "Memset" in name:
        return "memcpy"
    if "Synchronize" in name:  # cudaStreamWaitEvent is a wait on the device, not of the host
        return "sync"
    return None


def label_step_hooks(callback: Any) -> None:
    """Wrap ``callback``'s per-step hooks in record_function ranges named after the hook and step."""
    from torch.profiler import record_function

    @contextlib.contextmanager
    def labelled(hook_name: str, trainer: Any) -> Iterator[None]:
        with record_function(f"{TRACE_RANGE}/{hook_name}/step{step_of(hook_name, trainer)}"):
            yield

    wrap_step_hooks(callback, labelled)


def cuda_calls_in_hooks(events: list, log_every: int) -> dict[str, Any]:
    """Kernel launches, copies and synchronizations that started inside our hooks' ranges, by range;
    and the same for non-log steps only (what must be empty)."""
    ranges = [e for e in events if e.name.startswith(TRACE_RANGE + "/")]
    calls = [(e, cuda_call_kind(e.name)) for e in events if cuda_call_kind(e.name)]
    by_range: dict[str, dict[str, int]] = {}
    for r in ranges:
        for e, kind in calls:
            if r.time_range.start <= e.time_range.start <= r.time_range.end:
                counts = by_range.setdefault(r.name, {})
                counts[kind] = counts.get(kind, 0) + 1
    non_log = {name: c for name, c in by_range.items() if int(name.rsplit("step", 1)[1]) % log_every}
    return {"hook_ranges": len(ranges), "cuda_calls_in_trace": len(calls), "calls_in_hooks_by_range": by_range,
            "calls_in_hooks_on_non_log_steps": non_log}
