"""Cross-rank aggregation: one all-gather per log interval, and the statistics over ranks.

Every rank sends the per-step times of the same steps (log steps are the same on all ranks),
so one all-gather of equal-sized vectors on the default process group moves everything: NCCL
on GPU, gloo on CPU. The collective is started on a log step and read on the next one, so neither the
host nor the GPU waits for it. On NCCL the result is copied into pinned host memory behind an
event, so reading it later needs no stream synchronisation either.

The global time of a step is the slowest rank's. In synchronous data-parallel training all
ranks' step periods are equal (the gradient all-reduce lines them up), so the straggler is
found from the part of the step a rank spends before its first collective (data + forward).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from nemo_throughput.timing import PHASE_TIMES, StepTimes

_ROW = 1 + len(StepTimes.VALUES)  # step number, then the durations


class Gathered:
    """A started all-gather; :meth:`wait` returns every rank's steps."""

    def __init__(self, wait_fn: Callable[[], list[list[float]]]) -> None:
        self._wait_fn = wait_fn

    def wait(self) -> list[list[StepTimes]]:
        return [_decode(row) for row in self._wait_fn()]


class Exchange:
    """All-gathers each rank's :class:`StepTimes` over the default process group (if any)."""

    def __init__(self) -> None:
        self.distributed = dist.is_available() and dist.is_initialized()
        self.world_size = dist.get_world_size() if self.distributed else 1
        self.rank = dist.get_rank() if self.distributed else 0
        self.nccl = self.distributed and dist.get_backend() == "nccl"

    def start(self, steps: list[StepTimes]) -> Gathered:
        payload = _encode(steps)
        if not self.distributed:
            return Gathered(lambda: [payload])
        if self.nccl:
            return self._start_nccl(payload)
        tensor = torch.tensor(payload, dtype=torch.float64)
        outputs = [torch.empty_like(tensor) for _ in range(self.world_size)]
        work = dist.all_gather(outputs, tensor, async_op=True)

        def wait() -> list[list[float]]:
            work.wait()
            return [out.tolist() for out in outputs]

        return Gathered(wait)

    def _start_nccl(self, payload: list[float]) -> Gathered:
        device = torch.device("cuda", torch.cuda.current_device())
        host_in = torch.tensor(payload, dtype=torch.float64).pin_memory()
        sent = host_in.to(device, non_blocking=True)
        outputs = [torch.empty_like(sent) for _ in range(self.world_size)]
        work = dist.all_gather(outputs, sent, async_op=True)
        work.wait()  # makes the current stream wait for NCCL; the host does not block
        host_out = torch.empty((self.world_size, len(payload)), dtype=torch.float64, pin_memory=True)
        host_out.copy_(torch.stack(outputs), non_blocking=True)
        copied = torch.cuda.Event()
        copied.record()

        def wait() -> list[list[float]]:
            copied.synchronize()  # recorded an interval ago: long complete
            assert host_in.is_pinned()  # referenced here so it outlives the asynchronous copy
            return host_out.tolist()

        return Gathered(wait)


def _encode(steps: list[StepTimes]) -> list[float]:
    values = [float(len(steps))]
    for s in steps:
        values.append(float(s.step))
        values.extend(s.to_floats())
    return values


def _decode(row: list[float]) -> list[StepTimes]:
    count = int(row[0])
    rows = (row[1 + i * _ROW:1 + (i + 1) * _ROW] for i in range(count))
    return [StepTimes.from_floats(int(r[0]), r[1:]) for r in rows]


@dataclass
class Interval:
    """Statistics of the steps of one exchange, for the live log line and loggers."""

    first_step: int
    last_step: int
    step_time_s: float  # mean over steps of the slowest rank's time
    max_step_time_s: float
    slowest_rank: int
    warmup: bool


@dataclass
class _RankTotals:
    steps: int = 0
    step_s: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)  # phase -> sum over the steps observing it
    phase_steps: dict[str, int] = field(default_factory=dict)  # phase -> number of those steps


