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

At the end of a run (completed, failed or interrupted) one last exchange takes the steps not yet
reported. A rank may be gone or stuck by then, so it runs on a process group of its own (gloo,
CPU, created at set-up), where it cannot pair with anyone else's collective, and it gives up
after a timeout: the summary then says which steps it lacks.
"""

from __future__ import annotations

import bisect
import logging
import math
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

from nemo_throughput.timing import PHASE_TIMES, StepTimes

COLUMNS = ("step", *StepTimes.VALUES)  # step number, step_s, then the phases (NaN: not observed)
_TOTALS = ("step_s", *PHASE_TIMES, "local_s")  # local = data + forward
_DATA, _FORWARD = COLUMNS.index("data_s"), COLUMNS.index("forward_s")

ENV_FINAL_EXCHANGE_TIMEOUT_S = "NEMO_THROUGHPUT_FINAL_EXCHANGE_TIMEOUT_S"
DEFAULT_FINAL_EXCHANGE_TIMEOUT_S = 10.0  # well inside Slurm's KillWait and Kubernetes' grace period (30 s)

log = logging.getLogger(__name__)


def final_exchange_timeout_s() -> float:
    """Seconds the final exchange waits for the other ranks ($NEMO_THROUGHPUT_FINAL_EXCHANGE_TIMEOUT_S)."""
    text = os.environ.get(ENV_FINAL_EXCHANGE_TIMEOUT_S, "").strip()
    if not text:
        return DEFAULT_FINAL_EXCHANGE_TIMEOUT_S
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"{ENV_FINAL_EXCHANGE_TIMEOUT_S}={text!r}: expected a number of seconds greater than 0 "
                         f"(default {DEFAULT_FINAL_EXCHANGE_TIMEOUT_S:g}); unset it or set e.g. 10.")
    return seconds


def steps_tensor(per_rank: list[list[StepTimes]]) -> torch.Tensor:
    """``[ranks, steps, COLUMNS]`` float64 from each rank's StepTimes."""
    rows = [[[float(s.step), *s.to_floats()] for s in steps] for steps in per_rank]
    steps = len(per_rank[0]) if per_rank else 0
    return torch.tensor(rows, dtype=torch.float64).reshape(len(per_rank), steps, len(COLUMNS))


def step_times(matrix: torch.Tensor, rank: int) -> list[StepTimes]:
    return [StepTimes.from_floats(int(row[0]), row[1:]) for row in matrix[rank].tolist()]


