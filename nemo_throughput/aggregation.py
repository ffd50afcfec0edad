"""Cross-rank aggregation: one all-gather per log interval, and the statistics over ranks.

Every rank sends the per-step times of the same steps (log steps are the same on all ranks),
so one all-gather of equal-sized vectors on the default process group moves everything: NCCL
on GPU, gloo on CPU. The collective is started on a log step and read on the next one, so
neither the host nor the GPU waits for it. On NCCL the result is copied into pinned host
memory behind an event, so reading it later needs no stream synchronisation either.

What arrives is a tensor ``[ranks, steps, COLUMNS]``; the statistics are updated from it with
tensor operations and running sums, so a log step costs the same at step 100 and at step
100,000, and on 8 ranks or 8,000.

The global time of a step is the slowest rank's. In synchronous data-parallel training all
ranks' step periods are equal (the gradient all-reduce lines them up), so the straggler is
found from the part of the step a rank spends before its first collective (data + forward).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from nemo_throughput.timing import PHASE_TIMES, StepTimes

COLUMNS = ("step", *StepTimes.VALUES)  # step number, step_s, then the phases (NaN: not observed)
_TOTALS = ("step_s", *PHASE_TIMES, "local_s")  # local = data + forward
_DATA, _FORWARD = COLUMNS.index("data_s"), COLUMNS.index("forward_s")


def steps_tensor(per_rank: list[list[StepTimes]]) -> torch.Tensor:
    """``[ranks, steps, COLUMNS]`` float64 from each rank's StepTimes."""
    rows = [[[float(s.step), *s.to_floats()] for s in steps] for steps in per_rank]
    steps = len(per_rank[0]) if per_rank else 0
    return torch.tensor(rows, dtype=torch.float64).reshape(len(per_rank), steps, len(COLUMNS))


def step_times(matrix: torch.Tensor, rank: int) -> list[StepTimes]:
    return [StepTimes.from_floats(int(row[0]), row[1:]) for row in matrix[rank].tolist()]


