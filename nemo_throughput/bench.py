"""`nemo-throughput bench`: what the callback costs and how right it measures, beside the tools users
would otherwise use, in one run.

The demo GPT trains for a fixed number of steps under each condition, conditions interleaved
(A B C A B C ...) for several rounds. Every trial carries the same harness callback, which reads
a synchronized wall clock at the first and last step of the window: its elapsed time over the
step count is the true step time. Per condition: the median true step time over rounds, its
overhead against no callback (the median, and the mean of the per-round ratios with a 95 %
confidence interval: rounds are paired, since each round runs every condition once), and the
step time the condition's own tool reported over the same steps, with its error against the true
one; the time its hooks take per step on the host. On CUDA one more round, untimed, counts the
host-device synchronizations per step, in the whole step and in the tool's own hooks
(:class:`SyncCounter`).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import gc
import importlib
import importlib.util
import json
import math
import platform
import statistics
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nemo_throughput.flops import ModelSpec, model_flops_per_sample
from nemo_throughput.outputs import OutputPathError, check_output_file, write_output
from nemo_throughput.window import Window

# torch, Lightning and OmegaConf are imported in the functions that use them: `nemo-throughput --help`
# and the other subcommands register this one's options without loading them.

SIZES = {
    # CPU-sized: about 0.1 s a step on two cores
    "cpu": dict(num_layers=2, hidden_size=128, ffn_hidden_size=512, num_attention_heads=4, encoder_seq_length=128,
                micro_batch_size=8, vocab_size=2048),
    # GPT-3 shapes (Brown et al. 2020, table 2.1), sequence 2048, for a GPU in bf16
    "gpt3-126m": dict(num_layers=12, hidden_size=768, ffn_hidden_size=3072, num_attention_heads=12,
                      encoder_seq_length=2048, micro_batch_size=8, vocab_size=50257),
    "gpt3-1.3b": dict(num_layers=24, hidden_size=2048, ffn_hidden_size=8192, num_attention_heads=16,
                      encoder_seq_length=2048, micro_batch_size=4, vocab_size=50257),
    # the largest that trains on one 80 GB GPU without activation checkpointing (about 55 GB at micro-batch 2)
    "gpt3-2.7b": dict(num_layers=32, hidden_size=2560, ffn_hidden_size=10240, num_attention_heads=32,
                      encoder_seq_length=2048, micro_batch_size=2, vocab_size=50257),
}
CONDITIONS = ("no-callback", "nemo-throughput", "nemo-throughput-debug", "lightning-throughput-monitor",
              "nemo-timing-callback")
DEVICES = ("auto", "cpu", "cuda")
LOG_EVERY_N_STEPS = 10  # nemo-throughput's setting in the bench (its default)
SYNC_WARNING = "synchroniz"  # torch's "called a synchronizing CUDA operation"

# Two-sided 95 % quantiles of Student's t for 1..30 degrees of freedom (beyond: the normal's 1.96 and
# the usual steps in between)
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t_quantile_975(degrees_of_freedom: int) -> float:
    """Student's t 97.5 % quantile (the half-width factor of a two-sided 95 % interval)."""
    if degrees_of_freedom < 1:
        raise ValueError(f"degrees of freedom must be at least 1, got {degrees_of_freedom}")
    if degrees_of_freedom <= len(_T975):
        return _T975[degrees_of_freedom - 1]
    return 2.021 if degrees_of_freedom <= 40 else 2.000 if degrees_of_freedom <= 60 else (
        1.980 if degrees_of_freedom <= 120 else 1.960)


def paired_overhead_pct(step_times_s: list[float], baseline_s: list[float]) -> dict[str, Any] | None:
    """Overhead of a condition against the baseline, round by round (rounds interleave the conditions,
    so round i of both ran under the same machine state): 100 * (t_i / b_i - 1) per round, their mean,
    and a two-sided 95 % Student-t confidence interval of the mean (None with fewer than 2 rounds)."""
    if len(step_times_s) != len(baseline_s):
        raise ValueError(f"{len(step_times_s)} rounds against {len(baseline_s)} baseline rounds: they must pair up")
    if not step_times_s:
        return None
    per_round = [100 * (t / b - 1) for t, b in zip(step_times_s, baseline_s, strict=True)]
    mean = statistics.fmean(per_round)
    if len(per_round) < 2:
        return {"per_round": per_round, "mean": mean, "ci95": None}
    half = t_quantile_975(len(per_round) - 1) * statistics.stdev(per_round) / math.sqrt(len(per_round))
    return {"per_round": per_round, "mean": mean, "ci95": [mean - half, mean + half]}


