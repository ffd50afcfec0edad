"""A :class:`~nemo_throughput.report.grouping.Report` printed: aligned text, markdown, CSV or JSON.
A value not measured, or not by every run of a configuration, is shown as n/a, never as 0."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Collection
from typing import Any

from nemo_throughput.goodput.ledger import CATEGORIES
from nemo_throughput.report.goodput import GOODPUT_FIELDS, goodput_records
from nemo_throughput.report.grouping import (
    PHASE_FIELDS,
    PROBE_FIELDS,
    SHARES,
    Comparison,
    Group,
    Report,
    probe_records,
    step_time_fields,
    step_time_records,
)
from nemo_throughput.report.time_to_train import TrainGroup, accelerators_word
from nemo_throughput.text import csv_cell, markdown_cell, printable

DIFF_SIGN = "diff % = 100 x (baseline - other) / baseline: positive when the other environment is slower"
MISSING = "n/a"  # not measured, or not by every run of the configuration: never shown as 0
STEP_TIME_TITLE = ("Where the step time goes: shares of the profiled steps (compute + exposed communication +\n"
                   "idle = 100 %; communication counts overlapped collectives too), and the phases of a step in\n"
                   "seconds, means over ranks.")
PROBE_TITLE = "Start-up fabric probe: bus bandwidth in GB/s (nccl-tests' busbw), per collective and message size"


def _group_rows(report: Report, unit: str = "tokens") -> tuple[list[str], list[list[str]], set[int]]:
    """The configuration table of the groups rated in `unit` (tokens/s, or samples/s: no days to train)."""
    groups = [g for g in report.groups if g.unit == unit]
    header = ["label", "model", "nodes", "GPUs", "runs", f"{unit}/s (mean ± 2σ)", "linear factor",
              "perfect linear", "perfect linear scale", "efficiency", f"{unit}/s/GPU", "MFU"]
    rate = "{:,.0f}" if unit == "tokens" else "{:,.4g}"
    rows = [[
        g.label, g.model, str(g.num_nodes), str(g.num_gpus), str(g.runs),
        f"{rate.format(g.rate)} ± {rate.format(2 * g.rate_std)}", *_scaling_cells(g, rate),
        rate.format(g.rate / g.num_gpus), f"{100 * g.mfu:.2f} %" if g.mfu is not None else "n/a",
    ] for g in groups]
    if unit == "tokens":
        header.append(f"days for {_count(report.tokens)} tokens")
        for row, g in zip(rows, groups, strict=True):
            row.append(f"{g.days_to_train:,.2f}")
    if report.group_by == "network":
        header[0] = "network"
    elif "network" in report.shown:
        header.insert(1, "network")
        for row, g in zip(rows, groups, strict=True):
            row.insert(1, _text(g.network))
    explaining = set()
    if any(g.scaling_efficiency is None for g in groups):  # off its curve (grouping._add_scaling): n/a is a number
        first = header.index("linear factor")
        explaining.update(range(first, first + SCALING_COLUMNS))
    for title, cell in _explaining_columns(report):
        explaining.add(len(header))
        header.append(title)
        for row, g in zip(rows, groups, strict=True):
            row.append(cell(g))
    return header, rows, explaining


SCALING_COLUMNS = 4  # linear factor, perfect linear, perfect linear scale, efficiency


def _scaling_cells(g: Group, rate: str) -> list[str]:
    """Linear factor, perfect linear factor and scale, efficiency; n/a off the curve."""
    if g.scaling_efficiency is None:
        return [MISSING] * SCALING_COLUMNS
    return [f"{g.linear_factor:.2f}", f"{g.perfect_linear_factor:.2f}", rate.format(g.perfect_linear_scale),
            f"{100 * g.scaling_efficiency:.1f} %"]


def _explaining_columns(report: Report) -> list[tuple[str, Any]]:
    """(header, cell of a group) of each explaining column some configuration has a value for."""
    columns = {
        "communication_share": ("communication %", lambda g: _percent(g.communication_share)),
        "exposed_communication_share": ("exposed comm. %", lambda g: _percent(g.exposed_communication_share)),
        "memory_peak_reserved_gib": ("peak memory GiB", lambda g: _number(g.memory_peak_reserved_gib, ".1f")),
        "sm_clock_mhz": ("SM clock MHz", lambda g: _number(g.sm_clock_mhz, ",.0f")),
        "power_w": ("power W", lambda g: _number(g.power_w, ",.0f")),
        "joules_per_token": ("J/token", lambda g: _number(g.joules_per_token, ".3g")),
        "probe_all_reduce_busbw_gbps": _busbw_column(report),
        "straggler_rank": ("slowest rank", _slowest_rank),
    }
    return [columns[name] for name in report.shown if name in columns]


def _busbw_column(report: Report) -> tuple[str, Any]:
    """The probe's all_reduce busbw at its largest size: in the header when all share it, else in each cell."""
    sizes = {g.probe_all_reduce_bytes for g in report.groups if g.probe_all_reduce_bytes is not None}
    if len(sizes) == 1:
        return f"all_reduce busbw GB/s @ {_size(sizes.pop())}", lambda g: _number(g.probe_all_reduce_busbw_gbps, ".1f")

    def cell(g: Group) -> str:
        if g.probe_all_reduce_busbw_gbps is None:
            return MISSING
        return f"{g.probe_all_reduce_busbw_gbps:.1f} @ {_size(g.probe_all_reduce_bytes)}"

    return "all_reduce busbw GB/s", cell


