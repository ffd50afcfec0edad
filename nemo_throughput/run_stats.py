"""Run statistics over every rank's step times, in plain Python floats (no torch).

The callback and ``nemo-throughput import`` count steps with this one arithmetic; without torch,
`import` starts in a fraction of a second instead of seconds. An interval arrives as rows
``[rank][step] = [step, step_s, logging_s, data_s, forward_s, backward_s, optimizer_s, ...]`` (:data:`COLUMNS`,
seconds; NaN: phase not observed); the callback converts its gathered tensor once
(``tensor.tolist()``), the importers build the rows with :func:`rank_rows`.

Running sums and a chunked sorted list keep an interval's cost O(ranks x steps of the interval):
the same at step 100 and at step 100,000.

The global time of a step is the slowest rank's. In synchronous data-parallel training all
ranks' step periods are equal (the gradient all-reduce lines them up), so the straggler is
found from the part of the step a rank spends before its first collective (data + forward).

An outlier step is a measured step longer than ``OUTLIER_FACTOR`` times the median step and at
least ``OUTLIER_EXCESS_S`` over it (a checkpoint save, a garbage-collection pause, a profiler, a
slow file system). The mean still counts it, as the wall time does; the summary names them.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from nemo_throughput.timing import PHASE_TIMES, StepTimes

COLUMNS = ("step", *StepTimes.VALUES)  # step number, step_s, the phases, the batch counts (NaN: not observed)
_TOTALS = (*StepTimes.VALUES, "local_s")  # local = data + forward
_DATA, _FORWARD = COLUMNS.index("data_s"), COLUMNS.index("forward_s")

Rows = Sequence[Sequence[Sequence[float]]]  # [rank][step][COLUMNS]
OUTLIER_FACTOR, OUTLIER_EXCESS_S = 3.0, 1.0  # an outlier: over 3 x the median step and 1 s over it
LONGEST_KEPT = 16  # the longest measured steps kept to name the outliers among them


def rank_rows(per_rank: list[list[StepTimes]]) -> list[list[list[float]]]:
    """``[rank][step][COLUMNS]`` from each rank's StepTimes."""
    return [[[float(s.step), *s.to_floats()] for s in steps] for steps in per_rank]


@dataclass
class Interval:
    """Statistics of the steps of one exchange, for the live log line and loggers.

    The figures are over the interval's counted steps (those the run statistics take); only an
    interval with none (all warm-up, say) is described by all its steps, and says so."""

    first_step: int
    last_step: int
    step_time_s: float  # mean over steps of the slowest rank's time
    max_step_time_s: float
    slowest_rank: int
    warmup: bool  # every step of it is warm-up
    profiled: bool = False  # overlaps the profiled steps (left out of the statistics)
    left_out: int = 0  # steps of it not counted (warm-up, profiled, skipped)
    left_out_reasons: tuple[str, ...] = ()  # why, in words ("warm-up", "profiled", "skipped")
    phases_s: dict[str, float | None] = field(default_factory=dict)  # PHASE_TIMES: means over its steps and ranks
    measured_step_s: tuple[float, ...] = ()  # the global time of each of its steps the statistics take
    # Per rank, the mean time that names the straggler: local (data + forward) where every rank
    # observed it, else step time; which one is ``straggler_metric`` ("local_time_s", "step_time_s").
    rank_straggler_s: tuple[float, ...] = ()
    straggler_metric: str = "step_time_s"