class SyncCounter:
    """Counts host-device synchronizations while active (a context manager, CUDA only).

    Two kinds: the implicit ones that ``torch.cuda.set_sync_debug_mode`` reports (``.item()``, copies
    to the host, ``nonzero``...), as warnings; and explicit calls of ``torch.cuda.synchronize``,
    ``torch.cuda.Stream.synchronize`` and ``torch.cuda.Event.synchronize``, which that mode does not
    all report, counted by wrapping them (each counted once: the debug mode is off inside them).
    With ``mode="error"`` the first synchronization of either kind raises instead. Counters nest:
    an inner one's synchronizations count in the outer ones too. Not thread-safe (nor is the debug
    mode: it is process-wide); operations in torch.distributed are not covered by the debug mode.
    """

    _active: list[SyncCounter] = []
    _originals: dict[tuple[Any, str], Any] = {}

    def __init__(self, mode: str = "warn") -> None:
        if mode not in ("warn", "error"):
            raise ValueError(f"SyncCounter mode must be 'warn' or 'error', got {mode!r}")
        self.mode = mode
        self.implicit = 0
        self.explicit = 0
        self._previous_mode: int | None = None
        self._catcher: Any = None
        self._caught: list[warnings.WarningMessage] = []

    @property
    def count(self) -> int:
        return self.implicit + self.explicit

    def __enter__(self) -> SyncCounter:
        import torch

        if not SyncCounter._active:
            self._patch()
        self._previous_mode = torch.cuda.get_sync_debug_mode()
        self._catcher = warnings.catch_warnings(record=True)
        self._caught = self._catcher.__enter__()
        warnings.simplefilter("always")
        SyncCounter._active.append(self)
        torch.cuda.set_sync_debug_mode(self.mode)
        return self

    def __exit__(self, *exc: Any) -> None:
        import torch

        torch.cuda.set_sync_debug_mode(self._previous_mode)
        SyncCounter._active.remove(self)
        implicit = sum(SYNC_WARNING in str(w.message) for w in self._caught)
        self._catcher.__exit__(*exc)
        self.implicit += implicit
        for outer in SyncCounter._active:  # their warning catchers did not see these
            outer.implicit += implicit
        if not SyncCounter._active:
            self._unpatch()

    @classmethod
    def _patch(cls) -> None:
        import torch

        targets = {"torch.cuda.synchronize": torch.cuda, "torch.cuda.Stream.synchronize": torch.cuda.Stream,
                   "torch.cuda.Event.synchronize": torch.cuda.Event}
        for label, owner in targets.items():
            original = owner.synchronize
            cls._originals[(owner, "synchronize")] = original
            owner.synchronize = cls._counted(original, label)

    @classmethod
    def _unpatch(cls) -> None:
        for (owner, name), original in cls._originals.items():
            setattr(owner, name, original)
        cls._originals.clear()

    @classmethod
    def _counted(cls, original: Any, label: str) -> Any:
        import torch

        def counted(*args: Any, **kwargs: Any) -> Any:
            active = cls._active
            if not active:
                return original(*args, **kwargs)
            if active[-1].mode == "error":
                raise RuntimeError(f"called a synchronizing CUDA operation ({label}) where none is allowed")
            for counter in active:
                counter.explicit += 1
            torch.cuda.set_sync_debug_mode(0)  # counted here: the debug mode must not count it again
            try:
                return original(*args, **kwargs)
            finally:
                torch.cuda.set_sync_debug_mode(active[-1].mode)

        return counted