def _slowest_rank(g: Group) -> str:
    """`rank@host +excess %`: the rank most above the median rank, and by how much."""
    if g.straggler_rank is None:
        return MISSING
    where = f"{g.straggler_rank}@{g.straggler_host}" if g.straggler_host else f"{g.straggler_rank}"
    return f"{where} {g.straggler_excess_pct:+.1f} %"


def _percent(fraction: float | None) -> str:
    return MISSING if fraction is None else f"{100 * fraction:.1f} %"


def _number(value: float | None, spec: str) -> str:
    return MISSING if value is None else format(value, spec)


def _text(value: str | None) -> str:
    return MISSING if value is None else value


def _size(size_bytes: int) -> str:
    """Message sizes as nccl-tests prints them: 8 B, 64 KiB, 256 MiB, 1 GiB (binary units)."""
    for power, unit in ((3, "GiB"), (2, "MiB"), (1, "KiB")):
        if size_bytes >= 1024 ** power:
            return f"{size_bytes / 1024 ** power:g} {unit}"
    return f"{size_bytes} B"


def _count(tokens: float) -> str:
    for scale, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M")):
        if tokens >= scale:
            return f"{tokens / scale:g}{suffix}"
    return f"{tokens:g}"


def _comparison_rows(report: Report) -> tuple[list[str], list[list[str]]]:
    header = ["model", "nodes", "GPUs", "baseline", "runs", "other", "runs", "baseline tokens/s", "other tokens/s",
              "diff %"]
    if report.has_samples:
        header[7:9] = ["baseline rate", "other rate"]
    rows = [[c.model, str(c.num_nodes), str(c.num_gpus), c.baseline, str(c.baseline_runs), c.other, str(c.other_runs),
             *_compared_rates(c, report.has_samples), f"{c.diff_pct:+.2f}"] for c in report.comparisons]
    return header, rows


def _compared_rates(c: Comparison, with_units: bool) -> list[str]:
    if c.unit == "samples":
        return [f"{c.baseline_samples_per_s:,.4g} samples/s", f"{c.other_samples_per_s:,.4g} samples/s"]
    unit = " tokens/s" if with_units else ""
    return [f"{c.baseline_tokens_per_s:,.0f}{unit}", f"{c.other_tokens_per_s:,.0f}{unit}"]


