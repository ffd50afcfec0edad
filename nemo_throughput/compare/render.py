"""A :class:`~nemo_throughput.compare.comparison.Comparison` printed: an aligned table with what it
rests on below it, or JSON. Every value read from a summary goes through text.printable (JSON
escapes control characters itself)."""

from __future__ import annotations

import json

from nemo_throughput.compare.comparison import METRICS, Comparison, MetricComparison, difference_text
from nemo_throughput.compare.sides import Side
from nemo_throughput.text import printable

MISSING = "n/a"
METHODS = {
    "runs": "Welch's t interval over the runs' means (each run an independent repeat)",
    "runs and one run": "one run beside repeats: the run is taken to vary from run to run as the repeats do",
    "steps": "one run a side: batch means of each run's steps; the interval holds the noise of the steps, not how "
             "much runs differ from run to run",
}


def render(comparison: Comparison, fmt: str) -> str:
    if fmt == "json":  # ASCII only: a control character in a label comes out as a \u escape
        return json.dumps(comparison.to_json(), indent=2, allow_nan=False) + "\n"
    return "\n".join([*_sides(comparison), "", table(*_rows(comparison)), "", *_footer(comparison)]) + "\n"


def _sides(comparison: Comparison) -> list[str]:
    return [f"{role:<9}  {_side(side)}" for role, side in (("baseline", comparison.baseline),
                                                             ("candidate", comparison.candidate))]


def _side(side: Side) -> str:
    runs = f"{len(side.runs)} run{'s' if len(side.runs) > 1 else ''}"
    labels = ", ".join(side.labels)
    return printable(f"{side.given} ({runs}; label{'s' if len(side.labels) > 1 else ''} {labels})")


def _rows(comparison: Comparison) -> tuple[list[str], list[list[str]]]:
    header = ["metric", "baseline", "runs", "candidate", "runs", "change", "95 % interval", "verdict"]
    rows = [[METRICS[m.metric].title, value(m.metric, m.baseline_mean), str(m.baseline_runs),
             value(m.metric, m.candidate_mean), str(m.candidate_runs), f"{m.change_pct:+.2f} %", _bounds(m),
             m.verdict] for m in comparison.metrics]
    return header, rows


def value(metric: str, number: float) -> str:
    """A metric's value with its unit: tokens/s whole, step time in s, MFU in percent."""
    if metric == "tokens_per_s":
        return f"{number:,.0f}"
    if metric == "step_time_s":
        return f"{number:.4g} s"
    if metric == "mfu":
        return f"{100 * number:.2f} %"
    return f"{number:,.4g}"


def _bounds(m: MetricComparison) -> str:
    return MISSING if m.ci95_pct is None else f"{m.ci95_pct[0]:+.2f} .. {m.ci95_pct[1]:+.2f} %"


def _footer(comparison: Comparison) -> list[str]:
    lines = [f"verdict: the 95 % interval against ±{comparison.threshold_pct:g} % of speed (step time read as "
             "speed: a step 2.04 % longer is 2 % slower)"]
    lines += [f"interval: {METHODS[method]}" for method in dict.fromkeys(m.method for m in comparison.metrics)
              if method in METHODS]
    reasons: dict[str, list[str]] = {}
    for m in comparison.metrics:
        if m.reason:
            reasons.setdefault(m.reason, []).append(METRICS[m.metric].title)
    lines += [f"{', '.join(titles)}: inconclusive: {reason}" for reason, titles in reasons.items()]
    if comparison.differences:
        lines.append("compared although they differ (--allow-different):")
        lines += [f"  {printable(difference_text(d))}" for d in comparison.differences]
    if comparison.unknown:
        lines.append(f"not known on either side, so not checked: {', '.join(comparison.unknown)}")
    lines.append("exit status 1: the candidate is slower" if comparison.slower else
                 "exit status 0: the candidate is not slower")
    return lines


def table(header: list[str], rows: list[list[str]]) -> str:
    """Aligned columns: text to the left, numbers to the right."""
    cells = [[printable(cell) for cell in row] for row in [header, *rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    numeric = [bool(rows) and all(row[i][:1].isdigit() or row[i][:1] in "+-" for row in cells[1:])
               for i in range(len(header))]

    def line(row: list[str]) -> str:
        return "  ".join(c.rjust(w) if num else c.ljust(w) for c, w, num in zip(row, widths, numeric, strict=True))

    return "\n".join(line(row).rstrip() for row in [cells[0], ["-" * w for w in widths], *cells[1:]])