@dataclass
class Condition:
    name: str
    step_times_s: list[float] = field(default_factory=list)  # true step time, one per round
    measured_s: list[float] = field(default_factory=list)  # the tool's own step time, one per round
    hook_us_non_log: list[float] = field(default_factory=list)
    hook_us_log: list[float] = field(default_factory=list)
    hook_us_mean: list[float] = field(default_factory=list)  # all steps of the window, log steps included
    syncs_non_log: list[int] = field(default_factory=list)  # in the tool's hooks, the worst non-log step
    hook_syncs_log: list[float] = field(default_factory=list)  # in the tool's hooks, mean over log steps
    hook_syncs_mean: list[float] = field(default_factory=list)  # in the tool's hooks, mean over the window
    step_syncs_mean: list[float] = field(default_factory=list)  # in the whole step, mean over the window
    skipped: str | None = None

    def result(self, baseline: Condition | None) -> dict[str, Any]:
        median = statistics.median(self.step_times_s) if self.step_times_s else None  # the true step time
        baseline_s = statistics.median(baseline.step_times_s) if baseline and baseline.step_times_s else None
        paired = (paired_overhead_pct(self.step_times_s, baseline.step_times_s)
                  if baseline and self.step_times_s and len(self.step_times_s) == len(baseline.step_times_s) else None)
        measured = statistics.median(self.measured_s) if self.measured_s else None
        hook_us = statistics.median(self.hook_us_mean) if self.hook_us_mean else None
        return {
            "name": self.name,
            "skipped": self.skipped,
            "median_step_time_s": median,
            "step_times_s": self.step_times_s,
            "spread_pct": 100 * (max(self.step_times_s) - min(self.step_times_s)) / median if median else None,
            "overhead_pct": 100 * (median / baseline_s - 1) if median and baseline_s else None,
            "overhead_mean_pct": paired["mean"] if paired else None,
            "overhead_ci95_pct": paired["ci95"] if paired else None,
            "measured_step_time_s": measured,
            "error_pct": 100 * (measured / median - 1) if measured and median else None,
            "hook_us_per_step": hook_us,
            "hook_share_pct": 100 * hook_us * 1e-6 / median if hook_us is not None and median else None,
            "hook_us_per_non_log_step": statistics.median(self.hook_us_non_log) if self.hook_us_non_log else None,
            "hook_us_per_log_step": statistics.median(self.hook_us_log) if self.hook_us_log else None,
            "device_syncs_per_non_log_step": (max(self.syncs_non_log) if self.syncs_non_log else None),
            "hook_syncs_per_log_step": statistics.fmean(self.hook_syncs_log) if self.hook_syncs_log else None,
            "hook_syncs_per_step": statistics.fmean(self.hook_syncs_mean) if self.hook_syncs_mean else None,
            "syncs_per_step": statistics.fmean(self.step_syncs_mean) if self.step_syncs_mean else None,
        }


class WindowClock:
    """Harness: synchronized wall clock at the end of the window's first and last step."""

    def __init__(self, first: int, last: int, cuda: bool) -> None:
        self.first, self.last, self.cuda = first, last, cuda
        self.times: dict[int, float] = {}

    def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
        step = trainer.global_step
        if step in (self.first, self.last) and step not in self.times:
            if self.cuda:
                import torch

                torch.cuda.synchronize()
            self.times[step] = time.perf_counter()

    @property
    def step_time_s(self) -> float:
        return (self.times[self.last] - self.times[self.first]) / (self.last - self.first)


class StepSyncs:
    """Harness (counting round): synchronizations in each whole step, from the first callback's
    on_train_batch_start to the last callback's on_train_batch_end (``opener`` and ``closer``)."""

    def __init__(self) -> None:
        self.by_step: dict[int, int] = {}
        self._counter: SyncCounter | None = None

    def open(self, trainer: Any, *args: Any) -> None:
        self._counter = SyncCounter("warn").__enter__()

    def close(self, trainer: Any, *args: Any) -> None:
        if self._counter is not None:
            self._counter.__exit__(None, None, None)
            self.by_step[trainer.global_step] = self._counter.count
            self._counter = None

    def callbacks(self, base: type) -> tuple[Any, Any]:
        opener = type("StepSyncsOpen", (base,), {"on_train_batch_start": lambda _, *a: self.open(*a)})()
        closer = type("StepSyncsClose", (base,), {"on_train_batch_end": lambda _, *a: self.close(*a)})()
        return opener, closer


class TimedHooks:
    """Wraps a callback's per-step hooks (those its class defines): host time per step and, when
    ``count_syncs``, the synchronizations they cause (:class:`SyncCounter`)."""

    HOOKS = ("on_train_batch_start", "on_before_backward", "on_before_optimizer_step", "on_train_batch_end")

    def __init__(self, callback: Any, base: type, count_syncs: bool) -> None:
        self.callback, self.count_syncs = callback, count_syncs
        self.ns_by_step: dict[int, int] = {}
        self.syncs_by_step: dict[int, int] = {}
        for name in self.HOOKS:
            if getattr(type(callback), name) is not getattr(base, name):
                setattr(callback, name, self._timed(getattr(callback, name)))

    def _timed(self, hook: Any) -> Any:
        ends_step = hook.__name__ == "on_train_batch_end"  # runs after the optimizer step's increment

        def timed(trainer: Any, *args: Any, **kwargs: Any) -> None:
            step = trainer.global_step + (0 if ends_step else 1)  # the step this call belongs to
            syncs = 0
            if self.count_syncs:
                with SyncCounter("warn") as counter:
                    elapsed = _elapsed_ns(hook, trainer, *args, **kwargs)
                syncs = counter.count
            else:
                elapsed = _elapsed_ns(hook, trainer, *args, **kwargs)
            self.ns_by_step[step] = self.ns_by_step.get(step, 0) + elapsed
            self.syncs_by_step[step] = self.syncs_by_step.get(step, 0) + syncs

        timed.__name__ = hook.__name__
        return timed