class Gathered:
    """A started all-gather; :meth:`wait` returns ``[ranks, steps, COLUMNS]``."""

    def __init__(self, wait_fn: Callable[[], torch.Tensor]) -> None:
        self._wait_fn = wait_fn

    def wait(self) -> torch.Tensor:
        gathered = self._wait_fn()
        return gathered.reshape(gathered.shape[0], gathered.shape[1] // len(COLUMNS), len(COLUMNS))


class Exchange:
    """All-gathers each rank's :class:`StepTimes` over the default process group (if any)."""

    def __init__(self) -> None:
        self.distributed = dist.is_available() and dist.is_initialized()
        self.world_size = dist.get_world_size() if self.distributed else 1
        self.rank = dist.get_rank() if self.distributed else 0
        self.nccl = self.distributed and dist.get_backend() == "nccl"

    def start(self, steps: list[StepTimes]) -> Gathered:
        payload = steps_tensor([steps]).reshape(-1)
        if not self.distributed:
            return Gathered(lambda: payload.reshape(1, -1))
        if self.nccl:
            return self._start_nccl(payload)
        outputs = [torch.empty_like(payload) for _ in range(self.world_size)]
        work = dist.all_gather(outputs, payload, async_op=True)

        def wait() -> torch.Tensor:
            work.wait()
            return torch.stack(outputs)

        return Gathered(wait)

    def _start_nccl(self, payload: torch.Tensor) -> Gathered:
        device = torch.device("cuda", torch.cuda.current_device())
        host_in = payload.pin_memory()
        sent = host_in.to(device, non_blocking=True)
        outputs = [torch.empty_like(sent) for _ in range(self.world_size)]
        work = dist.all_gather(outputs, sent, async_op=True)
        work.wait()  # makes the current stream wait for NCCL; the host does not block
        host_out = torch.empty((self.world_size, payload.numel()), dtype=torch.float64, pin_memory=True)
        host_out.copy_(torch.stack(outputs), non_blocking=True)
        copied = torch.cuda.Event()
        copied.record()

        def wait() -> torch.Tensor:
            copied.synchronize()  # recorded an interval ago: long complete
            assert host_in.is_pinned()  # referenced here so it outlives the asynchronous copy
            return host_out

        return Gathered(wait)


@dataclass
class Interval:
    """Statistics of the steps of one exchange, for the live log line and loggers."""

    first_step: int
    last_step: int
    step_time_s: float  # mean over steps of the slowest rank's time
    max_step_time_s: float
    slowest_rank: int
    warmup: bool


class RunStats:
    """All ranks' step times after warm-up, accumulated on every rank in O(steps of the interval)."""

    def __init__(self, world_size: int, warmup_steps: int, start_step: int = 0) -> None:
        self.world_size = world_size
        self.warmup_steps = warmup_steps
        self.start_step = start_step  # global step the run (or its resumption) began at
        self.last_step: int | None = None
        self._sorted: list[float] = []  # global step times, kept sorted for the percentiles
        self._mean = 0.0  # running mean and sum of squared deviations (Welford)
        self._m2 = 0.0
        # Per rank and column of _TOTALS: sum over measured steps, and how many steps observed it.
        self._sums = torch.zeros(world_size, len(_TOTALS), dtype=torch.float64)
        self._counts = torch.zeros(world_size, len(_TOTALS), dtype=torch.float64)
        self._means: list[list[float] | None] = []
        self._means_at = -1  # steps_measured when _means was computed

    def is_warmup(self, step: int) -> bool:
        return step <= self.start_step + self.warmup_steps

    def add(self, steps: torch.Tensor) -> Interval | None:
        """Take ``[ranks, steps, COLUMNS]``; return the interval's statistics (None if empty)."""
        if steps.shape[0] != self.world_size:
            raise ValueError(f"Expected steps from {self.world_size} ranks, got {steps.shape[0]}")
        numbers = steps[:, :, 0]
        if not torch.equal(numbers, numbers[:1].expand_as(numbers)):
            rank = int((numbers != numbers[:1]).any(dim=1).nonzero()[0])
            raise RuntimeError(
                f"Rank {rank} reported steps {numbers[rank].long().tolist()} but rank 0 reported "
                f"{numbers[0].long().tolist()}; the throughput callback must see the same optimizer steps on "
                "every rank."
            )
        if steps.shape[1] == 0:
            return None
        step_numbers = [int(n) for n in numbers[0].tolist()]
        self.last_step = step_numbers[-1]
        # Columns after the step number, plus local = data + forward: [ranks, steps, 6].
        values = torch.cat([steps[:, :, 1:], steps[:, :, _DATA:_DATA + 1] + steps[:, :, _FORWARD:_FORWARD + 1]], dim=2)
        global_s = values[:, :, 0].max(dim=0).values

        first_measured = next((i for i, n in enumerate(step_numbers) if not self.is_warmup(n)), len(step_numbers))
        measured = values[:, first_measured:]  # warm-up steps come first
        for value in global_s[first_measured:].tolist():
            bisect.insort(self._sorted, value)
            delta = value - self._mean
            self._mean += delta / len(self._sorted)
            self._m2 += delta * (value - self._mean)
        observed = ~measured.isnan()
        self._sums += measured.nan_to_num(0.0).sum(dim=1)
        self._counts += observed.sum(dim=1)

        local = values[:, :, -1]
        straggler_time = (local if not bool(local.isnan().any()) else values[:, :, 0]).mean(dim=1)
        return Interval(
            first_step=step_numbers[0],
            last_step=step_numbers[-1],
            step_time_s=float(global_s.mean()),
            max_step_time_s=float(global_s.max()),
            slowest_rank=int(straggler_time.argmax()),
            warmup=self.is_warmup(step_numbers[-1]),
        )

    @property
    def steps_measured(self) -> int:
        return len(self._sorted)

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
            "max": times[-1],
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
            complete = (self._counts == steps).all(dim=0).tolist() if steps else [False] * len(_TOTALS)
            means = (self._sums / max(steps, 1)).T.tolist()
            self._means = [column if ok else None for column, ok in zip(means, complete, strict=True)]
            self._means_at = steps
        return self._means

    def straggler(self) -> dict[str, object] | None:
        """The slowest rank, the metric used to find it, and how far it is above the median rank."""
        if not self.steps_measured:
            return None
        metric, values = "local_time_s", self.per_rank_phase_s("local_s")
        if values is None:
            metric, values = "step_time_s", self.per_rank_step_time_s()
        slowest = max(range(len(values)), key=lambda i: values[i])
        typical = _percentile(sorted(values), 50)
        return {
            "rank": slowest,
            "metric": metric,
            "excess_pct": 100.0 * (values[slowest] / typical - 1.0) if typical > 0 else 0.0,
        }


def _percentile(ordered: list[float], pct: float) -> float:
    """Linear interpolation between closest ranks (numpy's default method) of sorted values."""
    position = (len(ordered) - 1) * pct / 100.0
    lower = math.floor(position)
    upper = min(lower + 1, len(ordered) - 1)
    return ordered[lower] + (ordered[upper] - ordered[lower]) * (position - lower)