def _step_time_rows(report: Report) -> tuple[list[str], list[list[str]], set[int]]:
    """Per configuration: the profiled shares and the phases, each family only where some run has it."""
    header = ["network" if report.group_by == "network" else "label", "model", "nodes", "GPUs", "step time s"]
    rows = [[g.label, g.model, str(g.num_nodes), str(g.num_gpus), f"{g.step_time_s:.3f}"] for g in report.groups]
    if report.group_by == "label" and "network" in report.shown:
        header.insert(1, "network")
        for row, g in zip(rows, report.groups, strict=True):
            row.insert(1, _text(g.network))
    families = ((SHARES, ("compute %", "communication %", "exposed comm. %", "idle %"), _percent),
                (PHASE_FIELDS, tuple(f"{name.removesuffix('_s')} s" for name in PHASE_FIELDS), lambda v: _number(v, ".3f")))
    for names, titles, cell in families:
        if any(getattr(g, name) is not None for g in report.groups for name in names):
            header += titles
            for row, g in zip(rows, report.groups, strict=True):
                row += [cell(getattr(g, name)) for name in names]
    return header, rows, set(range(header.index("step time s"), len(header)))


def _probe_rows(report: Report) -> tuple[list[str], list[list[str]], set[int]]:
    """Collective x size down, one column per configuration that ran the probe."""
    groups = report.probe_groups
    several_models = len({g.model for g in groups}) > 1
    nodes_per_gpus: dict[int, set[int]] = {}
    for g in groups:
        nodes_per_gpus.setdefault(g.num_gpus, set()).add(g.num_nodes)

    def title(g: Group) -> str:
        parts = [g.label, g.model] if several_models else [g.label]
        if len(nodes_per_gpus[g.num_gpus]) > 1:
            parts.append(f"{g.num_nodes} nodes")
        return " ".join([*parts, f"{g.num_gpus} GPUs"])

    header = ["collective", "size", *map(title, groups)]
    rows = [[op, _size(size), *(_number(g.probe_busbw_gbps.get((op, size)), ".1f") for g in groups)]
            for op, size in report.probe_rows]
    return header, rows, set(range(1, len(header)))


def render(report: Report, fmt: str) -> str:
    if fmt == "json":  # ASCII only: every control character in a label comes out as a \u escape
        return json.dumps(report.to_json(), indent=2, allow_nan=False) + "\n"
    if fmt == "csv":
        return _render_csv(report)
    table = _markdown_table if fmt == "markdown" else _text_table
    parts = [table(*_group_rows(report))] if any(g.unit == "tokens" for g in report.groups) else []
    if report.has_samples:
        parts.append(table(*_group_rows(report, "samples")))
    if not parts and not report.time_to_train and not report.goodput:
        parts = [table(*_group_rows(report))]  # no run: the header alone
    if report.comparisons:
        parts += [table(*_comparison_rows(report)), DIFF_SIGN]
    elif report.baseline:
        parts.append(f"(no configuration has both {report.baseline!r} and another label to compare)")
    elif report.groups:
        labels = sorted({g.label for g in report.groups})
        if len(labels) > 1:
            parts.append(f"(compare labels with --baseline, one of {labels})")
    if report.step_time:
        parts += [STEP_TIME_TITLE, table(*_step_time_rows(report))]
    if report.probe_rows:
        parts += [PROBE_TITLE, table(*_probe_rows(report))]
    if report.time_to_train:
        parts += [TIME_TO_TRAIN_TITLE, table(*_time_to_train_rows(report.time_to_train))]
    if report.goodput:
        parts += [GOODPUT_TITLE, table(*_goodput_rows(report.goodput))]
    return "\n\n".join(parts) + "\n"


def _text_table(header: list[str], rows: list[list[str]], missing_is_number: Collection[int] = ()) -> str:
    """Aligned columns: words to the left, numbers to the right. In the columns `missing_is_number`
    names, n/a is a missing number (the explaining columns; today's keep their old alignment)."""
    header = [printable(cell) for cell in header]
    rows = [[printable(cell) for cell in row] for row in rows]
    table = [header, *rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]

    def is_number(cell: str, column: int) -> bool:
        return cell[:1].isdigit() or cell[:1] in "+-" or (column in missing_is_number and cell == MISSING)

    numeric = [all(is_number(r[i], i) for r in rows) and bool(rows) for i in range(len(header))]

    def line(row: list[str]) -> str:
        cells = [c.rjust(w) if num else c.ljust(w) for c, w, num in zip(row, widths, numeric, strict=True)]
        return "  ".join(cells).rstrip()

    return "\n".join([line(header), "  ".join("-" * w for w in widths), *map(line, rows)])