def _elapsed_ns(hook: Any, *args: Any, **kwargs: Any) -> int:
    start = time.perf_counter_ns()
    hook(*args, **kwargs)
    return time.perf_counter_ns() - start


def resolve_device(device: str) -> str:
    """"auto" -> "cuda" when torch sees a GPU, else "cpu"; "cuda" without one is an error that says why."""
    if device not in DEVICES:
        raise ValueError(f"unknown device {device!r}; choose one of {list(DEVICES)}")
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device cuda, but torch {torch.__version__} sees no CUDA GPU "
                         f"(built for CUDA {torch.version.cuda}); run it where one is, or use --device cpu")
    return device


def default_window(steps: int) -> Window:
    """The last three quarters of a trial's steps (from step 2 at least: step 1 cannot be timed)."""
    return Window.parse(f"{max(2, steps // 4 + 1)}:")


def clock_steps(window: Window, steps: int) -> tuple[int, int]:
    """(first, last): the steps at whose end :class:`WindowClock` reads the clock, the step before
    the window's first and the window's last, so that it times the window's steps.

    Refused: a window that names steps past the trial's (`--steps`), and one that starts at step
    1, which no clock reading precedes."""
    timed = window.among(steps)
    if window.reaches_past(steps):
        raise ValueError(f"--window {window.text} reaches past the {steps} steps of a trial (--steps {steps})")
    if not timed:
        raise ValueError(f"--window {window.text} selects none of the {steps} steps of a trial")
    if timed.start < 2:
        raise ValueError(f"--window {window.text} starts at step 1, which cannot be timed: the clock starts at the "
                         "end of the step before the window; start at step 2 or later, e.g. 2:")
    return timed.start - 1, timed.stop - 1


def run_bench(size: str | None = None, steps: int = 60, window: Window | None = None, rounds: int = 3,
              conditions: tuple[str, ...] = CONDITIONS, namespace: str | None = None, progress: Any = print,
              device: str = "auto", micro_batch_size: int | None = None, count_syncs: bool = True) -> dict[str, Any]:
    import torch

    from nemo_throughput.adapters.nemo import padded_vocab_size

    cuda = resolve_device(device) == "cuda"
    size = size or ("gpt3-126m" if cuda else "cpu")
    namespace = namespace or _default_namespace()
    window = window or default_window(steps)
    first, last = clock_steps(window, steps)
    cfg = _model_cfg(size, micro_batch_size)
    spec = ModelSpec(num_layers=cfg.num_layers, hidden_size=cfg.hidden_size,
                     num_attention_heads=cfg.num_attention_heads, ffn_hidden_size=cfg.ffn_hidden_size,
                     seq_length=cfg.encoder_seq_length,
                     vocab_size=padded_vocab_size(cfg.tokenizer.vocab_size, cfg.make_vocab_size_divisible_by))
    results = {name: Condition(name) for name in conditions}
    for name, condition in results.items():
        condition.skipped = _unavailable(name, namespace)
    runnable = [name for name in conditions if not results[name].skipped]
    trial = dict(cfg=cfg, spec=spec, steps=steps, first=first, last=last, namespace=namespace, cuda=cuda)

    progress("warm-up trial (untimed): no-callback")
    _trial("no-callback", **trial)  # first-use costs: kernels, allocator, imports
    for round_index in range(rounds):
        # interleaved, and rotated each round so that no condition always runs first
        shift = round_index % len(runnable)
        for name in runnable[shift:] + runnable[:shift]:
            progress(f"round {round_index + 1}/{rounds}: {name}")
            _trial(name, record=results[name], **trial)
    if cuda and count_syncs:  # apart from the timed rounds: counting costs host time
        for name in runnable:
            progress(f"synchronization count: {name}")
            _trial(name, record=results[name], count_syncs=True, **trial)
    baseline = results.get("no-callback")
    return {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name() if cuda else f"cpu ({platform.processor() or platform.machine()}, "
                                                              f"{torch.get_num_threads()} threads)",
        "device_info": _cuda_device_info() if cuda else None,
        "precision": "bf16-mixed" if cuda else "32-true",
        "model": size, "model_spec": spec.to_dict(), "micro_batch_size": cfg.micro_batch_size,
        "steps": steps, "window": window.text, "window_steps": [first + 1, last],  # the first and last step timed
        "rounds": rounds, "lightning": namespace,
        "log_every_n_steps": LOG_EVERY_N_STEPS,
        "sync_counting": ("one extra untimed trial per condition: torch.cuda.set_sync_debug_mode('warn') warnings "
                          "plus explicit torch.cuda.synchronize / Stream.synchronize / Event.synchronize calls, "
                          "on the training thread (autograd's backward thread is not seen)"
                          if cuda and count_syncs else None),
        "versions": {"torch": torch.__version__, namespace: importlib.import_module(namespace).__version__},
        "conditions": [results[name].result(baseline) for name in conditions],
        "ratios": _ratios(results),
    }


