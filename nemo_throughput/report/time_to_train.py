"""Time to train, the MLPerf way, from summaries imported with ``--format mlperf``: the repeats of
a benchmark on one system scored as MLPerf's result_summarizer scores them (olympic average, in
minutes from run_start to run_stop), and the speedup over the smallest accelerator count."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

UNET3D_DROPPED = 4  # result_summarizer drops 4 from each end for unet3d (40 runs), 1 for the others


@dataclass
class TrainGroup:
    """The repeats of one benchmark on one system (label), node count and accelerator count."""

    benchmark: str
    label: str
    num_nodes: int
    num_gpus: int
    time_to_train_minutes: dict[str, Any]  # olympic, mean, two_sigma, runs, converged (and how they were scored)
    speedup: float | None = None  # over the smallest accelerator count (then fewest nodes) of the benchmark and label
    speedup_of: str | None = None  # "olympic" where both groups have one, else "mean"
    scaling_efficiency: float | None = None  # speedup / accelerator-count ratio
    files: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def olympic_average(minutes: list[float], dropped: int, max_dropped: int) -> float | None:
    """result_summarizer's olympic average: the counted times sorted, ``max_dropped`` cut from the
    fast end and ``max_dropped - dropped`` from the slow end (dropped runs count as the slowest);
    None when none remain. The same arithmetic in the same order, so the digits agree."""
    scores = sorted(minutes)
    countable = scores[max_dropped:len(scores) - (max_dropped - dropped)]
    if not countable:
        return None
    return sum(countable) * 1.0 / len(countable)


def build_time_to_train(runs: list[Any]) -> list[TrainGroup]:
    """TrainingRuns (report.runs) grouped by benchmark, label, node and accelerator count, scored:
    2 nodes of 8 and 4 nodes of 4 are different systems, never one set of repeats."""
    by_key: dict[tuple[str, str, int, int], list[Any]] = {}
    for run in runs:
        by_key.setdefault((run.benchmark, run.label, run.num_nodes, run.num_gpus), []).append(run)
    groups = [_train_group(members) for _, members in sorted(by_key.items())]
    _add_speedup(groups)
    return groups


def _train_group(members: list[Any]) -> TrainGroup:
    first = members[0]
    counted = [run.minutes for run in members if run.counted]
    dropped = len(members) - len(counted)
    max_dropped = UNET3D_DROPPED if first.benchmark == "unet3d" else 1
    required = first.required_runs
    factors = sorted({run.scaling_factor for run in members})
    notes = []
    olympic = None
    if len(factors) > 1:
        notes.append(f"runs hold different scaling.json factors {factors}: olympic average not scored")
    elif required is not None and len(members) < required:
        notes.append(f"{len(members)} of the {required} runs {first.benchmark} needs: olympic average not scored")
    elif dropped > max_dropped:
        notes.append(f"{dropped} runs dropped (not compliant or not converged), more than the {max_dropped} "
                     "allowed: olympic average not scored")
    else:
        score = olympic_average(counted, dropped, max_dropped)
        olympic = score * factors[0] if score is not None else None
    mean = statistics.fmean(counted) if counted else None
    summary = {
        "olympic": olympic, "mean": mean,
        "two_sigma": 2 * statistics.stdev(counted) if len(counted) > 1 else (0.0 if counted else None),
        "runs": len(members), "converged": sum(run.converged for run in members),
        "compliant": sum(run.compliant for run in members), "dropped": dropped, "required_runs": required,
        "scaling_factor": factors[0] if len(factors) == 1 else None,
    }
    return TrainGroup(first.benchmark, first.label, first.num_nodes, first.num_gpus, summary,
                      files=sorted(run.source for run in members), notes=notes)


def _add_speedup(groups: list[TrainGroup]) -> None:
    """Speedup and scaling efficiency over the smallest accelerator count of the same benchmark and label;
    of two systems with that count (2 nodes of 8, 4 of 4), over the one with fewer nodes."""
    for group in groups:
        base = min((g for g in groups if (g.benchmark, g.label) == (group.benchmark, group.label)),
                   key=attrgetter("num_gpus", "num_nodes"))
        basis = "olympic" if base.time_to_train_minutes["olympic"] and group.time_to_train_minutes["olympic"] \
            else "mean"
        before, after = base.time_to_train_minutes[basis], group.time_to_train_minutes[basis]
        if before and after:
            group.speedup, group.speedup_of = before / after, basis
            group.scaling_efficiency = group.speedup / (group.num_gpus / base.num_gpus)


def time_to_train_records(groups: list[TrainGroup]) -> list[dict[str, Any]]:
    return [{name: getattr(g, name) for name in TrainGroup.__dataclass_fields__ if name != "notes"} for g in groups]
