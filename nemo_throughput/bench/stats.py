"""The bench's arithmetic: per-condition medians, overheads against the baseline, the paired
per-round overhead with its Student-t confidence interval, and the ratios within one run."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from nemo_throughput.student_t import t_quantile

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
    half = t_quantile(0.975, len(per_round) - 1) * statistics.stdev(per_round) / math.sqrt(len(per_round))
    return {"per_round": per_round, "mean": mean, "ci95": [mean - half, mean + half]}


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


def ratios(results: dict[str, Condition]) -> dict[str, float | None]:
    """Side by side in this run: our host time per step against ThroughputMonitor's, our log step's
    against our ordinary step's, our ordinary step's with the Prometheus endpoint on against it
    without, and our log step's with a 5 ms NVML energy read against it with none; and, differences
    in µs, our ordinary step's host time above the floor (an empty callback's four hooks) and above
    our step timer's alone, and the timer's above the floor (None where a condition did not run)."""
    def median(name: str, attribute: str) -> float | None:
        values = getattr(results[name], attribute) if name in results else []
        return statistics.median(values) if values else None

    ours, monitor = median("nemo-throughput", "hook_us_mean"), median("lightning-throughput-monitor", "hook_us_mean")
    log_step, non_log = median("nemo-throughput", "hook_us_log"), median("nemo-throughput", "hook_us_non_log")
    live = median("nemo-throughput-prometheus", "hook_us_non_log")
    slow_nvml = median("nemo-throughput-slow-nvml", "hook_us_log")
    floor = median("empty-callback", "hook_us_non_log")
    timer = median("step-timer-only", "hook_us_non_log")
    return {"hooks_per_step_vs_throughput_monitor": ours / monitor if ours is not None and monitor else None,
            "log_step_vs_non_log_step": log_step / non_log if log_step is not None and non_log else None,
            "prometheus_non_log_step_vs_non_log_step": live / non_log if live is not None and non_log else None,
            "slow_nvml_log_step_vs_log_step": slow_nvml / log_step if slow_nvml is not None and log_step else None,
            "non_log_step_above_empty_callback_us": _difference(non_log, floor),
            "non_log_step_above_step_timer_only_us": _difference(non_log, timer),
            "step_timer_only_above_empty_callback_us": _difference(timer, floor)}


def _difference(first: float | None, second: float | None) -> float | None:
    return first - second if first is not None and second is not None else None