class RunStats:
    """All ranks' step times after warm-up, accumulated on every rank in O(steps of the interval).

    Steps in ``excluded`` (first, last) (a profiled window), and steps marked with :meth:`skip` (the
    framework skipped the update: Bridge's ``skipped_iter``), are reported live but left out of the
    statistics, like warm-up steps."""

    def __init__(self, world_size: int, warmup_steps: int, start_step: int = 0,
                 excluded: tuple[int, int] | None = None, ramp_steps: int = 0) -> None:
        """``ramp_steps``: steps 1 to it train a batch-size ramp's smaller batches: warm-up too."""
        self.world_size = world_size
        self.warmup_steps = warmup_steps
        self.start_step = start_step  # global step the run (or its resumption) began at
        self._warm_through = max(start_step + warmup_steps, ramp_steps)  # the last warm-up step
        self.excluded = excluded
        self.skipped: set[int] = set()
        self.last_step: int | None = None
        self._sorted = SortedValues()  # global step times, for the percentiles
        self._mean = 0.0  # running mean and sum of squared deviations (Welford)
        self._m2 = 0.0
        # Per rank and column of _TOTALS: sum over measured steps, and how many steps observed it.
        self._sums = [[0.0] * len(_TOTALS) for _ in range(world_size)]
        self._counts = [[0] * len(_TOTALS) for _ in range(world_size)]
        self._means: list[list[float] | None] = []
        self._means_at = -1  # steps_measured when _means was computed
        self._longest: list[tuple[float, int, str | None]] = []  # min-heap: (global s, step, phase)

    def is_warmup(self, step: int) -> bool:
        return step <= self._warm_through

    def is_excluded(self, step: int) -> bool:
        return self.excluded is not None and self.excluded[0] <= step <= self.excluded[1]

    def skip(self, step: int) -> None:
        """Leave ``step`` out of the statistics (mark it before its interval is added)."""
        self.skipped.add(step)

    def is_measured(self, step: int) -> bool:
        return not (self.is_warmup(step) or self.is_excluded(step) or step in self.skipped)

    def add(self, steps: Rows | Any) -> Interval | None:
        """Take ``[rank][step][COLUMNS]`` (nested sequences, or a tensor of that shape, converted
        once); return the interval's statistics (None if empty)."""
        rows = steps.tolist() if hasattr(steps, "tolist") else steps
        if len(rows) != self.world_size:
            raise ValueError(f"Expected steps from {self.world_size} ranks, got {len(rows)}")
        numbers = [[row[0] for row in rank] for rank in rows]
        for rank, reported in enumerate(numbers):
            if reported != numbers[0]:
                raise RuntimeError(
                    f"Rank {rank} reported steps {[int(n) for n in reported]} but rank 0 reported "
                    f"{[int(n) for n in numbers[0]]}; the throughput callback must see the same optimizer steps on "
                    "every rank."
                )
        if not numbers[0]:
            return None
        step_numbers = [int(n) for n in numbers[0]]
        self.last_step = step_numbers[-1]
        # Per rank and step: the columns after the step number, plus local = data + forward.
        values = [[[*row[1:], row[_DATA] + row[_FORWARD]] for row in rank] for rank in rows]
        global_s = [max(rank[index][0] for rank in values) for index in range(len(step_numbers))]
        keep = [self.is_measured(n) for n in step_numbers]
        for index, (value, kept) in enumerate(zip(global_s, keep, strict=True)):
            if kept:
                self._sorted.add(value)
                delta = value - self._mean
                self._mean += delta / len(self._sorted)
                self._m2 += delta * (value - self._mean)
                self._keep_if_longest(value, step_numbers[index], values, index)
        for rank_values, sums, counts in zip(values, self._sums, self._counts, strict=True):
            measured = [row for row, kept in zip(rank_values, keep, strict=True) if kept]
            for column in range(len(_TOTALS)):
                observed = [row[column] for row in measured if not math.isnan(row[column])]
                sums[column] += sum(observed)
                counts[column] += len(observed)
        return self._interval(step_numbers, values, global_s, keep)

    def _interval(self, step_numbers: list[int], values: list[list[list[float]]], global_s: list[float],
                  keep: list[bool]) -> Interval:
        """The live figures: over the counted steps, or over all when none is counted."""
        left_out = keep.count(False)
        shown = [i for i, kept in enumerate(keep) if kept] if left_out < len(keep) else range(len(keep))
        shown_global_s = [global_s[i] for i in shown]
        local_observed = not any(math.isnan(rank[i][-1]) for rank in values for i in shown)
        column = -1 if local_observed else 0  # local time names the straggler; step time where not observed
        straggler_time = [sum(rank[i][column] for i in shown) / len(shown) for rank in values]
        not_counted = [n for n, kept in zip(step_numbers, keep, strict=True) if not kept]
        reasons = (("warm-up", self.is_warmup), ("profiled", self.is_excluded), ("skipped", self.skipped.__contains__))
        return Interval(
            first_step=step_numbers[0],
            last_step=step_numbers[-1],
            step_time_s=sum(shown_global_s) / len(shown_global_s),
            max_step_time_s=max(shown_global_s),
            slowest_rank=max(range(len(straggler_time)), key=straggler_time.__getitem__),
            warmup=self.is_warmup(step_numbers[-1]),
            profiled=any(self.is_excluded(n) for n in step_numbers),
            left_out=left_out,
            left_out_reasons=tuple(word for word, test in reasons if any(test(n) for n in not_counted)),
            phases_s={name: _mean_observed([rank[i][_TOTALS.index(name)] for rank in values for i in shown])
                      for name in PHASE_TIMES},
            measured_step_s=tuple(seconds for seconds, kept in zip(global_s, keep, strict=True) if kept),
            rank_straggler_s=tuple(straggler_time),
            straggler_metric="local_time_s" if local_observed else "step_time_s",
        )

    def _keep_if_longest(self, value: float, step: int, values: list[list[list[float]]], index: int) -> None:
        """Keep the step among the longest, with its longest phase on any rank: a rank's long data wait
        (or forward) holds the others in the gradient all-reduce (their backward), for less time."""
        if len(self._longest) == LONGEST_KEPT and value <= self._longest[0][0]:
            return
        phases = [(rank[index][1 + i], name) for rank in values for i, name in enumerate(PHASE_TIMES)
                  if not math.isnan(rank[index][1 + i])]
        phase = max(phases)[1].removesuffix("_s") if phases else None
        entry = (value, step, phase)
        if len(self._longest) < LONGEST_KEPT:
            heapq.heappush(self._longest, entry)
        else:
            heapq.heapreplace(self._longest, entry)

    def outliers(self, shown: int = 10) -> tuple[int, list[dict[str, Any]]]:
        """(how many measured steps are outliers, the ``shown`` longest of them: step, step_time_s and
        the phase that held most of the time where the marks say, None where they do not)."""
        if not self._sorted:
            return 0, []
        median = _percentile(self._sorted, 50)
        threshold = max(OUTLIER_FACTOR * median, median + OUTLIER_EXCESS_S)
        count = self._sorted.count_above(threshold)
        named = sorted((entry for entry in self._longest if entry[0] > threshold), reverse=True)[:shown]
        return count, [{"step": step, "step_time_s": seconds, "phase": phase} for seconds, step, phase in named]

    @property
    def steps_measured(self) -> int:
        return len(self._sorted)

    def median_step_time_s(self) -> float | None:
        return _percentile(self._sorted, 50) if self._sorted else None

    def mean_step_time_s(self) -> float | None:
        return self._mean if self._sorted else None

    def step_time_summary(self) -> dict[str, float] | None:
        """mean/median/min/max/p90/std of the global step time over measured steps."""
        times = self._sorted
        if not times:
            return None
        return {
            "mean": self._mean,
            "median": _percentile(times, 50),
            "min": times[0],
            "max": times[len(times) - 1],
            "p90": _percentile(times, 90),
            "std": math.sqrt(self._m2 / (len(times) - 1)) if len(times) > 1 else 0.0,
        }

    def per_rank_step_time_s(self) -> list[float] | None:
        return self.per_rank_phase_s("step_s")

    def per_rank_phase_s(self, name: str) -> list[float] | None:
        """Mean of one phase (or step_s) per rank; None unless every rank observed it on every step."""
        return self._per_rank_means()[_TOTALS.index(name)]

    def _per_rank_means(self) -> list[list[float] | None]:
        """Per column of _TOTALS, every rank's mean (None where not observed on every step); cached."""
        steps = len(self._sorted)
        if self._means_at != steps:
            complete = [bool(steps) and all(counts[column] == steps for counts in self._counts)
                        for column in range(len(_TOTALS))]
            means = [[sums[column] / max(steps, 1) for sums in self._sums] for column in range(len(_TOTALS))]
            self._means = [column if ok else None for column, ok in zip(means, complete, strict=True)]
            self._means_at = steps
        return self._means

    def counted_per_step(self, name: str) -> list[float] | None:
        """A batch count (timing.BATCH_COUNTS) per measured step, one mean for each rank that
        counted it on every measured step; None unless every other rank counted it on none (ranks
        with no batch, like middle pipeline stages, count nothing) and one rank counted it."""
        column, steps = _TOTALS.index(name), len(self._sorted)
        observed = [counts[column] for counts in self._counts]
        if not steps or any(count not in (0, steps) for count in observed) or steps not in observed:
            return None
        return [sums[column] / steps for sums, count in zip(self._sums, observed, strict=True) if count]

    def straggler(self) -> dict[str, object] | None:
        """The slowest rank by the time it spends before its first collective (data + forward:
        the all-reduce makes every rank's step equally long, so step time cannot name it), how
        far it is above the median rank, the spread over ranks, and how long the median rank
        waits for it per step at the gradient reduction (the difference of the two)."""
        if not self.steps_measured:
            return None
        metric, values = "local_time_s", self.per_rank_phase_s("local_s")
        if values is None:
            metric, values = "step_time_s", self.per_rank_step_time_s()
        slowest = max(range(len(values)), key=lambda i: values[i])
        ordered = sorted(values)
        typical = _percentile(ordered, 50)
        return {
            "rank": slowest,
            "metric": metric,
            "excess_pct": 100.0 * (values[slowest] / typical - 1.0) if typical > 0 else 0.0,
            "spread_s": {"min": ordered[0], "median": typical, "max": ordered[-1]},
            "others_wait_s": values[slowest] - typical if metric == "local_time_s" else None,
        }