def _trial(name: str, cfg: Any, spec: ModelSpec, steps: int, first: int, last: int, namespace: str, cuda: bool,
           record: Condition | None = None, count_syncs: bool = False) -> None:
    import torch

    from nemo_throughput.adapters.lightning import ThroughputCallback
    from nemo_throughput.demo.gpt import gpt_module_class

    pl = importlib.import_module(namespace)
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()  # the previous trial's blocks: a large model needs the whole GPU
    torch.manual_seed(0)
    with torch.device("cuda") if cuda else contextlib.nullcontext():  # a GPU initializes billions of weights fast
        model = gpt_module_class(namespace)(cfg)
    # A counting trial times nothing: its clock must not add the synchronizations it counts.
    clock = type("WindowClock", (WindowClock, pl.Callback), {})(first, last, cuda and not count_syncs)
    measured = MeasuredValues()
    collector = _collector(pl, measured)
    callbacks, timed, ours = [clock], None, None
    with tempfile.TemporaryDirectory() as out:
        tool = None
        if name.startswith("nemo-throughput"):
            debug = name.endswith("debug")
            ours = tool = ThroughputCallback(warmup_steps=first, output_dir=out,
                                             log_every_n_steps=1 if debug else LOG_EVERY_N_STEPS,
                                             per_step_jsonl=debug, peak_tflops=None)
        elif name == "lightning-throughput-monitor":
            model.flops_per_batch = cfg.micro_batch_size * model_flops_per_sample(spec)  # the same model's FLOPs
            tool = pl.callbacks.ThroughputMonitor(batch_size_fn=lambda batch: batch.shape[0],
                                                  length_fn=lambda batch: batch.shape[1] - 1,
                                                  window_size=last - first + 1)
        elif name == "nemo-timing-callback":
            from nemo.utils.exp_manager import TimingCallback

            tool = TimingCallback()
        if tool is not None:
            timed = TimedHooks(tool, pl.Callback, count_syncs)
            callbacks.append(tool)
        step_syncs = StepSyncs() if count_syncs else None
        if step_syncs is not None:
            opener, closer = step_syncs.callbacks(pl.Callback)
            callbacks = [opener, *callbacks, closer]
        trainer = pl.Trainer(max_steps=steps, accelerator="gpu" if cuda else "cpu", devices=1,
                             precision="bf16-mixed" if cuda else "32-true", callbacks=callbacks, logger=collector,
                             log_every_n_steps=1, enable_checkpointing=False, enable_progress_bar=False,
                             enable_model_summary=False, default_root_dir=out)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(model)
    if record is None:
        return
    window_steps = range(first + 1, last + 1)
    if count_syncs:
        _record_syncs(record, timed, step_syncs, window_steps, ours)
        return
    record.step_times_s.append(clock.step_time_s)
    if timed is not None:
        log_every = ours.config.log_every_n_steps if ours is not None else None
        per_step_us = [timed.ns_by_step.get(s, 0) / 1e3 for s in window_steps]
        record.hook_us_mean.append(statistics.fmean(per_step_us))
        if log_every is not None:
            non_log = [us for s, us in zip(window_steps, per_step_us, strict=True) if s % log_every]
            log = [us for s, us in zip(window_steps, per_step_us, strict=True) if not s % log_every]
            if non_log:
                record.hook_us_non_log.append(statistics.median(non_log))
            if log:
                record.hook_us_log.append(statistics.median(log))
    if ours is not None:
        record.measured_s.append(ours.stats.mean_step_time_s())
    elif name == "lightning-throughput-monitor":
        # its separator is "/" or "|" depending on the Lightning version
        (key,) = [k for k in measured.values if k.startswith("train") and k.endswith("device/batches_per_sec".replace(
            "/", k[5]))]
        record.measured_s.append(1 / measured.last(key))
    elif name == "nemo-timing-callback":
        record.measured_s.append(statistics.fmean(measured.at("train_step_timing in s", window_steps)))


