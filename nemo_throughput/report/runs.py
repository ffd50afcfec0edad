"""Runs as the report sees them: one summary file each, with an optional window of steps."""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nemo_throughput.summary import read_summary
from nemo_throughput.throughput import Workload


class ReportError(ValueError):
    """Input the report cannot use, naming the file and what is wrong with it."""


class IncompleteRun(ReportError):
    """A run that did not complete: left out of the report with a note, not an error."""


@dataclass(frozen=True)
class Window:
    """Which steps count, by step number (the callback's, from 1): `A:B` is A <= step < B,
    `A:` from A on, `-N:` the last N steps, `last` the last step."""

    text: str
    start: int | None
    stop: int | None

    @classmethod
    def parse(cls, text: str) -> Window:
        if text == "last":
            return cls(text, -1, None)
        parts = text.split(":")
        try:
            if len(parts) != 2:
                raise ValueError
            start, stop = (int(p) if p else None for p in parts)
        except ValueError:
            raise ReportError(f"--window {text!r}: use A:B (steps A to B-1), A:, -N: (last N steps) or last") from None
        if start is not None and stop is not None and (start < 0 or stop <= start):
            raise ReportError(f"--window {text!r} selects no step: A:B needs 0 <= A < B")
        return cls(text, start, stop)

    def select(self, steps: list[tuple[int, float]]) -> list[tuple[int, float]]:
        if self.start is not None and self.start < 0:
            return steps[self.start:]
        return [(n, t) for n, t in steps if (self.start is None or n >= self.start)
                and (self.stop is None or n < self.stop)]


@dataclass
class Run:
    path: Path
    label: str
    model: str
    num_nodes: int
    num_gpus: int
    global_batch_size: int
    seq_length: int
    flops_per_sample: float
    flops_formula: str
    gpu_name: str
    dtype: str | None
    peak_tflops: float | None
    step_time_s: float  # mean global step time over the counted steps
    steps_counted: int
    window: str | None

    @property
    def workload(self) -> Workload:
        return Workload(self.global_batch_size, self.seq_length, self.num_gpus, self.flops_per_sample,
                        self.peak_tflops)

    @property
    def setup(self) -> dict[str, Any]:
        """What must be equal for runs to be averaged or compared."""
        return {"global batch": self.global_batch_size, "sequence length": self.seq_length,
                "FLOPs per sample": f"{self.flops_per_sample:.6g} ({self.flops_formula})", "GPU": self.gpu_name,
                "dtype": self.dtype}


def load_run(path: Path, window: Window | None = None) -> Run:
    """Read one summary; raise ReportError (naming the file) if it cannot be reported on."""
    try:
        summary = read_summary(path)
    except ValueError as error:
        raise ReportError(str(error)) from error
    if summary["status"] != "completed":
        raise IncompleteRun(f"{path}: status {summary['status']!r}{_error_of(summary)}: only completed runs are "
                          "reported")
    try:
        timing, hardware, batch, model = summary["timing"], summary["hardware"], summary["batch"], summary["model"]
        if window is None:
            step_time_s = (timing["step_time_s"] or {}).get("mean")
            counted = timing["steps_measured"]
            if not step_time_s:
                raise ReportError(f"{path}: no measured steps (the run was shorter than its warm-up)")
            window_text = timing.get("window")
        else:
            selected = window.select(step_series(path, summary))
            if not selected:
                raise ReportError(f"{path}: --window {window.text} selects none of its steps "
                                  f"({_step_range(step_series(path, summary))})")
            step_time_s = statistics.fmean(t for _, t in selected)
            counted, window_text = len(selected), window.text
        return Run(path=path, label=summary["run"]["label"], model=model["name"], num_nodes=hardware["num_nodes"],
                   num_gpus=hardware["num_gpus"], global_batch_size=batch["global_batch_size"],
                   seq_length=batch["seq_length"], flops_per_sample=model["flops_per_sample"],
                   flops_formula=model["flops_formula"], gpu_name=hardware["gpu_name"], dtype=hardware["dtype"],
                   peak_tflops=hardware["peak_tflops"], step_time_s=step_time_s, steps_counted=counted,
                   window=window_text)
    except (KeyError, TypeError) as error:
        raise ReportError(f"{path}: incomplete summary, {error!r} is missing") from error


def step_series(path: Path, summary: dict[str, Any]) -> list[tuple[int, float]]:
    """(step, global step time) of every step: in an imported summary, or in steps.jsonl beside it."""
    embedded = summary["timing"].get("steps")
    if embedded:
        return [(int(n), float(t)) for n, t in embedded]
    jsonl = path.parent / "steps.jsonl"
    if not jsonl.exists():
        raise ReportError(f"{path}: --window needs per-step times, and this run has none (record them with "
                          "per_step_jsonl=true or +callbacks=throughput_debug)")
    rows = [json.loads(line) for line in jsonl.read_text().splitlines() if line.strip()]
    return [(row["step"], row["step_time_s"]) for row in rows]


def find_summaries(paths: list[str]) -> list[Path]:
    """Files as given; directories are searched for summary.json files."""
    found = []
    for given in paths:
        path = Path(given)
        if path.is_dir():
            found += sorted(path.rglob("summary.json"))
        elif path.exists():
            found.append(path)
        else:
            raise ReportError(f"{given}: no such file or directory")
    if not found:
        raise ReportError(f"no summary.json under {' '.join(paths)}")
    return found


def _step_range(steps: list[tuple[int, float]]) -> str:
    return f"it has steps {steps[0][0]} to {steps[-1][0]}" if steps else "it has no steps"


def _error_of(summary: dict[str, Any]) -> str:
    return f" ({summary['error']})" if summary.get("error") else ""
