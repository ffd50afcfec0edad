"""Plots of a report: tokens/s (or samples/s) and MFU against GPU count, one line per label, one row per model;
and, where the summaries say it, where the step time goes per configuration (stacked bars)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from nemo_throughput.outputs import write_bytes_atomic
from nemo_throughput.report.grouping import PHASE_FIELDS, Group, Report
from nemo_throughput.report.runs import ReportError
from nemo_throughput.text import printable

IMAGE_SUFFIXES = (".png", ".svg", ".pdf")  # what matplotlib writes without extra packages


# The profiled window's shares that add up to the whole (overlapped communication hides in compute).
STACKED_SHARES = (("compute_share", "compute", "C0"), ("exposed_communication_share", "exposed communication", "C3"),
                  ("idle_share", "idle", "C7"))
PHASE_COLORS = {"logging_s": "C4", "data_s": "C7", "forward_s": "C0", "backward_s": "C2", "optimizer_s": "C1"}


def _pyplot() -> tuple[Any, Any]:
    """matplotlib and pyplot (an optional dependency: the report extra), drawing without a display."""
    try:
        import matplotlib
    except ImportError:
        raise ReportError("--plot needs matplotlib: pip install 'nemo-throughput[report]'") from None
    matplotlib.use("Agg")  # headless
    import matplotlib.pyplot as plt

    return matplotlib, plt


def plot_report(report: Report, path: Path) -> None:
    """Write the plot to `path`, in the format its suffix names (one of IMAGE_SUFFIXES)."""
    matplotlib, plt = _pyplot()

    models = sorted({g.model for g in report.groups})
    labels = sorted({g.label for g in report.groups})
    colors = {label: f"C{i}" for i, label in enumerate(labels)}
    figure, axes = plt.subplots(len(models), 2, figsize=(12, 4.2 * len(models)), squeeze=False)
    for row, model in zip(axes, models, strict=True):
        throughput, utilisation = row
        for label in labels:
            series = sorted((g for g in report.groups if g.model == model and g.label == label),
                            key=lambda g: g.num_gpus)
            if not series:
                continue
            _draw_series(throughput, utilisation, series, _plain(label), colors[label])
        unit = next(g.unit for g in report.groups if g.model == model)
        throughput.set(title=f"{_plain(model)}: {unit}/s (mean ± 2σ)", xlabel="GPUs", ylabel=f"{unit}/s")
        throughput.yaxis.set_major_formatter(matplotlib.ticker.EngFormatter())
        utilisation.set(title=f"{_plain(model)}: MFU", xlabel="GPUs", ylabel="MFU (%)")
        for ax in row:  # linear axes: perfect linear scaling is a straight line
            ax.set_xticks(sorted({g.num_gpus for g in report.groups if g.model == model}))
            ax.set_xlim(left=0)
            ax.margins(y=0.08)
            ax.set_ylim(bottom=0)
            ax.grid(True, alpha=0.3)
            if ax.has_data():
                ax.legend(fontsize="small")
            else:
                ax.text(0.5, 0.5, "no peak FLOPs known: MFU n/a", ha="center", va="center", transform=ax.transAxes)
    figure.tight_layout()
    _save(figure, path, plt)


def _draw_series(throughput: Any, utilisation: Any, series: list[Group], name: str, color: str) -> None:
    """One label's curve; configurations off it (another set-up: grouping._add_scaling) as points
    of their own, never joined to it."""
    for on_curve in (True, False):
        part = [g for g in series if (g.scaling_efficiency is not None) == on_curve]
        if not part:
            continue
        shown = name if on_curve else f"{name}: other set-up (not scaled)"
        style = {"marker": "o", "color": color} if on_curve else {"marker": "x", "color": color, "linestyle": "none"}
        gpus = [g.num_gpus for g in part]
        throughput.errorbar(gpus, [g.rate for g in part], yerr=[2 * g.rate_std for g in part], capsize=4,
                            label=shown, **style)
        if on_curve:
            throughput.plot(gpus, [g.perfect_linear_scale for g in part], linestyle="--", color=color, alpha=0.6,
                            label=f"{name}: perfect linear")
        if all(g.mfu is not None for g in part):
            utilisation.plot(gpus, [100 * g.mfu for g in part], label=shown, **style)


def _save(figure: Any, path: Path, plt: Any) -> None:
    """The image, written whole or not at all (outputs.write_bytes_atomic: a link at ``path`` is replaced)."""
    try:
        image = io.BytesIO()
        figure.savefig(image, dpi=120, format=path.suffix.lstrip(".").lower())
        write_bytes_atomic(path, image.getvalue(), durable=False)
    except OSError as error:
        raise ReportError(f"--plot {path}: cannot write it ({error.strerror or error})") from error
    finally:
        plt.close(figure)


def has_breakdown(report: Report) -> bool:
    """Whether some run says where its step time goes (the breakdown plot is drawn only then)."""
    return report.step_time


def plot_breakdown(report: Report, path: Path) -> None:
    """Stacked bars per configuration: the profiled steps' compute / exposed communication / idle
    shares, and the phases of a step in seconds. A configuration without the data is marked n/a,
    never drawn as 0."""
    _, plt = _pyplot()
    groups = report.groups
    panels = [draw for draw, names in ((_draw_shares, [name for name, _, _ in STACKED_SHARES]),
                                       (_draw_phases, PHASE_FIELDS))
              if any(getattr(g, name) is not None for g in groups for name in names)]
    figure, axes = plt.subplots(1, len(panels), figsize=(8 * len(panels), 1.8 + 0.5 * len(groups)), squeeze=False)
    names = [_configuration(g, report) for g in groups]
    for ax, draw in zip(axes[0], panels, strict=True):
        draw(ax, groups)
        ax.set_yticks(range(len(groups)), names)
        ax.set_ylim(len(groups) - 0.5, -0.5)  # the first configuration on top, as in the table
        ax.grid(True, axis="x", alpha=0.3)
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside, never over a bar
    figure.tight_layout()
    _save(figure, path, plt)


def _draw_shares(ax: Any, groups: list[Group]) -> None:
    drawn = set()
    for y, g in enumerate(groups):
        shares = [getattr(g, name) for name, _, _ in STACKED_SHARES]
        if None in shares:
            ax.text(1, y, "n/a (not profiled)", va="center")
            continue
        left = 0.0
        for (_, name, color), share in zip(STACKED_SHARES, shares, strict=True):
            ax.barh(y, 100 * share, left=left, color=color, label=name if name not in drawn else None)
            drawn.add(name)
            left += 100 * share
        if g.communication_share is not None:
            ax.text(left + 1, y, f"comm. {100 * g.communication_share:.0f} %", va="center", fontsize="small")
    ax.set(title="profiled steps: share of the step time", xlabel="% of the step time")
    ax.set_xlim(0, 125)  # room for the communication note beside each bar


def _draw_phases(ax: Any, groups: list[Group]) -> None:
    drawn = set()
    for y, g in enumerate(groups):
        phases = {name: getattr(g, name) for name in PHASE_FIELDS}
        if None in phases.values():
            ax.text(0, y, " n/a (phases not timed)", va="center")
        else:
            left = 0.0
            for name, seconds in phases.items():
                label = name.removesuffix("_s") if name not in drawn else None
                ax.barh(y, seconds, left=left, color=PHASE_COLORS[name], label=label)
                drawn.add(name)
                left += seconds
        ax.plot([g.step_time_s], [y], marker="|", markersize=18, color="black",
                label="step time" if y == 0 else None)
    ax.set(title="phases of a step (mean over ranks)", xlabel="seconds per step")
    ax.set_xlim(left=0)


def _configuration(g: Group, report: Report) -> str:
    network = f" ({g.network})" if g.network and report.group_by == "label" else ""
    return _plain(f"{g.label}{network} / {g.model} / {g.num_gpus} GPUs")


def _plain(text: str) -> str:
    """A label as matplotlib should draw it: printable, `$` not read as mathtext, and a leading `_`
    (which would hide it from the legend) kept visible."""
    text = printable(text).replace("$", r"\$")
    return f" {text}" if text.startswith("_") else text
