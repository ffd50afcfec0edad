"""A baseline and a candidate compared, metric by metric: the change in percent of the geometric
means, its 95 % interval (`stats`), and a verdict against a threshold on speed.

The verdict, for a threshold T % (speed: tokens/s, samples/s and MFU as they are, step time
inverted, so that a step 2.04 % longer is 2 % slower):

- ``slower``: the whole interval lies below -T % (slower by more than T %, with 95 % confidence);
- ``faster``: the whole interval lies above +T %;
- ``no change``: the whole interval lies within -T % .. +T % (any change is smaller than T %);
- ``inconclusive``: anything else, and every case where the noise of a side is not known."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from nemo_throughput.compare.sides import Side, differences
from nemo_throughput.report.comparable import describe, warmup_note
from nemo_throughput.compare.stats import Interval, Noise, interval, one_run_noise, runs_noise
from nemo_throughput.errors import ReportError
from nemo_throughput.text import printable

SCHEMA = "nemo-throughput/compare/v1"
LEVEL = 0.95
DEFAULT_THRESHOLD_PCT = 2.0
SLOWER, FASTER, NO_CHANGE, INCONCLUSIVE = "slower", "faster", "no change", "inconclusive"


@dataclass(frozen=True)
class Metric:
    name: str  # the key of Workload.metrics, and of --metric
    title: str  # as printed
    higher_is_better: bool


METRICS = {m.name: m for m in (Metric("tokens_per_s", "tokens/s", True), Metric("samples_per_s", "samples/s", True),
                               Metric("step_time_s", "step time", False), Metric("mfu", "MFU", True))}


@dataclass
class MetricComparison:
    """One metric: each side's geometric mean over its runs, the change and its interval in
    percent of the baseline (None: not known), and the verdict."""

    metric: str
    baseline_mean: float
    baseline_runs: int
    candidate_mean: float
    candidate_runs: int
    change_pct: float
    ci95_pct: tuple[float, float] | None
    verdict: str
    method: str  # how the interval was found: runs, runs and one run, steps, none
    reason: str | None = None  # why inconclusive, in words

    def record(self) -> dict[str, Any]:
        return {"metric": self.metric, "baseline_mean": self.baseline_mean, "baseline_runs": self.baseline_runs,
                "candidate_mean": self.candidate_mean, "candidate_runs": self.candidate_runs,
                "change_pct": self.change_pct, "ci95_pct": list(self.ci95_pct) if self.ci95_pct else None,
                "verdict": self.verdict, "method": self.method, "reason": self.reason}


@dataclass
class Comparison:
    baseline: Side
    candidate: Side
    threshold_pct: float
    metrics: list[MetricComparison]
    differences: list[dict[str, Any]]  # configuration values that differ (compared with --allow-different)
    unknown: list[str]  # configuration names neither side knows
    notes: list[str] = field(default_factory=list)

    @property
    def slower(self) -> bool:
        """Some compared metric is slower: the exit status is 1."""
        return any(m.verdict == SLOWER for m in self.metrics)

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "threshold_pct": self.threshold_pct, "level": LEVEL,
                "baseline": side_record(self.baseline), "candidate": side_record(self.candidate),
                "metrics": [m.record() for m in self.metrics], "differences": self.differences,
                "unknown": self.unknown, "slower": self.slower}


def side_record(side: Side) -> dict[str, Any]:
    return {"path": side.given, "runs": len(side.runs), "labels": side.labels,
            "files": [str(path) for run in side.runs for path in run.paths], "configuration": side.configuration}


def compare(baseline: Side, candidate: Side, metrics: list[str] | None = None,
            threshold_pct: float = DEFAULT_THRESHOLD_PCT, allow_different: bool = False) -> Comparison:
    """Compare the two sides; ReportError where their configurations differ (unless
    `allow_different`) or a metric asked for is not known for every run."""
    found, unknown = differences(baseline, candidate)
    if found and not allow_different:
        raise ReportError("the baseline and the candidate are not the same configuration:\n  "
                          + "\n  ".join(difference_text(d) for d in found)
                          + "\ncompare the same configuration, or give --allow-different to compare anyway")
    notes = [f"the {role}'s {len(side.runs)} runs have the same mean step time: a spread of 0 narrows the interval "
             "to the other side's noise (rounded log values?)"
             for role, side in (("baseline", baseline), ("candidate", candidate))
             if len(side.runs) > 1 and len({run.step_time_s for run in side.runs}) == 1]
    warmups = warmup_note([*baseline.runs, *candidate.runs], "the baseline and the candidate")
    notes += [warmups] if warmups else []
    names = metrics or default_metrics(baseline, candidate, notes)
    compared = [compare_metric(METRICS[name], baseline, candidate, threshold_pct) for name in names]
    return Comparison(baseline, candidate, threshold_pct, compared, found, unknown, notes)


def difference_text(difference: dict[str, Any]) -> str:
    return (f"{difference['field']}: {describe(difference['baseline'])} (baseline) vs "
            f"{describe(difference['candidate'])} (candidate)")


def default_metrics(baseline: Side, candidate: Side, notes: list[str]) -> list[str]:
    """The primary rate (tokens/s, or samples/s where a run has no tokens), the step time where
    both sides' steps hold the same work, and MFU where every run has it."""
    runs = [*baseline.runs, *candidate.runs]
    names = ["tokens_per_s" if all(per_run(run, "tokens_per_s") for run in runs) else "samples_per_s"]
    same_work = all(baseline.configuration[name] == candidate.configuration[name]
                    for name in ("global batch", "sequence length"))
    if same_work:
        names.append("step_time_s")
    else:
        notes.append("step time is not compared: the two sides' steps hold different work (global batch or "
                     "sequence length); give --metric step_time_s to compare it anyway")
    if all(per_run(run, "mfu") for run in runs):
        names.append("mfu")
    return names


