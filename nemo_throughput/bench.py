"""`nemo-throughput bench`: what the callback costs and how right it measures, beside the tools users
would otherwise use, in one run.

The demo GPT trains for a fixed number of steps under each condition, conditions interleaved
(A B C A B C ...) for several rounds. Every trial carries the same harness callback, which reads
a synchronized wall clock at the first and last step of the window: its elapsed time over the
step count is the true step time. Per condition: the median true step time over rounds, its
overhead against no callback, and the step time the condition's own tool reported over the
same steps, with its error against the true one. For nemo-throughput also: the time its hooks
take per step on the host, and (on CUDA) the device synchronizations they cause on steps that
are not log steps, counted with torch.cuda.set_sync_debug_mode.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import importlib
import json
import platform
import statistics
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
from omegaconf import OmegaConf

from nemo_throughput.adapters.nemo import padded_vocab_size
from nemo_throughput.flops import ModelSpec, model_flops_per_sample

SIZES = {
    # CPU-sized: about 0.1 s a step on two cores
    "cpu": dict(num_layers=2, hidden_size=128, ffn_hidden_size=512, num_attention_heads=4, encoder_seq_length=128,
                micro_batch_size=8, vocab_size=2048),
    # GPT-3 126M (12 layers, hidden 768, 12 heads, sequence 2048), for a GPU in bf16
    "gpt3-126m": dict(num_layers=12, hidden_size=768, ffn_hidden_size=3072, num_attention_heads=12,
                      encoder_seq_length=2048, micro_batch_size=8, vocab_size=50257),
}
CONDITIONS = ("no-callback", "nemo-throughput", "nemo-throughput-debug", "lightning-throughput-monitor",
              "nemo-timing-callback")


@dataclass
class Condition:
    name: str
    step_times_s: list[float] = field(default_factory=list)  # true step time, one per round
    measured_s: list[float] = field(default_factory=list)  # the tool's own step time, one per round
    hook_us_non_log: list[float] = field(default_factory=list)
    hook_us_log: list[float] = field(default_factory=list)
    hook_us_mean: list[float] = field(default_factory=list)  # all steps of the window, log steps included
    syncs_non_log: list[int] = field(default_factory=list)
    skipped: str | None = None

    def result(self, baseline_s: float | None) -> dict[str, Any]:
        median = statistics.median(self.step_times_s) if self.step_times_s else None  # the true step time
        measured = statistics.median(self.measured_s) if self.measured_s else None
        hook_us = statistics.median(self.hook_us_mean) if self.hook_us_mean else None
        return {
            "name": self.name,
            "skipped": self.skipped,
            "median_step_time_s": median,
            "step_times_s": self.step_times_s,
            "spread_pct": 100 * (max(self.step_times_s) - min(self.step_times_s)) / median if median else None,
            "overhead_pct": 100 * (median / baseline_s - 1) if median and baseline_s else None,
            "measured_step_time_s": measured,
            "error_pct": 100 * (measured / median - 1) if measured and median else None,
            "hook_us_per_step": hook_us,
            "hook_share_pct": 100 * hook_us * 1e-6 / median if hook_us is not None and median else None,
            "hook_us_per_non_log_step": statistics.median(self.hook_us_non_log) if self.hook_us_non_log else None,
            "hook_us_per_log_step": statistics.median(self.hook_us_log) if self.hook_us_log else None,
            "device_syncs_per_non_log_step": (max(self.syncs_non_log) if self.syncs_non_log else None),
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
                torch.cuda.synchronize()
            self.times[step] = time.perf_counter()

    @property
    def step_time_s(self) -> float:
        return (self.times[self.last] - self.times[self.first]) / (self.last - self.first)


class TimedHooks:
    """Wraps a ThroughputCallback's per-step hooks: host time per step, and CUDA syncs they cause."""

    HOOKS = ("on_train_batch_start", "on_before_backward", "on_before_optimizer_step", "on_train_batch_end")

    def __init__(self, callback: Any, cuda: bool) -> None:
        self.callback, self.cuda = callback, cuda
        self.ns_by_step: dict[int, int] = {}
        self.syncs_by_step: dict[int, int] = {}
        for name in self.HOOKS:
            setattr(callback, name, self._timed(getattr(callback, name)))

    def _timed(self, hook: Any) -> Any:
        ends_step = hook.__name__ == "on_train_batch_end"  # runs after the optimizer step's increment

        def timed(trainer: Any, *args: Any, **kwargs: Any) -> None:
            step = trainer.global_step + (0 if ends_step else 1)  # the step this call belongs to
            syncs = 0
            if self.cuda and step % self.callback.config.log_every_n_steps:  # non-log step: count syncs
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    torch.cuda.set_sync_debug_mode("warn")
                    elapsed = _elapsed_ns(hook, trainer, *args, **kwargs)
                    torch.cuda.set_sync_debug_mode(0)
                syncs = sum("synchroniz" in str(w.message) for w in caught)
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