def _ratios(results: dict[str, Condition]) -> dict[str, float | None]:
    """Side by side in this run: our host time per step against ThroughputMonitor's, and our log
    step's against our ordinary step's (None where a condition did not run)."""
    def median(name: str, attribute: str) -> float | None:
        values = getattr(results[name], attribute) if name in results else []
        return statistics.median(values) if values else None

    ours, monitor = median("nemo-throughput", "hook_us_mean"), median("lightning-throughput-monitor", "hook_us_mean")
    log_step, non_log = median("nemo-throughput", "hook_us_log"), median("nemo-throughput", "hook_us_non_log")
    return {"hooks_per_step_vs_throughput_monitor": ours / monitor if ours is not None and monitor else None,
            "log_step_vs_non_log_step": log_step / non_log if log_step is not None and non_log else None}


def _record_syncs(record: Condition, timed: TimedHooks | None, step_syncs: StepSyncs, window_steps: range,
                  ours: Any) -> None:
    record.step_syncs_mean.append(statistics.fmean(step_syncs.by_step.get(s, 0) for s in window_steps))
    if timed is None:
        return
    in_hooks = [timed.syncs_by_step.get(s, 0) for s in window_steps]
    record.hook_syncs_mean.append(statistics.fmean(in_hooks))
    if ours is not None:
        log_every = ours.config.log_every_n_steps
        non_log = [n for s, n in zip(window_steps, in_hooks, strict=True) if s % log_every]
        log = [n for s, n in zip(window_steps, in_hooks, strict=True) if not s % log_every]
        if non_log:
            record.syncs_non_log.append(max(non_log))
        if log:
            record.hook_syncs_log.append(statistics.fmean(log))


def _cuda_device_info() -> dict[str, Any]:
    import torch

    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return {"name": torch.cuda.get_device_name(), "driver": _nvidia_driver_version(), "cuda": torch.version.cuda,
            "capability": f"{props.major}.{props.minor}", "memory_gib": round(props.total_memory / 2**30, 1),
            "multiprocessors": props.multi_processor_count}


def _nvidia_driver_version() -> str | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else version
    except Exception:  # noqa: BLE001 - no NVML here: the driver is then simply not recorded
        return None


class MeasuredValues:
    """Metrics the tools logged, by name and step (steps from 1, as the callback counts them)."""

    def __init__(self) -> None:
        self.values: dict[str, dict[int, float]] = {}

    def add(self, metrics: dict[str, float], step: int) -> None:
        for key, value in metrics.items():
            self.values.setdefault(key, {})[step + 1] = float(value)

    def last(self, key: str) -> float:
        series = self.values[key]
        return series[max(series)]

    def at(self, key: str, steps: range) -> list[float]:
        return [self.values[key][s] for s in steps]


def _collector(pl: Any, measured: MeasuredValues) -> Any:
    class Collector(pl.loggers.logger.Logger):
        name, version = "bench", 0

        def log_hyperparams(self, *args: Any, **kwargs: Any) -> None:
            pass

        def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
            measured.add(metrics, step or 0)

    return Collector()


def parse_conditions(text: str) -> tuple[str, ...]:
    """``--conditions a,b``: known names, each once, refused before any training (a typo would
    otherwise run every other condition and report the misspelt one as skipped)."""
    names = tuple(name.strip() for name in text.split(","))
    unknown = [name for name in names if name not in CONDITIONS]
    if unknown:
        raise ValueError(f"unknown condition(s) {unknown} in --conditions; choose from {', '.join(CONDITIONS)}")
    if len(set(names)) != len(names):
        raise ValueError(f"--conditions names a condition twice: {text!r}")
    return names


def _unavailable(name: str, namespace: str) -> str | None:
    if name not in CONDITIONS:
        return f"unknown condition; choose from {list(CONDITIONS)}"
    if name == "nemo-timing-callback":
        if importlib.util.find_spec("nemo") is None:
            return "NeMo is not installed"
        try:
            importlib.import_module("nemo.utils.exp_manager")
        except Exception as error:  # noqa: BLE001 - NeMo with versions it does not support: say so, go on
            return f"NeMo's TimingCallback does not import here ({type(error).__name__}: {error})"
        if namespace != "lightning.pytorch":
            return "NeMo's callbacks need the lightning.pytorch namespace"
    return None


