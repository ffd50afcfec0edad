"""The statistics of `compare`, plain Python: the noise of one side (its runs'
spread, or one run's steps as batch means) and Welch's interval on the difference of two sides.

Everything is on the log scale of a metric: the difference of two sides is the log of the ratio of
their geometric means, so tokens/s and step time give the same interval, mirrored."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from nemo_throughput.student_t import t_quantile

BATCHES = 10  # batch means of one run: at most this many batches ...
MIN_BATCH_STEPS = 5  # ... of at least this many consecutive steps
BATCHES_NEEDED = 2  # fewer batches: no noise estimate


@dataclass(frozen=True)
class Noise:
    """A side's centre on the log scale and the standard error of it; `df` the degrees of freedom of
    the error (n - 1 for n runs, batches - 1 for one run's batch means); `se` None: not known."""

    centre: float  # mean log of the metric
    se: float | None
    df: float | None
    runs: int
    source: str  # one of SOURCES


SOURCES = ("runs", "steps", "none")  # the spread of repeats; one run's batch means; one run, noise unknown


@dataclass(frozen=True)
class Interval:
    """The log ratio candidate / baseline and its two-sided interval; bounds None: not known."""

    log_ratio: float
    low: float | None
    high: float | None
    method: str  # how the error was found: "runs", "runs and one run", "steps" or "none"


def runs_noise(log_values: list[float]) -> Noise:
    """Two or more runs' log metric: their mean, and the standard error of the mean across runs."""
    if len(log_values) < 2:
        raise ValueError("the spread of runs needs at least two runs")
    spread = statistics.stdev(log_values)
    n = len(log_values)
    return Noise(statistics.fmean(log_values), spread / math.sqrt(n), n - 1, n, "runs")


def one_run_noise(log_value: float, step_times: list[float] | None) -> Noise:
    """One run's log metric, with the error of its mean step time from batch means where its steps
    are known (relative, as the log of the metric moves by d(step time) / step time)."""
    error = batch_means_error(step_times) if step_times else None
    if error is None:
        return Noise(log_value, None, None, 1, "none")
    se, df = error
    return Noise(log_value, se / statistics.fmean(step_times), df, 1, "steps")


def batch_means_error(step_times: list[float]) -> tuple[float, int] | None:
    """(standard error of the mean step time, in seconds; degrees of freedom) from non-overlapping
    batch means of consecutive steps; None with fewer than two batches of MIN_BATCH_STEPS steps.

    Consecutive steps are correlated (a slow node, a thermal drift), so the steps' own standard
    deviation over sqrt(n) is too small; means of batches of consecutive steps are close to
    independent once a batch is longer than the correlation, and their spread holds it. The first
    n mod batches steps are left out of the batches (the start of a run drifts most)."""
    batches = min(BATCHES, len(step_times) // MIN_BATCH_STEPS)
    if batches < BATCHES_NEEDED:
        return None
    size = len(step_times) // batches
    tail = step_times[len(step_times) - batches * size:]
    means = [statistics.fmean(tail[i * size:(i + 1) * size]) for i in range(batches)]
    return statistics.stdev(means) / math.sqrt(batches), batches - 1


def interval(baseline: Noise, candidate: Noise, level: float = 0.95) -> Interval:
    """The interval on candidate - baseline (log scale) at `level`.

    - repeats on both sides: Welch's, each side's error with its n - 1 degrees of freedom;
    - repeats on one side, one run on the other: the run is taken to vary from run to run as much
      as the repeats do (their spread s is its error), with the repeats' n - 1 degrees of freedom;
    - one run on each side: each run's batch-means error (step-to-step noise only), Welch's;
    - else (one run of unknown noise beside another run): no bounds."""
    difference = candidate.centre - baseline.centre
    repeats = [noise for noise in (baseline, candidate) if noise.runs > 1]
    if len(repeats) == 1:
        (other,) = repeats
        se = other.se * math.sqrt(1 + other.runs)  # sqrt(s^2 / n + s^2)
        return _bounds(difference, [(se, other.df)], level, "runs and one run")
    if baseline.se is None or candidate.se is None:
        return Interval(difference, None, None, "none")
    method = "runs" if repeats else "steps"
    return _bounds(difference, [(baseline.se, baseline.df), (candidate.se, candidate.df)], level, method)


def _bounds(difference: float, errors: list[tuple[float, float]], level: float, method: str) -> Interval:
    """difference +- t x the combined error, the degrees of freedom by Welch-Satterthwaite."""
    variance = sum(se ** 2 for se, _ in errors)
    if variance == 0:  # identical repeats: no spread to widen the interval
        return Interval(difference, difference, difference, method)
    df = variance ** 2 / sum(se ** 4 / df for se, df in errors if se > 0)
    half = t_quantile(0.5 + level / 2, df) * math.sqrt(variance)
    return Interval(difference, difference - half, difference + half, method)