def _mean_observed(values: list[float]) -> float | None:
    """The mean, None when any value was not observed (NaN)."""
    return None if not values or any(math.isnan(v) for v in values) else sum(values) / len(values)


class SortedValues:
    """Floats kept in order, in chunks: adding one costs the same after 100 steps as after
    1,000,000 (one sorted list would move all the larger values on every insertion)."""

    CHUNK = 512  # a chunk is split in two when it reaches twice this

    def __init__(self) -> None:
        self._chunks: list[list[float]] = []
        self._maxes: list[float] = []  # each chunk's largest value
        self._length = 0

    def add(self, value: float) -> None:
        self._length += 1
        if not self._chunks:
            self._chunks.append([value])
            self._maxes.append(value)
            return
        index = min(bisect.bisect_left(self._maxes, value), len(self._chunks) - 1)
        chunk = self._chunks[index]
        bisect.insort(chunk, value)
        self._maxes[index] = chunk[-1]
        if len(chunk) >= 2 * self.CHUNK:
            self._chunks[index:index + 1] = [chunk[:self.CHUNK], chunk[self.CHUNK:]]
            self._maxes[index:index + 1] = [chunk[self.CHUNK - 1], chunk[-1]]

    def __len__(self) -> int:
        return self._length

    def count_above(self, threshold: float) -> int:
        """How many values are greater than ``threshold``."""
        index = bisect.bisect_right(self._maxes, threshold)  # chunks before it hold none above
        if index == len(self._chunks):
            return 0
        above = len(self._chunks[index]) - bisect.bisect_right(self._chunks[index], threshold)
        return above + sum(len(chunk) for chunk in self._chunks[index + 1:])

    def __getitem__(self, position: int) -> float:
        """The value at ``position`` (0: the smallest) in the order."""
        if not 0 <= position < self._length:
            raise IndexError(position)
        for chunk in self._chunks:
            if position < len(chunk):
                return chunk[position]
            position -= len(chunk)
        raise IndexError(position)


def _percentile(ordered: list[float] | SortedValues, pct: float) -> float:
    """Linear interpolation between closest ranks (numpy's default method) of sorted values."""
    position = (len(ordered) - 1) * pct / 100.0
    lower = math.floor(position)
    upper = min(lower + 1, len(ordered) - 1)
    return ordered[lower] + (ordered[upper] - ordered[lower]) * (position - lower)
