"""The trials: the demo GPT trained for a fixed number of steps under each condition, conditions
interleaved and rotated over rounds, and what each trial measured recorded per condition."""

from __future__ import annotations

import contextlib
import datetime as dt
import gc
import importlib
import importlib.util
import platform
import statistics
import tempfile
import warnings
from typing import Any

from nemo_throughput.bench.harness import (
    EmptyHooks,
    MeasuredValues,
    StepSyncs,
    StepTimerOnly,
    TimedHooks,
    WindowClock,
    collector,
)
from nemo_throughput.bench.stats import Condition, ratios
from nemo_throughput.flops import ModelSpec, model_flops_per_sample
from nemo_throughput.megatron_config import padded_vocab_size
from nemo_throughput.window import Window

# torch, Lightning and OmegaConf are imported in the functions that use them: `nemo-throughput --help`
# and the other subcommands register the bench's options without loading them.

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
CONDITIONS = ("no-callback", "empty-callback", "nemo-throughput", "nemo-throughput-debug", "nemo-throughput-prometheus",
              "nemo-throughput-slow-nvml", "nemo-throughput-idle-gpu", "step-timer-only", "lightning-throughput-monitor",
              "nemo-timing-callback")
# run only when named (--conditions)
DIAGNOSTICS = ("nemo-throughput-slow-nvml", "nemo-throughput-idle-gpu", "step-timer-only")
DEFAULT_CONDITIONS = tuple(name for name in CONDITIONS if name not in DIAGNOSTICS)
DEVICES = ("auto", "cpu", "cuda")
LOG_EVERY_N_STEPS = 10  # nemo-throughput's setting in the bench (its default)


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
              conditions: tuple[str, ...] = DEFAULT_CONDITIONS, namespace: str | None = None, progress: Any = print,
              device: str = "auto", micro_batch_size: int | None = None, count_syncs: bool = True) -> dict[str, Any]:
    """Every runnable condition once per round for `rounds` rounds of `steps` optimizer steps, after one
    untimed warm-up trial; the result as JSON-ready values (step times in s, overheads in %, host time in
    the tools' hooks in µs per step; see :meth:`Condition.result`). Raises ValueError before any trial
    for arguments it cannot run."""
    import torch

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
        condition.skipped = _unavailable(name, namespace, cuda)
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
        "ratios": ratios(results),
    }


def _trial(name: str, cfg: Any, spec: ModelSpec, steps: int, first: int, last: int, namespace: str, cuda: bool,
           record: Condition | None = None, count_syncs: bool = False) -> None:
    import torch

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
    callbacks, timed = [clock], None
    with tempfile.TemporaryDirectory() as out:
        tool = _tool(name, pl, model, cfg, spec, first, last, out)
        if tool is not None:
            timed = TimedHooks(tool, pl.Callback, count_syncs, idle_device=name.endswith("idle-gpu"))
            callbacks.append(tool)
        step_syncs = StepSyncs() if count_syncs else None
        if step_syncs is not None:
            opener, closer = step_syncs.callbacks(pl.Callback)
            callbacks = [opener, *callbacks, closer]
        trainer = pl.Trainer(max_steps=steps, accelerator="gpu" if cuda else "cpu", devices=1,
                             precision="bf16-mixed" if cuda else "32-true", callbacks=callbacks,
                             logger=collector(pl, measured), log_every_n_steps=1, enable_checkpointing=False,
                             enable_progress_bar=False, enable_model_summary=False, default_root_dir=out)
        with warnings.catch_warnings(), _nvml_for(name):
            warnings.simplefilter("ignore")
            trainer.fit(model)
    ours = tool if name.startswith("nemo-throughput") else None
    window_steps = range(first + 1, last + 1)
    if record is not None and count_syncs:
        _record_syncs(record, timed, step_syncs, window_steps, ours)
    elif record is not None:
        record.step_times_s.append(clock.step_time_s)
        _record_hooks(name, record, timed, window_steps, ours)
        own = _measured_step_s(name, ours, measured, window_steps)
        if own is not None:
            record.measured_s.append(own)