def per_run(run: Any, name: str) -> float | None:
    """The metric of one run (its mean step time): tokens/s, samples/s, step time in s, MFU."""
    if name == "step_time_s":
        return run.step_time_s
    return run.workload.metrics(run.step_time_s)[name]


def side_noise(side: Side, metric: Metric) -> Noise:
    values = [per_run(run, metric.name) for run in side.runs]
    for run, value in zip(side.runs, values, strict=True):
        if value is None or not (math.isfinite(value) and value > 0):
            why = "not known (no FLOPs per sample or peak?)" if value is None else f"{value!r}"
            raise ReportError(f"{printable(run.path)}: its {metric.title} is {why}; it cannot be compared "
                              f"(leave out --metric {metric.name})")
    logs = [math.log(value) for value in values]
    return runs_noise(logs) if len(logs) > 1 else one_run_noise(logs[0], side.step_times)


def compare_metric(metric: Metric, baseline: Side, candidate: Side, threshold_pct: float) -> MetricComparison:
    base, cand = side_noise(baseline, metric), side_noise(candidate, metric)
    found = interval(base, cand, LEVEL)
    verdict = decide(found, metric.higher_is_better, threshold_pct)
    bounds = (_pct(found.low), _pct(found.high)) if found.low is not None else None
    return MetricComparison(
        metric=metric.name, baseline_mean=math.exp(base.centre), baseline_runs=base.runs,
        candidate_mean=math.exp(cand.centre), candidate_runs=cand.runs, change_pct=_pct(found.log_ratio),
        ci95_pct=bounds, verdict=verdict, method=found.method,
        reason=None if verdict != INCONCLUSIVE else _reason(found, metric, baseline, candidate, threshold_pct))


def _pct(log_ratio: float) -> float:
    return 100 * math.expm1(log_ratio)


def decide(found: Interval, higher_is_better: bool, threshold_pct: float) -> str:
    """The verdict of an interval on the log ratio (see the module's docstring)."""
    if found.low is None:
        return INCONCLUSIVE
    low, high = _speed_bounds(found, higher_is_better)
    worse, better = math.log1p(-threshold_pct / 100), math.log1p(threshold_pct / 100)
    if high < worse:
        return SLOWER
    if low > better:
        return FASTER
    if worse <= low and high <= better:
        return NO_CHANGE
    return INCONCLUSIVE


def _speed_bounds(found: Interval, higher_is_better: bool) -> tuple[float, float]:
    """The interval as a log ratio of speed: a longer step time is a lower speed."""
    return (found.low, found.high) if higher_is_better else (-found.high, -found.low)


def _reason(found: Interval, metric: Metric, baseline: Side, candidate: Side, threshold_pct: float) -> str:
    if found.low is None:
        unknown = [f"{role}: {side.steps_note}" for role, side in (("baseline", baseline), ("candidate", candidate))
                   if side.steps_note]
        return ("one run on each side, and the noise of a run is not known ("
                + "; ".join(unknown) + "); repeat the runs (two or more a side) or record per-step times")
    low, high = _speed_bounds(found, metric.higher_is_better)
    if high < 0:
        return f"slower, but maybe by less than {threshold_pct:g} %; more repeats narrow the interval"
    if low > 0:
        return f"faster, but maybe by less than {threshold_pct:g} %; more repeats narrow the interval"
    return f"the interval holds no change and changes beyond {threshold_pct:g} %; more repeats narrow it"
