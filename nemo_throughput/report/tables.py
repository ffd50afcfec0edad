"""From runs to the tables benchmark studies print: configurations with mean and spread over
repeats, scaling against the smallest node count, and environments against a baseline."""

from __future__ import annotations

import csv
import io
import json
import math
import statistics
from dataclasses import asdict, dataclass, field
from operator import attrgetter
from typing import Any

from nemo_throughput.report.runs import ReportError, Run
from nemo_throughput.report.safe_text import csv_cell, markdown_cell, printable
from nemo_throughput.throughput import days_to_train


@dataclass
class Group:
    """The repeats of one configuration: label x model x node/GPU count."""

    label: str
    model: str
    num_nodes: int
    num_gpus: int
    runs: int
    tokens_per_s: float  # mean over runs
    tokens_per_s_std: float  # sample standard deviation over runs (0 for one run)
    tokens_per_s_per_gpu: float
    step_time_s: float
    model_tflops_per_gpu: float | None
    mfu: float | None
    days_to_train: float
    global_batch_size: int
    seq_length: int
    files: list[str] = field(default_factory=list)
    linear_factor: float | None = None  # tokens/s over the smallest node count's, same label and model
    perfect_linear_factor: float | None = None  # GPU count over the smallest node count's
    perfect_linear_scale: float | None = None  # tokens/s if scaling were perfect
    scaling_efficiency: float | None = None  # linear factor / perfect linear factor


@dataclass
class Comparison:
    model: str
    num_nodes: int
    num_gpus: int
    baseline: str
    other: str
    baseline_tokens_per_s: float
    other_tokens_per_s: float
    diff_pct: float  # 100 * (baseline - other) / baseline: positive when `other` is slower


@dataclass
class Report:
    groups: list[Group]
    comparisons: list[Comparison]
    tokens: float  # the token budget of days_to_train
    baseline: str | None

    def to_json(self) -> dict[str, Any]:
        return {"tokens": self.tokens, "baseline": self.baseline,
                "groups": [asdict(g) for g in self.groups], "comparisons": [asdict(c) for c in self.comparisons]}


def build_report(runs: list[Run], tokens: float = 1e12, baseline: str | None = None) -> Report:
    _require_distinct_when_printed(runs)
    try:
        groups = [_group(members, tokens) for members in _by_configuration(runs).values()]
        groups.sort(key=lambda g: (g.model, g.label, g.num_gpus))
        _add_scaling(groups)
        labels = sorted({g.label for g in groups})
        if baseline is not None and baseline not in labels:
            raise ReportError(f"--baseline {baseline!r} is not a label of these runs; their labels are {labels}")
        comparisons = _compare(groups, runs, baseline) if baseline else []
    except OverflowError as error:
        raise ReportError(f"the numbers of these runs overflow when combined ({error}); check --tokens and the "
                          "summaries' step times and batch sizes") from error
    report = Report(groups, comparisons, tokens, baseline)
    _require_finite(report)
    return report


def _require_finite(report: Report) -> None:
    """Each run's numbers are finite (runs.load_run checks); combined with --tokens they may not be."""
    for row in (*report.groups, *report.comparisons):
        for name, value in asdict(row).items():
            if isinstance(value, float) and not math.isfinite(value):
                raise ReportError(f"{name} is {value} for {printable(row.model)} at {row.num_nodes} nodes; "
                                  "check --tokens and the summaries' step times")


def _require_distinct_when_printed(runs: list[Run]) -> None:
    """Two labels (or models) that print the same, e.g. `k8s` and `k8s` wrapped in colour codes,
    would be two rows no reader can tell apart: refuse rather than show them."""
    for what, name_of in (("labels", attrgetter("label")), ("models", attrgetter("model"))):
        printed: dict[str, list[str]] = {}
        for name in sorted({name_of(run) for run in runs}):
            printed.setdefault(printable(name), []).append(name)
        for shown_as, originals in printed.items():
            if len(originals) > 1:
                files = ", ".join(str(run.path) for run in runs if name_of(run) in originals)
                raise ReportError(f"{what} {', '.join(map(repr, originals))} all print as {shown_as!r} once control "
                                  f"characters are removed; correct them in {files}")