def _default_namespace() -> str:
    try:
        importlib.import_module("lightning.pytorch")
        return "lightning.pytorch"
    except ImportError:
        return "pytorch_lightning"


def _model_cfg(size: str, micro_batch_size: int | None = None) -> Any:
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; choose one of {list(SIZES)}")
    if micro_batch_size is not None and micro_batch_size < 1:
        raise ValueError(f"the micro-batch size must be at least 1, got {micro_batch_size}")
    shape = dict(SIZES[size])
    if micro_batch_size is not None:
        shape["micro_batch_size"] = micro_batch_size
    vocab = shape.pop("vocab_size")
    from omegaconf import OmegaConf

    return OmegaConf.create({
        **shape, "global_batch_size": shape["micro_batch_size"], "tensor_model_parallel_size": 1,
        "pipeline_model_parallel_size": 1, "num_query_groups": None, "activation": "gelu",
        "make_vocab_size_divisible_by": 128, "tokenizer": {"vocab_size": vocab}, "optim": {"lr": 1e-4}, "seed": 1,
    })


def render(result: dict[str, Any], fmt: str = "table") -> str:
    """The result as text ending in a new line: a table with its legend, or JSON."""
    if fmt == "json":
        return json.dumps(result, indent=2) + "\n"
    header = ("condition", "step (median)", "spread", "overhead", "95% CI (paired)", "measured", "error",
              "hooks/step", "share", "non-log", "log step", "syncs/step", "in hooks")
    rows = []
    for c in result["conditions"]:
        if c["skipped"]:
            rows.append((c["name"], f"skipped: {c['skipped']}"))
            continue
        ci = c["overhead_ci95_pct"]
        rows.append((c["name"], _ms(c["median_step_time_s"]), _pct(c["spread_pct"], sign=False),
                     _pct(c["overhead_pct"]), f"{ci[0]:+.2f} .. {ci[1]:+.2f} %" if ci else "",
                     _ms(c["measured_step_time_s"]), _pct(c["error_pct"]),
                     _us(c["hook_us_per_step"]), _pct(c["hook_share_pct"], sign=False, digits=3),
                     _us(c["hook_us_per_non_log_step"]), _us(c["hook_us_per_log_step"]),
                     _count(c["syncs_per_step"]), _count(c["hook_syncs_per_step"])))
    full = [r for r in (header, *rows) if len(r) == len(header)]
    widths = [max(len(r[i]) for r in full) for i in range(len(header))]
    widths[0] = max(len(r[0]) for r in (header, *rows))
    info = result.get("device_info") or {}
    device = result["device"] + (f", driver {info['driver']}" if info.get("driver") else "") + (
        f", CUDA {info['cuda']}" if info.get("cuda") else "")
    lines = [
        f"nemo-throughput bench, {result['date']}: {device}, torch {result['versions']['torch']}, model "
        f"{result['model']} ({result['precision']}, micro-batch {result['micro_batch_size']}), "
        f"{result['steps']} steps, window {result['window']} (steps {result['window_steps'][0]}-"
        f"{result['window_steps'][1]} timed), {result['rounds']} rounds, "
        f"{result['lightning']}",
        "",
        *("  ".join(cell.ljust(widths[0]) if i == 0 else cell.rjust(widths[i]) for i, cell in enumerate(row))
          if len(row) == len(header) else f"{row[0].ljust(widths[0])}  {row[1]}" for row in (header, *rows)),
        "",
        "step: true step time (synchronized wall clock over the window / steps), median over rounds, and its",
        "spread (max - min over rounds); overhead: median against no-callback's, and the 95 % confidence interval",
        "of the mean per-round overhead (rounds pair up: each runs every condition once); measured: the step time",
        "the tool itself reported for the window; error: measured vs true; hooks/step: host time in the tool's",
        "hooks per step (log steps included) and its share of the step; non-log / log step: nemo-throughput's, on",
        "each kind of step; syncs/step: host-device synchronizations in a whole step, and in the tool's own hooks",
        "(CUDA only: one extra untimed trial per condition).",
    ]
    ratios = result.get("ratios") or {}
    if ratios.get("hooks_per_step_vs_throughput_monitor") is not None:
        lines += ["", f"ratios in this run: nemo-throughput's hooks/step = "
                      f"{ratios['hooks_per_step_vs_throughput_monitor']:.2f} x ThroughputMonitor's"
                      + (f"; its log step = {ratios['log_step_vs_non_log_step']:.0f} x its non-log step"
                         if ratios.get("log_step_vs_non_log_step") is not None else "")]
    return "\n".join(lines) + "\n"