def _markdown_table(header: list[str], rows: list[list[str]], missing_is_number: Collection[int] = ()) -> str:
    """A markdown table (the renderer aligns it; `missing_is_number` is for the text table only)."""
    lines = ["| " + " | ".join(map(markdown_cell, header)) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(map(markdown_cell, row)) + " |" for row in rows]
    return "\n".join(lines)


def _render_csv(report: Report) -> str:
    """The groups, then (each after an empty line) the comparisons, where the step time goes and
    the probe (one row per collective, size and configuration), with raw numbers."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    group_fields = [f for f in report.group_fields if f != "files"]
    sections = [(group_fields, [{f: getattr(g, f) for f in group_fields} for g in report.groups])]
    if report.comparisons:
        records = [c.record(report.has_samples) for c in report.comparisons]
        sections.append((list(records[0]), records))
    if report.step_time:
        sections.append((step_time_fields(report), step_time_records(report)))
    if report.probe_rows:
        sections.append((list(PROBE_FIELDS), probe_records(report)))
    if report.time_to_train:
        sections.append((TIME_TO_TRAIN_CSV_FIELDS, _time_to_train_csv(report.time_to_train)))
    if report.goodput:
        sections.append((list(GOODPUT_FIELDS), goodput_records(report.goodput)))
    for index, (fields, records) in enumerate(sections):
        if index:
            writer.writerow([])
        writer.writerow(fields)
        for record in records:
            writer.writerow([csv_cell(record[f]) for f in fields])
    return out.getvalue()


GOODPUT_TITLE = "Goodput (hours by category; a run of several segments counts its lost steps and restarts)"


def _goodput_rows(runs: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    header = ["run", "segments", "last step", "lost steps", "wall h", "goodput", *(f"{c} h" for c in CATEGORIES)]
    rows = [[r["run_id"], str(r["segments"]), str(r["steps_last"]), str(r["steps_lost"]), _number(r["wall_h"], ".4g"),
             _percent(None if r["goodput_pct"] is None else r["goodput_pct"] / 100),
             *(_number(r[f"{c}_h"], ".4g") for c in CATEGORIES)] for r in goodput_records(runs)]
    return header, rows


TIME_TO_TRAIN_TITLE = "Time to train (minutes, run_start to run_stop; olympic average as MLPerf scores it)"


def _time_to_train_rows(groups: list[TrainGroup]) -> tuple[list[str], list[list[str]], set[int]]:
    header = ["benchmark", "label", "system", "nodes", accelerators_word(g.accelerator for g in groups), "runs",
              "converged", "olympic min", "mean min", "± 2σ min", "speedup", "scaling eff"]
    rows = []
    for g in groups:
        t = g.time_to_train_minutes
        rows.append([g.benchmark, g.label, g.system or "-", str(g.num_nodes), str(g.num_gpus), str(t["runs"]),
                     str(t["converged"]), _number(t["olympic"], ".2f"), _number(t["mean"], ".2f"),
                     _number(t["two_sigma"], ".2f"), _number(g.speedup, ".2f") + ("x" if g.speedup else ""),
                     _percent(g.scaling_efficiency)])
    return header, rows, set(range(3, len(header)))


TIME_TO_TRAIN_CSV_FIELDS = ["benchmark", "label", "system", "num_nodes", "num_gpus", "runs", "converged",
                            "olympic_min", "mean_min", "two_sigma_min", "speedup", "speedup_over",
                            "scaling_efficiency"]


def _time_to_train_csv(groups: list[TrainGroup]) -> list[dict[str, Any]]:
    return [{"benchmark": g.benchmark, "label": g.label, "system": g.system, "num_nodes": g.num_nodes,
             "num_gpus": g.num_gpus, "runs": g.time_to_train_minutes["runs"],
             "converged": g.time_to_train_minutes["converged"], "olympic_min": g.time_to_train_minutes["olympic"],
             "mean_min": g.time_to_train_minutes["mean"], "two_sigma_min": g.time_to_train_minutes["two_sigma"],
             "speedup": g.speedup, "speedup_over": g.speedup_over, "scaling_efficiency": g.scaling_efficiency}
            for g in groups]
