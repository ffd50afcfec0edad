"""A log interval as the user sees it: the live progress line, the loggers' metrics (one list of
keys, :data:`LOGGED_METRICS`) and the steps.jsonl rows, made on the reporting thread."""

from __future__ import annotations

from typing import Any

import torch

from nemo_throughput.aggregation import step_times
from nemo_throughput.explain.telemetry import SLOWDOWN_REASONS
from nemo_throughput.run_stats import Interval, RunStats
from nemo_throughput.throughput import METRICS, Metric
from nemo_throughput.timing import StepTimes


def _over_ranks(key: str, unit: str, what: str) -> tuple[Metric, ...]:
    return tuple(Metric(f"{key}_{stat}", unit, f"{what}: {stat} over ranks")
                 for stat in ("min", "median", "max"))


# The keys the loggers get at each log step, under ``throughput/``: the rates, then the interval's own.
LOGGED_METRICS = (
    *METRICS,
    Metric("step_time_s", "s", "the interval's mean global (slowest-rank) step time"),
    Metric("slowest_rank", "rank", "the rank longest before its first collective in the interval"),
    Metric("straggler_excess_pct", "%", "the run's slowest rank so far: its time above the median rank's"),
    Metric("logging_s", "s", "our log step's work and the trackers' calls the device waited for, mean over the "
                 "interval's steps and ranks"),
    Metric("data_s", "s", "waiting for the batch, mean over the interval's steps and ranks"),
    Metric("forward_s", "s", "forward, mean over the interval's steps and ranks"),
    Metric("backward_s", "s", "backward and gradient reduction, mean over the interval's steps and ranks"),
    Metric("optimizer_s", "s", "optimizer step, mean over the interval's steps and ranks"),
    Metric("padding_share", "fraction", "of the token slots, where packed or padded batches are counted"),
    Metric("goodput_pct", "%", "the run's goodput so far (productive step time / wall time, across its "
                 "restarts), as of the previous log step"),
)
# From each rank's device telemetry (explain.telemetry): absent where the device has none (a CPU).
TELEMETRY_METRICS = (
    *_over_ranks("memory_reserved_gib", "GiB", "the allocator's reserved peak so far, at the latest log step"),
    *_over_ranks("power_w", "W", "board power at the latest log step (NVML)"),
    *_over_ranks("sm_clock_mhz", "MHz", "SM clock at the latest log step (NVML)"),
    Metric("throttled_ranks", "ranks", "ranks whose clocks a power cap or a thermal or hardware slowdown "
                 "lowered at the latest log step (NVML clocks-event reasons)"),
    Metric("joules_per_token", "J/token", "the run's energy so far (NVML energy counters of every GPU) "
                 "per token"),
    Metric("tokens_per_kwh", "tokens/kWh", "the inverse of joules_per_token, in tokens per kilowatt-hour"),
)
LOGGED_METRICS += TELEMETRY_METRICS
LOGGED_KEYS = tuple(metric.key for metric in LOGGED_METRICS)
TELEMETRY_KEYS = frozenset(metric.key for metric in TELEMETRY_METRICS)


def logger_metrics(interval: Interval, metrics: dict[str, float | None],
                   run: dict[str, float | None]) -> dict[str, float]:
    """The loggers' metrics of an interval: ``metrics`` (throughput.Workload.metrics), the interval's
    own figures and ``run``'s (straggler, padding, telemetry, energy, goodput: the keys of the run
    so far); keys of LOGGED_METRICS, under ``throughput/``, those with no value left out."""
    values = {**metrics, "step_time_s": interval.step_time_s, "slowest_rank": interval.slowest_rank,
              **interval.phases_s, **run}
    return {f"throughput/{key}": float(values[key]) for key in LOGGED_KEYS if values.get(key) is not None}