def _ms(seconds: float | None) -> str:
    return "" if seconds is None else f"{1e3 * seconds:.2f} ms"


def _pct(value: float | None, sign: bool = True, digits: int = 2) -> str:
    return "" if value is None else f"{value:{'+' if sign else ''}.{digits}f} %"


def _us(value: float | None) -> str:
    return "" if value is None else f"{value:.0f} µs"


def _count(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}"


# ------------------------------------------------------------------------------------ the command
def add_parsers(commands: argparse._SubParsersAction) -> None:
    bench = commands.add_parser(
        "bench", help="overhead and accuracy of the callback beside ThroughputMonitor and NeMo's TimingCallback",
        description="Trains the demo GPT under interleaved conditions and reports, per condition, the median true "
                    "step time, the overhead against no callback (with a 95 %% confidence interval), the error of "
                    "the step time the tool reports, its host time per step and, on CUDA, the host-device "
                    "synchronizations per step.")
    bench.add_argument("--device", choices=DEVICES, default="auto", help="auto: cuda when torch sees a GPU (auto)")
    bench.add_argument("--size", choices=tuple(SIZES),
                       help="model (default: gpt3-126m on CUDA, else cpu); gpt3-2.7b is the largest for one 80 GB GPU")
    bench.add_argument("--micro-batch-size", type=int, help="override the size's micro-batch")
    bench.add_argument("--steps", type=int, default=60, help="optimizer steps per trial (60)")
    bench.add_argument("--window", help="steps timed, as report and import take them: A:B (steps A to B-1), A:, -N: "
                                        "(the last N) or last; from step 2 on (default: the last three quarters)")
    bench.add_argument("--rounds", type=int, default=3, help="rounds of all conditions (3)")
    bench.add_argument("--conditions", help="comma-separated subset of the conditions")
    bench.add_argument("--no-sync-count", action="store_true", help="skip the CUDA synchronization-count trials")
    bench.add_argument("--format", choices=("table", "json"), default="table")
    bench.add_argument("--output", type=Path, help="write the table (or JSON) to this file instead of stdout, as "
                                                   "report does; its directory must exist")
    bench.add_argument("--ranks", help="instead of the trials: the host cost of a log step and of an ordinary step "
                                       "at these numbers of gloo ranks (CPU processes, e.g. 2,4,8), at 100, 1,000 "
                                       "and 10,000 steps done")
    bench.set_defaults(handler=run_command)


def run_command(args: argparse.Namespace) -> int:
    if args.ranks:
        return _run_log_step_command(args)
    try:
        window = Window.parse(args.window) if args.window else None
        conditions = parse_conditions(args.conditions) if args.conditions else CONDITIONS
        if args.steps < 2 or args.rounds < 1:
            raise ValueError("--steps must be at least 2 and --rounds at least 1")
        if args.output:
            check_output_file(args.output, "--output")
        result = run_bench(size=args.size, steps=args.steps, window=window, rounds=args.rounds,
                           conditions=conditions, device=args.device, micro_batch_size=args.micro_batch_size,
                           count_syncs=not args.no_sync_count,
                           progress=lambda line: print(line, file=sys.stderr, flush=True))
    except ValueError as error:
        print(f"nemo-throughput bench: {error}", file=sys.stderr)
        return 2
    return _write(render(result, args.format), args.output)


def _run_log_step_command(args: argparse.Namespace) -> int:
    """``--ranks``: the log-step bench (nemo_throughput.log_step_bench) instead of the trials."""
    from nemo_throughput.log_step_bench import parse_ranks, render_log_step, run_log_step_bench

    try:
        ranks = parse_ranks(args.ranks)
        if args.output:
            check_output_file(args.output, "--output")
    except ValueError as error:
        print(f"nemo-throughput bench: {error}", file=sys.stderr)
        return 2
    result = run_log_step_bench(ranks, progress=lambda line: print(line, file=sys.stderr, flush=True))
    return _write(json.dumps(result, indent=2) + "\n" if args.format == "json" else render_log_step(result),
                  args.output)


def _write(text: str, output: Path | None) -> int:
    try:
        write_output(text, output, "--output")
    except OutputPathError as error:
        print(f"nemo-throughput bench: {error}", file=sys.stderr)
        return 1
    if output is not None:
        print(f"bench: {output}", file=sys.stderr)
    return 0