class RunStats:
    """Accumulates all ranks' step times after warm-up, on every rank."""

    def __init__(self, world_size: int, warmup_steps: int, start_step: int = 0) -> None:
        self.world_size = world_size
        self.warmup_steps = warmup_steps
        self.start_step = start_step  # global step the run (or its resumption) began at
        self.step_time_s: list[float] = []  # slowest rank's time per measured step
        self.last_step: int | None = None
        self._ranks = [_RankTotals() for _ in range(world_size)]

    def add(self, per_rank: list[list[StepTimes]]) -> Interval | None:
        if len(per_rank) != self.world_size:
            raise ValueError(f"Expected steps from {self.world_size} ranks, got {len(per_rank)}")
        steps = [s.step for s in per_rank[0]]
        for rank, rows in enumerate(per_rank):
            if [s.step for s in rows] != steps:
                raise RuntimeError(
                    f"Rank {rank} reported steps {[s.step for s in rows]} but rank 0 reported {steps}; "
                    "the throughput callback must see the same optimizer steps on every rank."
                )
        if not steps:
            return None
        self.last_step = steps[-1]
        global_times = [max(rows[i].step_s for rows in per_rank) for i in range(len(steps))]
        for i, step in enumerate(steps):
            if self.is_warmup(step):
                continue
            self.step_time_s.append(global_times[i])
            for totals, rows in zip(self._ranks, per_rank, strict=True):
                row = rows[i]
                totals.steps += 1
                totals.step_s += row.step_s
                for name in (*PHASE_TIMES, "local_s"):
                    value = getattr(row, name)
                    if value is not None:
                        totals.phases[name] = totals.phases.get(name, 0.0) + value
                        totals.phase_steps[name] = totals.phase_steps.get(name, 0) + 1
        interval_rank_time = [
            statistics.fmean(_straggler_time(row) for row in rows) for rows in per_rank
        ]
        return Interval(
            first_step=steps[0],
            last_step=steps[-1],
            step_time_s=statistics.fmean(global_times),
            max_step_time_s=max(global_times),
            slowest_rank=_argmax(interval_rank_time),
            warmup=self.is_warmup(steps[-1]),
        )

    def is_warmup(self, step: int) -> bool:
        return step <= self.start_step + self.warmup_steps

    @property
    def steps_measured(self) -> int:
        return len(self.step_time_s)

    def mean_step_time_s(self) -> float | None:
        return statistics.fmean(self.step_time_s) if self.step_time_s else None

    def step_time_summary(self) -> dict[str, float] | None:
        """mean/median/min/max/p90/std of the global step time over measured steps."""
        times = self.step_time_s
        if not times:
            return None
        return {
            "mean": statistics.fmean(times),
            "median": statistics.median(times),
            "min": min(times),
            "max": max(times),
            "p90": _percentile(times, 90),
            "std": statistics.stdev(times) if len(times) > 1 else 0.0,
        }

    def per_rank_step_time_s(self) -> list[float | None]:
        return [t.step_s / t.steps if t.steps else None for t in self._ranks]

    def per_rank_phase_s(self, name: str) -> list[float] | None:
        """Mean of one phase per rank, or None unless every rank observed it on every step."""
        means = []
        for t in self._ranks:
            if not t.steps or t.phase_steps.get(name) != t.steps:
                return None
            means.append(t.phases[name] / t.steps)
        return means

    def straggler(self) -> dict[str, object] | None:
        """The slowest rank, the metric used to find it, and how far it is above the median rank."""
        if not self.steps_measured:
            return None
        metric, values = "local_time_s", self.per_rank_phase_s("local_s")
        if values is None:
            metric, values = "step_time_s", self.per_rank_step_time_s()
        slowest = _argmax(values)
        typical = statistics.median(values)
        return {
            "rank": slowest,
            "metric": metric,
            "excess_pct": 100.0 * (values[slowest] / typical - 1.0) if typical > 0 else 0.0,
        }


def _straggler_time(row: StepTimes) -> float:
    local = row.local_s
    return row.step_s if local is None else local


def _argmax(values: list[float]) -> int:
    return max(range(len(values)), key=lambda i: values[i])


def _percentile(values: list[float], pct: float) -> float:
    """Linear interpolation between closest ranks (numpy's default method)."""
    ordered = sorted(values)
    position = (len(ordered) - 1) * pct / 100.0
    lower = math.floor(position)
    upper = min(lower + 1, len(ordered) - 1)
    return ordered[lower] + (ordered[upper] - ordered[lower]) * (position - lower)