def run_bench(size: str = "cpu", steps: int = 60, window: tuple[int, int] | None = None, rounds: int = 3,
              conditions: tuple[str, ...] = CONDITIONS, namespace: str | None = None,
              progress: Any = print) -> dict[str, Any]:
    cuda = torch.cuda.is_available()
    namespace = namespace or _default_namespace()
    first, last = window or (max(1, steps // 4), steps)
    if not 0 < first < last <= steps:
        raise ValueError(f"the window {first}:{last} must lie inside the {steps} steps, first < last")
    cfg = _model_cfg(size)
    spec = ModelSpec(num_layers=cfg.num_layers, hidden_size=cfg.hidden_size,
                     num_attention_heads=cfg.num_attention_heads, ffn_hidden_size=cfg.ffn_hidden_size,
                     seq_length=cfg.encoder_seq_length,
                     vocab_size=padded_vocab_size(cfg.tokenizer.vocab_size, cfg.make_vocab_size_divisible_by))
    results = {name: Condition(name) for name in conditions}
    for name, condition in results.items():
        condition.skipped = _unavailable(name, namespace)
    runnable = [name for name in conditions if not results[name].skipped]

    _trial("no-callback", cfg, spec, steps, first, last, namespace, cuda)  # untimed: first-use costs
    for round_index in range(rounds):
        # interleaved, and rotated each round so that no condition always runs first
        shift = round_index % len(runnable)
        for name in runnable[shift:] + runnable[:shift]:
            progress(f"round {round_index + 1}/{rounds}: {name}")
            gc.collect()
            _trial(name, cfg, spec, steps, first, last, namespace, cuda, results[name])
    baseline = results.get("no-callback")
    baseline_s = statistics.median(baseline.step_times_s) if baseline and baseline.step_times_s else None
    return {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name() if cuda else f"cpu ({platform.processor() or platform.machine()}, "
                                                              f"{torch.get_num_threads()} threads)",
        "precision": "bf16-mixed" if cuda else "32-true",
        "model": size, "model_spec": spec.to_dict(), "micro_batch_size": cfg.micro_batch_size,
        "steps": steps, "window": [first, last], "rounds": rounds, "lightning": namespace,
        "versions": {"torch": torch.__version__, namespace: importlib.import_module(namespace).__version__},
        "conditions": [results[name].result(baseline_s) for name in conditions],
    }


def _trial(name: str, cfg: Any, spec: ModelSpec, steps: int, first: int, last: int, namespace: str, cuda: bool,
           record: Condition | None = None) -> None:
    # Lightning is imported here, on use: the other subcommands need not pay for it.
    from nemo_throughput.adapters.lightning import ThroughputCallback
    from nemo_throughput.demo.gpt import gpt_module_class

    pl = importlib.import_module(namespace)
    torch.manual_seed(0)
    model = gpt_module_class(namespace)(cfg)
    clock = type("WindowClock", (WindowClock, pl.Callback), {})(first, last, cuda)
    measured = MeasuredValues()
    collector = _collector(pl, measured)
    callbacks, timed = [clock], None
    with tempfile.TemporaryDirectory() as out:
        if name.startswith("nemo-throughput"):
            debug = name.endswith("debug")
            ours = ThroughputCallback(warmup_steps=first, output_dir=out, log_every_n_steps=1 if debug else 10,
                                      per_step_jsonl=debug, peak_tflops=None)
            timed = TimedHooks(ours, cuda)
            callbacks.append(ours)
        elif name == "lightning-throughput-monitor":
            model.flops_per_batch = cfg.micro_batch_size * model_flops_per_sample(spec)  # the same model's FLOPs
            callbacks.append(pl.callbacks.ThroughputMonitor(batch_size_fn=lambda batch: batch.shape[0],
                                                            length_fn=lambda batch: batch.shape[1] - 1,
                                                            window_size=last - first + 1))
        elif name == "nemo-timing-callback":
            from nemo.utils.exp_manager import TimingCallback

            callbacks.append(TimingCallback())
        trainer = pl.Trainer(max_steps=steps, accelerator="gpu" if cuda else "cpu", devices=1,
                             precision="bf16-mixed" if cuda else "32-true", callbacks=callbacks, logger=collector,
                             log_every_n_steps=1, enable_checkpointing=False, enable_progress_bar=False,
                             enable_model_summary=False, default_root_dir=out)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(model)
    if record is None:
        return
    record.step_times_s.append(clock.step_time_s)
    steps_in_window = range(first + 1, last + 1)
    if timed is not None:
        ours = timed.callback
        record.measured_s.append(ours.stats.mean_step_time_s())
        log_every = ours.config.log_every_n_steps
        non_log = [timed.ns_by_step[s] / 1e3 for s in steps_in_window if s % log_every]
        log = [timed.ns_by_step[s] / 1e3 for s in steps_in_window if not s % log_every]
        if non_log:
            record.hook_us_non_log.append(statistics.median(non_log))
            if cuda:  # counted with torch.cuda.set_sync_debug_mode; a CPU has nothing to synchronize
                record.syncs_non_log.append(max(timed.syncs_by_step.get(s, 0) for s in steps_in_window
                                                if s % log_every))
        if log:
            record.hook_us_log.append(statistics.median(log))
        record.hook_us_mean.append(statistics.fmean(non_log + log))
    elif name == "lightning-throughput-monitor":
        # its separator is "/" or "|" depending on the Lightning version
        (key,) = [k for k in measured.values if k.startswith("train") and k.endswith("device/batches_per_sec".replace(
            "/", k[5]))]
        record.measured_s.append(1 / measured.last(key))
    elif name == "nemo-timing-callback":
        record.measured_s.append(statistics.fmean(measured.at("train_step_timing in s", steps_in_window)))


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


def _unavailable(name: str, namespace: str) -> str | None:
    if name not in CONDITIONS:
        return f"unknown condition; choose from {list(CONDITIONS)}"
    if name == "nemo-timing-callback":
        try:
            importlib.import_module("nemo.utils.exp_manager")
        except ImportError:
            return "NeMo is not installed"
        if namespace != "lightning.pytorch":
            return "NeMo's callbacks need the lightning.pytorch namespace"
    return None


def _default_namespace() -> str:
    try:
        importlib.import_module("lightning.pytorch")
        return "lightning.pytorch"
    except ImportError:
        return "pytorch_lightning"


def _model_cfg(size: str) -> Any:
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; choose one of {list(SIZES)}")
    shape = dict(SIZES[size])
    vocab = shape.pop("vocab_size")
    return OmegaConf.create({
        **shape, "global_batch_size": shape["micro_batch_size"], "tensor_model_parallel_size": 1,
        "pipeline_model_parallel_size": 1, "num_query_groups": None, "activation": "gelu",
        "make_vocab_size_divisible_by": 128, "tokenizer": {"vocab_size": vocab}, "optim": {"lr": 1e-4}, "seed": 1,
    })


def render(result: dict[str, Any], fmt: str = "table") -> str:
    if fmt == "json":
        return json.dumps(result, indent=2)
    header = ("condition", "step (median)", "spread", "overhead", "measured", "error", "hooks/step", "share",
              "non-log", "log step", "syncs")
    rows = []
    for c in result["conditions"]:
        if c["skipped"]:
            rows.append((c["name"], f"skipped: {c['skipped']}"))
            continue
        syncs = c["device_syncs_per_non_log_step"]
        rows.append((c["name"], _ms(c["median_step_time_s"]), _pct(c["spread_pct"], sign=False),
                     _pct(c["overhead_pct"]), _ms(c["measured_step_time_s"]), _pct(c["error_pct"]),
                     _us(c["hook_us_per_step"]), _pct(c["hook_share_pct"], sign=False, digits=3),
                     _us(c["hook_us_per_non_log_step"]), _us(c["hook_us_per_log_step"]),
                     "" if syncs is None else str(syncs)))
    full = [r for r in (header, *rows) if len(r) == len(header)]
    widths = [max(len(r[i]) for r in full) for i in range(len(header))]
    widths[0] = max(len(r[0]) for r in (header, *rows))
    lines = [
        f"nemo-throughput bench, {result['date']}: {result['device']}, model {result['model']} "
        f"({result['precision']}, micro-batch {result['micro_batch_size']}), {result['steps']} steps, window "
        f"{result['window'][0]}-{result['window'][1]}, {result['rounds']} rounds, {result['lightning']}",
        "",
        *("  ".join(cell.ljust(widths[0]) if i == 0 else cell.rjust(widths[i]) for i, cell in enumerate(row))
          if len(row) == len(header) else f"{row[0].ljust(widths[0])}  {row[1]}" for row in (header, *rows)),
        "",
        "step: true step time (synchronized wall clock over the window / steps), median over rounds, and its",
        "spread (max - min over rounds); overhead: against no-callback; measured: the step time the tool itself",
        "reported for the window; error: measured vs true; hooks/step: host time in nemo-throughput's hooks per",
        "step (log steps included) and its share of the step; non-log / log step: on each kind of step; syncs:",
        "device synchronizations caused on non-log steps (CUDA only).",
    ]
    return "\n".join(lines) + "\n"


def _ms(seconds: float | None) -> str:
    return "" if seconds is None else f"{1e3 * seconds:.2f} ms"


def _pct(value: float | None, sign: bool = True, digits: int = 2) -> str:
    return "" if value is None else f"{value:{'+' if sign else ''}.{digits}f} %"


def _us(value: float | None) -> str:
    return "" if value is None else f"{value:.0f} µs"


# ------------------------------------------------------------------------------------ the command
def add_parsers(commands: argparse._SubParsersAction) -> None:
    bench = commands.add_parser(
        "bench", help="overhead and accuracy of the callback beside ThroughputMonitor and NeMo's TimingCallback",
        description="Trains the demo GPT under interleaved conditions and reports, per condition, the median true "
                    "step time, the overhead against no callback and the error of the step time the tool reports.")
    bench.add_argument("--size", choices=("cpu", "gpt3-126m"), help="model (default: gpt3-126m on CUDA, else cpu)")
    bench.add_argument("--steps", type=int, default=60, help="optimizer steps per trial (60)")
    bench.add_argument("--window", help="steps timed, A:B (default: the last three quarters)")
    bench.add_argument("--rounds", type=int, default=3, help="rounds of all conditions (3)")
    bench.add_argument("--conditions", help="comma-separated subset of the conditions")
    bench.add_argument("--format", choices=("table", "json"), default="table")
    bench.set_defaults(handler=run_command)


def run_command(args: argparse.Namespace) -> int:
    try:
        window = tuple(int(part) for part in args.window.split(":")) if args.window else None
        if window is not None and len(window) != 2:
            raise ValueError(f"--window {args.window!r} must be A:B")
        conditions = tuple(args.conditions.split(",")) if args.conditions else CONDITIONS
        if args.steps < 2 or args.rounds < 1:
            raise ValueError("--steps must be at least 2 and --rounds at least 1")
        result = run_bench(size=args.size or ("gpt3-126m" if torch.cuda.is_available() else "cpu"),
                           steps=args.steps, window=window, rounds=args.rounds, conditions=conditions,
                           progress=lambda line: print(line, file=sys.stderr, flush=True))
    except ValueError as error:
        print(f"nemo-throughput bench: {error}", file=sys.stderr)
        return 2
    print(render(result, args.format), end="")
    return 0
