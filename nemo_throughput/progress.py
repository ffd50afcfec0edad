"""A log interval as the user sees it: the live progress line and the steps.jsonl rows, made on
the reporting thread."""

from __future__ import annotations

from typing import Any

import torch

from nemo_throughput.aggregation import Interval, RunStats, step_times
from nemo_throughput.timing import StepTimes


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
