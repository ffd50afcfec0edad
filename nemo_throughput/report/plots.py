"""PNG plots of a report: tokens/s and MFU against GPU count, one line per label, one row per model."""

from __future__ import annotations

from pathlib import Path

from nemo_throughput.report.runs import ReportError
from nemo_throughput.report.safe_text import printable
from nemo_throughput.report.tables import Report

IMAGE_SUFFIXES = (".png", ".svg", ".pdf")  # what matplotlib writes without extra packages


def plot_report(report: Report, path: Path) -> None:
    """Write the plot to `path`, in the format its suffix names (one of IMAGE_SUFFIXES)."""
    try:
        import matplotlib
    except ImportError:
        raise ReportError("--plot needs matplotlib: pip install 'nemo-throughput[report]'") from None
    matplotlib.use("Agg")  # headless
    import matplotlib.pyplot as plt

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
            name = _plain(label)
            gpus = [g.num_gpus for g in series]
            throughput.errorbar(gpus, [g.tokens_per_s for g in series], yerr=[2 * g.tokens_per_s_std for g in series],
                                marker="o", capsize=4, color=colors[label], label=name)
            throughput.plot(gpus, [g.perfect_linear_scale for g in series], linestyle="--", color=colors[label],
                            alpha=0.6, label=f"{name}: perfect linear")
            if all(g.mfu is not None for g in series):
                utilisation.plot(gpus, [100 * g.mfu for g in series], marker="o", color=colors[label], label=name)
        throughput.set(title=f"{_plain(model)}: tokens/s (mean ± 2σ)", xlabel="GPUs", ylabel="tokens/s")
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
    try:
        figure.savefig(path, dpi=120)
    except OSError as error:
        raise ReportError(f"--plot {path}: cannot write it ({error.strerror or error})") from error
    finally:
        plt.close(figure)


def _plain(text: str) -> str:
    """A label as matplotlib should draw it: printable, `$` not read as mathtext, and a leading `_`
    (which would hide it from the legend) kept visible."""
    text = printable(text).replace("$", r"\$")
    return f" {text}" if text.startswith("_") else text