def _split(gathered: torch.Tensor, extras_width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``[ranks, steps * COLUMNS + extras_width]`` -> (``[ranks, steps, COLUMNS]``, ``[ranks, extras_width]``)."""
    ranks, width = gathered.shape
    steps = gathered[:, :width - extras_width]
    return steps.reshape(ranks, steps.shape[1] // len(COLUMNS), len(COLUMNS)), gathered[:, width - extras_width:]


class Gathered:
    """A started all-gather; :meth:`wait` returns ``[ranks, steps, COLUMNS]`` and ``[ranks, extras]``."""

    def __init__(self, wait_fn: Callable[[], torch.Tensor], extras_width: int,
                 settle_fn: Callable[[float], None] | None = None) -> None:
        self._wait_fn = wait_fn
        self._extras_width = extras_width
        self._settle_fn = settle_fn

    def wait(self) -> tuple[torch.Tensor, torch.Tensor]:
        return _split(self._wait_fn(), self._extras_width)

    def settle(self, timeout_s: float) -> bool:
        """Let the collective end, waiting at most ``timeout_s``; False if it did not. A gloo work
        still pending when the interpreter exits holds Python tensors, and tearing those down
        then aborts the process ("terminate called without an active exception")."""
        if self._settle_fn is None:
            return True
        try:
            self._settle_fn(timeout_s)
        except RuntimeError:  # timed out, or a peer closed its connection
            return False
        return True


@dataclass
class FinalSteps:
    """What the final exchange brought: ``[ranks, steps, COLUMNS]`` of the steps after the ones
    already absorbed (None when nothing could be exchanged), what is missing, in words, and the
    ranks that said they were interrupted (a signal) as far as they could be heard."""

    steps: torch.Tensor | None
    missing: str | None
    interrupted_ranks: list[int] = field(default_factory=list)
    sent_through: int | None = None  # last step of this rank's latest all-gather, to log its interval apart
    extras: torch.Tensor | None = None  # ``[ranks, extras]`` as of the end, when the exchange completed

    def intervals(self) -> list[torch.Tensor]:
        """The steps as the live log would have had them: the last all-gather's, then the rest."""
        if self.steps is None:
            return []
        numbers = self.steps[0, :, 0]
        if self.sent_through is None:
            return [self.steps]
        parts = [self.steps[:, numbers <= self.sent_through], self.steps[:, numbers > self.sent_through]]
        return [part for part in parts if part.shape[1]]


class Exchange:
    """All-gathers each rank's :class:`StepTimes`, and a fixed number of other per-rank values
    (``extras``: memory, clocks, a profile's breakdown; NaN where unknown), over the default
    process group (if any).

    Creating one is a collective when distributed (its final-exchange group): every rank must.
    """

    def __init__(self, extras_width: int = 0) -> None:
        self.extras_width = extras_width
        self.distributed = dist.is_available() and dist.is_initialized()
        self.world_size = dist.get_world_size() if self.distributed else 1
        self.rank = dist.get_rank() if self.distributed else 0
        self.nccl = self.distributed and dist.get_backend() == "nccl"
        self.final_timeout_s = final_exchange_timeout_s()
        # This rank's steps of the last two all-gathers: the final exchange sends them again, so
        # that it never waits for one started on the default group (whose peers may be gone).
        self._sent: deque[list[StepTimes]] = deque(maxlen=2)
        self._final_group = self._new_final_group() if self.distributed else None

    def _new_final_group(self) -> dist.ProcessGroup | None:
        # Its timeout is the final exchange's: an abandoned collective also ends then, so that it
        # does not hold up the process's exit.
        try:
            return dist.new_group(backend="gloo", timeout=timedelta(seconds=self.final_timeout_s))
        except (RuntimeError, ValueError) as error:  # gloo unavailable, or its rendezvous failed
            log.warning("nemo-throughput: no process group for the final exchange (%s); if a run ends before "
                        "its last interval is exchanged, the summary will say which steps it lacks.", error)
            return None

    def start(self, steps: list[StepTimes], extras: list[float] | None = None) -> Gathered:
        self._sent.append(steps)
        # One flat list, one tensor: this runs on the training thread at every log step.
        values = [number for s in steps for number in (float(s.step), *s.to_floats())]
        payload = torch.tensor(values + self._extras_list(extras), dtype=torch.float64)
        if not self.distributed:
            return Gathered(lambda: payload.reshape(1, -1), self.extras_width)
        if self.nccl:
            return self._start_nccl(payload)
        gathered = torch.empty((self.world_size, payload.numel()), dtype=torch.float64)
        work = dist.all_gather(list(gathered.unbind(0)), payload, async_op=True)  # into rows of one tensor

        def wait() -> torch.Tensor:
            work.wait()
            return gathered

        def settle(timeout_s: float) -> None:
            work.wait(timeout=timedelta(seconds=timeout_s))

        return Gathered(wait, self.extras_width, settle)

    def _extras_list(self, extras: list[float] | None) -> list[float]:
        values = [math.nan] * self.extras_width if extras is None else extras
        if len(values) != self.extras_width:
            raise ValueError(f"Expected {self.extras_width} per-rank values, got {len(values)}")
        return values

    def _extras_tensor(self, extras: list[float] | None) -> torch.Tensor:
        return torch.tensor(self._extras_list(extras), dtype=torch.float64)

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

        return Gathered(wait, self.extras_width)

    def finish(self, pending: list[StepTimes], absorbed_through: int, interrupted: bool = False,
               extras: list[float] | None = None) -> FinalSteps:
        """Exchange every step after ``absorbed_through`` that every rank finished: the ones of
        the last all-gathers and ``pending``; whether each rank was ``interrupted``; and each
        rank's final ``extras``. Waits at most ``final_timeout_s`` for the others."""
        local = [*(s for sent in self._sent for s in sent), *pending]
        sent_through = self._sent[-1][-1].step if self._sent and self._sent[-1] else None
        self._sent.clear()
        final = self._finish(local, absorbed_through, interrupted, self._extras_tensor(extras))
        final.sent_through = sent_through
        if final.missing is None and self._final_group is not None:
            # Every rank took part, so nothing is pending on it: ours to end, not the process's exit.
            dist.destroy_process_group(self._final_group)
            self._final_group = None
        return final

    def _finish(self, local: list[StepTimes], absorbed_through: int, interrupted: bool,
                extras: torch.Tensor) -> FinalSteps:
        alone = [self.rank] if interrupted else []
        if not self.distributed:
            steps = steps_tensor([[s for s in local if s.step > absorbed_through]])
            return FinalSteps(steps, None, alone, extras=extras.reshape(1, -1))
        if self._final_group is None:
            return FinalSteps(None, f"steps after {absorbed_through}: there was no process group for the final "
                                    "exchange across ranks (see the warning at set-up)", alone)
        deadline = time.monotonic() + self.final_timeout_s
        try:
            return self._finish_across_ranks(local, absorbed_through, interrupted, extras, deadline)
        except RuntimeError as error:  # timed out, or a peer closed its connection
            return FinalSteps(None, f"steps after {absorbed_through}: the final exchange across ranks did not "
                                    f"complete within {self.final_timeout_s:g} s ({error}); a rank did not take "
                                    "part (stopped, killed or stuck)", alone)

    def _finish_across_ranks(self, local: list[StepTimes], absorbed_through: int, interrupted: bool,
                             extras: torch.Tensor, deadline: float) -> FinalSteps:
        numbers = [s.step for s in local]
        consecutive = numbers == list(range(numbers[0], numbers[-1] + 1)) if numbers else True
        first, last = (numbers[0], numbers[-1]) if numbers else (absorbed_through + 1, absorbed_through)
        # 1) What each rank holds; every rank then takes the same decision from the same numbers.
        held = torch.tensor([absorbed_through, first, last, consecutive, interrupted], dtype=torch.float64)
        ranges = self._gather_final(held, deadline).long()
        interrupted_ranks = ranges[:, 4].nonzero().flatten().tolist()
        lowest_absorbed, highest_first = int(ranges[:, 0].min()), int(ranges[:, 1].max())
        common_last = int(ranges[:, 2].min())  # later steps are not finished on every rank: not global steps
        if not bool(ranges[:, 3].all()):
            return FinalSteps(None, f"steps after {absorbed_through}: a rank's remaining steps are not consecutive, "
                                    "so they cannot be lined up across ranks", interrupted_ranks)
        common_first = max(lowest_absorbed + 1, highest_first)
        missing = None
        if common_first > lowest_absorbed + 1 and absorbed_through < common_first - 1:
            missing = (f"steps {absorbed_through + 1}-{common_first - 1}: no longer held by every rank for the final "
                       "exchange")
        # 2) The steps every rank finished, from the oldest one some rank has not absorbed, and the extras.
        rows = [s for s in local if common_first <= s.step <= common_last]
        payload = torch.cat([steps_tensor([rows]).reshape(-1), extras])
        steps, final_extras = _split(self._gather_final(payload, deadline), self.extras_width)
        steps = steps[:, steps[0, :, 0] > absorbed_through] if rows else None
        return FinalSteps(steps, missing, interrupted_ranks, extras=final_extras)

    def _gather_final(self, payload: torch.Tensor, deadline: float) -> torch.Tensor:
        outputs = [torch.empty_like(payload) for _ in range(self.world_size)]
        work = dist.all_gather(outputs, payload, group=self._final_group, async_op=True)
        remaining_s = max(deadline - time.monotonic(), 0.001)
        work.wait(timeout=timedelta(seconds=remaining_s))  # raises RuntimeError when it runs out
        return torch.stack(outputs)


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


class RunStats:
    """All ranks' step times after warm-up, accumulated on every rank in O(steps of the interval).

    Steps in ``excluded`` (first, last) (a profiled window), and steps marked with :meth:`skip` (the
    framework skipped the update: Bridge's ``skipped_iter``), are reported live but left out of the
    statistics, like warm-up steps."""

    def __init__(self, world_size: int, warmup_steps: int, start_step: int = 0,
                 excluded: tuple[int, int] | None = None) -> None:
        self.world_size = world_size
        self.warmup_steps = warmup_steps
        self.start_step = start_step  # global step the run (or its resumption) began at
        self.excluded = excluded
        self.skipped: set[int] = set()
        self.last_step: int | None = None
        self._sorted = SortedValues()  # global step times, for the percentiles
        self._mean = 0.0  # running mean and sum of squared deviations (Welford)
        self._m2 = 0.0
        # Per rank and column of _TOTALS: sum over measured steps, and how many steps observed it.
        self._sums = torch.zeros(world_size, len(_TOTALS), dtype=torch.float64)
        self._counts = torch.zeros(world_size, len(_TOTALS), dtype=torch.float64)
        self._means: list[list[float] | None] = []
        self._means_at = -1  # steps_measured when _means was computed

    def is_warmup(self, step: int) -> bool:
        return step <= self.start_step + self.warmup_steps

    def is_excluded(self, step: int) -> bool:
        return self.excluded is not None and self.excluded[0] <= step <= self.excluded[1]

    def skip(self, step: int) -> None:
        """Leave ``step`` out of the statistics (mark it before its interval is added)."""
        self.skipped.add(step)

    def is_measured(self, step: int) -> bool:
        return not (self.is_warmup(step) or self.is_excluded(step) or step in self.skipped)

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

        keep = torch.tensor([self.is_measured(n) for n in step_numbers])
        measured = values[:, keep]
        for value in global_s[keep].tolist():
            self._sorted.add(value)
            delta = value - self._mean
            self._mean += delta / len(self._sorted)
            self._m2 += delta * (value - self._mean)
        observed = ~measured.isnan()
        self._sums += measured.nan_to_num(0.0).sum(dim=1)
        self._counts += observed.sum(dim=1)

        return self._interval(step_numbers, values, keep)

    def _interval(self, step_numbers: list[int], values: torch.Tensor, keep: torch.Tensor) -> Interval:
        """The live figures: over the counted steps, or over all when none is counted."""
        left_out = len(step_numbers) - int(keep.sum())
        shown = values[:, keep] if left_out < len(step_numbers) else values
        global_s = shown[:, :, 0].max(dim=0).values
        local = shown[:, :, -1]
        straggler_time = (local if not bool(local.isnan().any()) else shown[:, :, 0]).mean(dim=1)
        not_counted = [n for n, kept in zip(step_numbers, keep.tolist(), strict=True) if not kept]
        reasons = (("warm-up", self.is_warmup), ("profiled", self.is_excluded), ("skipped", self.skipped.__contains__))
        return Interval(
            first_step=step_numbers[0],
            last_step=step_numbers[-1],
            step_time_s=float(global_s.mean()),
            max_step_time_s=float(global_s.max()),
            slowest_rank=int(straggler_time.argmax()),
            warmup=self.is_warmup(step_numbers[-1]),
            profiled=any(self.is_excluded(n) for n in step_numbers),
            left_out=left_out,
            left_out_reasons=tuple(word for word, test in reasons if any(test(n) for n in not_counted)),
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
            complete = (self._counts == steps).all(dim=0).tolist() if steps else [False] * len(_TOTALS)
            means = (self._sums / max(steps, 1)).T.tolist()
            self._means = [column if ok else None for column, ok in zip(means, complete, strict=True)]
            self._means_at = steps
        return self._means

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