def _nvml_for(name: str) -> contextlib.AbstractContextManager:
    """-slow-nvml: telemetry reads a stand-in for NVML whose energy read takes 5 ms (bench.stand_in)."""
    if not name.endswith("slow-nvml"):
        return contextlib.nullcontext()
    from nemo_throughput.bench.stand_in import SlowEnergyNvml
    from nemo_throughput.explain.telemetry import nvml_stand_in

    return nvml_stand_in(SlowEnergyNvml().reader)


def _tool(name: str, pl: Any, model: Any, cfg: Any, spec: ModelSpec, first: int, last: int, out: str) -> Any:
    """The condition's callback (None for no-callback), set to measure the same steps."""
    if name.startswith("nemo-throughput"):
        from nemo_throughput.adapters.lightning import ThroughputCallback

        debug = name.endswith("debug")
        # -prometheus: the live endpoint on too (an ephemeral port on loopback)
        prometheus = {"port": 0, "addr": "127.0.0.1", "linger_s": 0} if name.endswith("prometheus") else None
        return ThroughputCallback(warmup_steps=first, output_dir=out, per_step_jsonl=debug, peak_tflops=None,
                                  log_every_n_steps=1 if debug else LOG_EVERY_N_STEPS, prometheus=prometheus)
    if name == "empty-callback":
        return type("EmptyCallback", (EmptyHooks, pl.Callback), {})()
    if name == "step-timer-only":
        return type("StepTimerOnly", (StepTimerOnly, pl.Callback), {})(LOG_EVERY_N_STEPS)
    if name == "lightning-throughput-monitor":
        model.flops_per_batch = cfg.micro_batch_size * model_flops_per_sample(spec)  # the same model's FLOPs
        return pl.callbacks.ThroughputMonitor(batch_size_fn=lambda batch: batch.shape[0],
                                              length_fn=lambda batch: batch.shape[1] - 1,
                                              window_size=last - first + 1)
    if name == "nemo-timing-callback":
        from nemo.utils.exp_manager import TimingCallback

        return TimingCallback()
    return None


def _record_hooks(name: str, record: Condition, timed: TimedHooks | None, window_steps: range, ours: Any) -> None:
    """Host time in the tool's hooks per step of the window; ours and the step timer's also split into
    log and other steps."""
    if timed is None:
        return
    per_step_us = [timed.ns_by_step.get(s, 0) / 1e3 for s in window_steps]
    record.hook_us_mean.append(statistics.fmean(per_step_us))
    log_every = None  # steps: a tool with log steps splits its time into log and ordinary steps
    if ours is not None:
        log_every = ours.config.log_every_n_steps
    elif name == "step-timer-only":
        log_every = timed.callback.log_every
    if log_every is None:
        if name == "empty-callback":  # the floor: every step is an ordinary one
            record.hook_us_non_log.append(statistics.median(per_step_us))
        return
    non_log = [us for s, us in zip(window_steps, per_step_us, strict=True) if s % log_every]
    log = [us for s, us in zip(window_steps, per_step_us, strict=True) if not s % log_every]
    if non_log:
        record.hook_us_non_log.append(statistics.median(non_log))
    if log:
        record.hook_us_log.append(statistics.median(log))


def _measured_step_s(name: str, ours: Any, measured: MeasuredValues, window_steps: range) -> float | None:
    """The step time the tool itself reported for the window (None: no tool)."""
    if ours is not None:
        return ours.stats.mean_step_time_s()
    if name == "lightning-throughput-monitor":
        # its separator is "/" or "|" depending on the Lightning version
        (key,) = [k for k in measured.values if k.startswith("train") and k.endswith("device/batches_per_sec".replace(
            "/", k[5]))]
        return 1 / measured.last(key)
    if name == "nemo-timing-callback":
        return statistics.fmean(measured.at("train_step_timing in s", window_steps))
    return None


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


def _unavailable(name: str, namespace: str, cuda: bool) -> str | None:
    if name not in CONDITIONS:
        return f"unknown condition; choose from {list(CONDITIONS)}"
    if name.endswith("idle-gpu") and not cuda:
        return "a CUDA diagnostic (the GPU idle before each hook)"
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