def _by_configuration(runs: list[Run]) -> dict[tuple, list[Run]]:
    configurations: dict[tuple, list[Run]] = {}
    for run in runs:
        configurations.setdefault((run.label, run.model, run.num_nodes, run.num_gpus), []).append(run)
    return configurations


def _group(runs: list[Run], tokens: float) -> Group:
    first = runs[0]
    _require_same_setup(runs, f"{printable(first.label)} / {printable(first.model)} / {first.num_nodes} nodes")
    per_run = [run.workload.metrics(run.step_time_s) for run in runs]
    tokens_per_s = [m["tokens_per_s"] for m in per_run]
    mean_tps = statistics.fmean(tokens_per_s)
    mfus = [m["mfu"] for m in per_run]
    tflops = [m["model_tflops_per_gpu"] for m in per_run]
    return Group(
        label=first.label, model=first.model, num_nodes=first.num_nodes, num_gpus=first.num_gpus, runs=len(runs),
        tokens_per_s=mean_tps,
        tokens_per_s_std=statistics.stdev(tokens_per_s) if len(runs) > 1 else 0.0,
        tokens_per_s_per_gpu=mean_tps / first.num_gpus,
        step_time_s=statistics.fmean(run.step_time_s for run in runs),
        model_tflops_per_gpu=statistics.fmean(tflops) if None not in tflops else None,
        mfu=statistics.fmean(mfus) if None not in mfus else None,
        days_to_train=days_to_train(tokens, mean_tps),
        global_batch_size=first.global_batch_size, seq_length=first.seq_length,
        files=[str(run.path) for run in runs],
    )


def _require_same_setup(runs: list[Run], what: str) -> None:
    setups = {tuple(run.setup.items()) for run in runs}
    if len(setups) > 1:
        lines = "\n  ".join(f"{run.path}: " + ", ".join(f"{k} {printable(v)}" for k, v in run.setup.items())
                             for run in runs)
        raise ReportError(f"runs of {what} differ in their set-up and cannot be averaged:\n  {lines}")


def _add_scaling(groups: list[Group]) -> None:
    series: dict[tuple[str, str], list[Group]] = {}
    for group in groups:
        series.setdefault((group.label, group.model), []).append(group)
    for members in series.values():
        smallest = min(members, key=lambda g: g.num_gpus)
        for group in members:
            group.linear_factor = group.tokens_per_s / smallest.tokens_per_s
            group.perfect_linear_factor = group.num_gpus / smallest.num_gpus
            group.perfect_linear_scale = group.perfect_linear_factor * smallest.tokens_per_s
            group.scaling_efficiency = group.linear_factor / group.perfect_linear_factor


def _compare(groups: list[Group], runs: list[Run], baseline: str) -> list[Comparison]:
    by_key = {(g.label, g.model, g.num_nodes, g.num_gpus): g for g in groups}
    runs_by_key = _by_configuration(runs)
    comparisons = []
    for (label, model, nodes, gpus), other in by_key.items():
        base = by_key.get((baseline, model, nodes, gpus))
        if label == baseline or base is None:
            continue
        _require_same_setup(runs_by_key[(baseline, model, nodes, gpus)] + runs_by_key[(label, model, nodes, gpus)],
                            f"{printable(model)} at {nodes} nodes under {baseline!r} and {label!r}")
        comparisons.append(Comparison(
            model=model, num_nodes=nodes, num_gpus=gpus, baseline=baseline, other=label,
            baseline_tokens_per_s=base.tokens_per_s, other_tokens_per_s=other.tokens_per_s,
            diff_pct=100.0 * (base.tokens_per_s - other.tokens_per_s) / base.tokens_per_s,
        ))
    comparisons.sort(key=lambda c: (c.model, c.other, c.num_gpus))
    return comparisons