def summary_metrics(summary: dict[str, Any]) -> dict[str, float]:
    """The same keys (without ``throughput/``) for the whole run as its summary gives them: the
    measured steps' rates and means, the straggler, the telemetry over ranks, energy and goodput."""
    timing, telemetry = summary["timing"], summary.get("telemetry") or {}
    device, memory = telemetry.get("device") or {}, telemetry.get("memory") or {}
    straggler, counted = timing.get("straggler") or {}, summary["batch"].get("counted") or {}
    values: dict[str, Any] = {key: summary["throughput"].get(key) for key in LOGGED_KEYS}
    values.update(step_time_s=(timing["step_time_s"] or {}).get("mean"), slowest_rank=timing.get("slowest_rank"),
                  straggler_excess_pct=straggler.get("excess_pct"), padding_share=counted.get("padding_share"),
                  goodput_pct=(summary.get("goodput") or {}).get("goodput_pct"),
                  **{f"{phase}_s": (timing.get("breakdown_s") or {}).get(phase)
                     for phase in ("data", "forward", "backward", "optimizer")},
                  **{key: (telemetry.get("energy") or {}).get(key) for key in ("joules_per_token", "tokens_per_kwh")})
    for key, stats in (("memory_reserved_gib", memory.get("peak_reserved_gib")), ("power_w", device.get("power_w")),
                       ("sm_clock_mhz", device.get("sm_clock_mhz"))):
        values.update({f"{key}_{stat}": (stats or {}).get(stat) for stat in ("min", "median", "max")})
    throttled = {rank for reason, ranks in (device.get("throttle_reasons") or {}).items()
                 if reason in SLOWDOWN_REASONS for rank in ranks}
    values["throttled_ranks"] = len(throttled) if device else None
    return {key: float(value) for key, value in values.items() if value is not None}


def format_interval(interval: Interval, metrics: dict[str, float | None]) -> str:
    """One readable line per log interval; its figures leave out the steps the statistics leave out."""
    steps = interval.last_step - interval.first_step + 1
    reasons = "/".join(interval.left_out_reasons)
    if interval.left_out == steps:  # nothing counted: described by all its steps
        warmup = " (warm-up)" if interval.warmup else f" ({reasons} steps, not counted)"
    elif interval.left_out:
        warmup = f" ({interval.left_out} {reasons} step{'s' if interval.left_out > 1 else ''} not counted)"
    else:
        warmup = ""
    parts = [f"step {interval.step_time_s:.4g} s (max {interval.max_step_time_s:.4g})"]
    if metrics["tokens_per_s"] is not None:
        parts += [f"{metrics['tokens_per_s']:,.0f} tok/s", f"{metrics['tokens_per_s_per_gpu']:,.0f} tok/s/GPU"]
    else:  # samples that are not token sequences
        parts.append(f"{metrics['samples_per_s']:,.4g} samples/s")
    if metrics["model_tflops_per_gpu"] is not None:
        parts.append(f"{metrics['model_tflops_per_gpu']:.4g} TFLOPS/GPU")
    if metrics["mfu_above_peak"] is not None:
        parts.append(f"MFU n/a (computed {100 * metrics['mfu_above_peak']:.0f}%, above peak)")
    else:
        parts.append(f"MFU {100 * metrics['mfu']:.1f}%" if metrics["mfu"] is not None else "MFU n/a")
    parts.append(f"slowest rank {interval.slowest_rank}")
    return f"[throughput] steps {interval.first_step}-{interval.last_step}{warmup}: " + " | ".join(parts)


def step_rows(steps: torch.Tensor, stats: RunStats, run_id: str) -> list[dict[str, Any]]:
    """Per-step JSON Lines rows: the global (slowest-rank) time and every rank's phases, and the
    run's id (so that rows of two runs can never be taken for one). ``skipped``: an iteration the
    framework skipped (no optimizer update), left out of the statistics."""
    per_rank = [step_times(steps, rank) for rank in range(steps.shape[0])]
    return [{
        "step": ranks[0].step,
        "run_id": run_id,
        "warmup": stats.is_warmup(ranks[0].step),
        "profiled": stats.is_excluded(ranks[0].step),
        "skipped": ranks[0].step in stats.skipped,
        "step_time_s": max(r.step_s for r in ranks),
        "ranks": [{name: getattr(r, name) for name in StepTimes.VALUES} for r in ranks],
    } for ranks in zip(*per_rank, strict=True)]
