"""The bench's result as text: a table per condition with its legend, or JSON."""

from __future__ import annotations

import json
from typing import Any


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
        "each kind of step (empty-callback's non-log: the floor, four hooks that do nothing; step-timer-only's:",
        "the step timer alone in the four hooks, without the rest of an ordinary step's work); syncs/step:",
        "host-device synchronizations in a whole step, and in the tool's own hooks (CUDA only: one extra",
        "untimed trial per condition).",
    ]
    ratios = result.get("ratios") or {}
    said = [text.format(ratios[key]) for key, text in RATIO_TEXTS if ratios.get(key) is not None]
    if said:
        lines += ["", "side by side in this run: " + "; ".join(said)]
    return "\n".join(lines) + "\n"


RATIO_TEXTS = (  # the bench's ratios and differences (bench.stats.ratios), as the table's last line says them
    ("hooks_per_step_vs_throughput_monitor", "nemo-throughput's hooks/step = {:.2f} x ThroughputMonitor's"),
    ("log_step_vs_non_log_step", "nemo-throughput's log step = {:.0f} x its non-log step"),
    ("prometheus_non_log_step_vs_non_log_step",
     "nemo-throughput's non-log step with the Prometheus endpoint = {:.2f} x without"),
    ("slow_nvml_log_step_vs_log_step", "nemo-throughput's log step with a 5 ms NVML energy read = {:.2f} x with none"),
    ("non_log_step_above_empty_callback_us", "nemo-throughput's non-log step = {:.1f} µs above empty-callback's"),
    ("non_log_step_above_step_timer_only_us", "{:.1f} µs above step-timer-only's"),
    ("step_timer_only_above_empty_callback_us", "step-timer-only's non-log step = {:.1f} µs above empty-callback's"),
)


def _ms(seconds: float | None) -> str:
    return "" if seconds is None else f"{1e3 * seconds:.2f} ms"


def _pct(value: float | None, sign: bool = True, digits: int = 2) -> str:
    return "" if value is None else f"{value:{'+' if sign else ''}.{digits}f} %"


def _us(value: float | None) -> str:
    return "" if value is None else f"{value:.0f} µs"


def _count(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}"