# ------------------------------------------------------------------------------------- rendering
DIFF_SIGN = "diff % = 100 x (baseline - other) / baseline: positive when the other environment is slower"


def _group_rows(report: Report) -> tuple[list[str], list[list[str]]]:
    days = f"days for {_count(report.tokens)} tokens"
    header = ["label", "model", "nodes", "GPUs", "runs", "tokens/s (mean ± 2σ)", "linear factor",
              "perfect linear", "perfect linear scale", "efficiency", "tokens/s/GPU", "MFU", days]
    rows = [[
        g.label, g.model, str(g.num_nodes), str(g.num_gpus), str(g.runs),
        f"{g.tokens_per_s:,.0f} ± {2 * g.tokens_per_s_std:,.0f}", f"{g.linear_factor:.2f}",
        f"{g.perfect_linear_factor:.2f}", f"{g.perfect_linear_scale:,.0f}", f"{100 * g.scaling_efficiency:.1f} %",
        f"{g.tokens_per_s_per_gpu:,.0f}", f"{100 * g.mfu:.2f} %" if g.mfu is not None else "n/a",
        f"{g.days_to_train:,.2f}",
    ] for g in report.groups]
    return header, rows


def _count(tokens: float) -> str:
    for scale, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M")):
        if tokens >= scale:
            return f"{tokens / scale:g}{suffix}"
    return f"{tokens:g}"


def _comparison_rows(report: Report) -> tuple[list[str], list[list[str]]]:
    header = ["model", "nodes", "GPUs", "baseline", "other", "baseline tokens/s", "other tokens/s", "diff %"]
    rows = [[c.model, str(c.num_nodes), str(c.num_gpus), c.baseline, c.other, f"{c.baseline_tokens_per_s:,.0f}",
             f"{c.other_tokens_per_s:,.0f}", f"{c.diff_pct:+.2f}"] for c in report.comparisons]
    return header, rows


def render(report: Report, fmt: str) -> str:
    if fmt == "json":  # ASCII only: every control character in a label comes out as a \u escape
        return json.dumps(report.to_json(), indent=2, allow_nan=False) + "\n"
    if fmt == "csv":
        return _render_csv(report)
    table = _markdown_table if fmt == "markdown" else _text_table
    parts = [table(*_group_rows(report))]
    if report.comparisons:
        parts += [table(*_comparison_rows(report)), DIFF_SIGN]
    elif report.baseline:
        parts.append(f"(no configuration has both {report.baseline!r} and another label to compare)")
    else:
        labels = sorted({g.label for g in report.groups})
        if len(labels) > 1:
            parts.append(f"(compare labels with --baseline, one of {labels})")
    return "\n\n".join(parts) + "\n"


def _text_table(header: list[str], rows: list[list[str]]) -> str:
    """Aligned columns: words to the left, numbers to the right."""
    rows = [[printable(cell) for cell in row] for row in rows]
    table = [header, *rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    numeric = [all(r[i][:1].isdigit() or r[i][:1] in "+-" for r in rows) and bool(rows) for i in range(len(header))]

    def line(row: list[str]) -> str:
        cells = [c.rjust(w) if num else c.ljust(w) for c, w, num in zip(row, widths, numeric, strict=True)]
        return "  ".join(cells).rstrip()

    return "\n".join([line(header), "  ".join("-" * w for w in widths), *map(line, rows)])


def _markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(map(markdown_cell, row)) + " |" for row in rows]
    return "\n".join(lines)


def _render_csv(report: Report) -> str:
    """The groups, then (after an empty line) the comparisons, with raw numbers."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    group_fields = [f for f in Group.__dataclass_fields__ if f != "files"]
    writer.writerow(group_fields)
    for g in report.groups:
        writer.writerow([csv_cell(getattr(g, f)) for f in group_fields])
    if report.comparisons:
        writer.writerow([])
        fields = list(Comparison.__dataclass_fields__)
        writer.writerow(fields)
        for c in report.comparisons:
            writer.writerow([csv_cell(getattr(c, f)) for f in fields])
    return out.getvalue()
