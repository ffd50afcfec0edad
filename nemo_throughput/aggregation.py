"""Cross-rank aggregation: one all-gather per log interval, and the statistics over ranks.

Every rank sends the per-step times of the same steps (log steps are the same on all ranks),
so one all-gather of equal-sized vectors on the default process group moves everything: NCCL
on GPU, gloo on CPU. The collective is started on a log step and read on the next one, so
neither the host nor the GPU waits for it. On NCCL the result is copied into pinned host
memory behind an event, so reading it later needs no stream synchronisation either. A world of
one rank (one GPU under a strategy that starts a process group, as NeMo's does) exchanges with
no one: no collective and no copy at its log steps.

What arrives is a tensor ``[ranks, steps, COLUMNS]``; the reporting thread folds it into
:class:`~nemo_throughput.run_stats.RunStats` (plain Python, shared with the importers).

At the end of a run (completed, failed or interrupted) one last exchange takes the steps not yet
reported. A rank may be gone or stuck by then, so it runs on a process group of its own (gloo,
CPU, created at set-up), where it cannot pair with anyone else's collective, and it gives up
after a timeout: the summary then says which steps it lacks.
"""

from __future__ import annotations

import math
import os
import time
from array import array
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

from nemo_throughput import distributed
from nemo_throughput.run_stats import COLUMNS, rank_rows
from nemo_throughput.text import package_logger
from nemo_throughput.timing import StepTimes

__all__ = ["Exchange", "FinalSteps", "Gathered", "step_times", "steps_tensor"]

ENV_FINAL_EXCHANGE_TIMEOUT_S = "NEMO_THROUGHPUT_FINAL_EXCHANGE_TIMEOUT_S"
DEFAULT_FINAL_EXCHANGE_TIMEOUT_S = 10.0  # well inside Slurm's KillWait and Kubernetes' grace period (30 s)
LONGEST_FINAL_EXCHANGE_TIMEOUT_S = 86400.0  # a day: longer is a mistake (and overflows the process group's timeout)

log = package_logger(__name__)


def final_exchange_timeout_s() -> float:
    """Seconds the final exchange waits for the other ranks ($NEMO_THROUGHPUT_FINAL_EXCHANGE_TIMEOUT_S)."""
    text = os.environ.get(ENV_FINAL_EXCHANGE_TIMEOUT_S, "").strip()
    if not text:
        return DEFAULT_FINAL_EXCHANGE_TIMEOUT_S
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and 0 < seconds <= LONGEST_FINAL_EXCHANGE_TIMEOUT_S):
        raise ValueError(f"{ENV_FINAL_EXCHANGE_TIMEOUT_S}={text!r}: expected a number of seconds greater than 0, at "
                         f"most {LONGEST_FINAL_EXCHANGE_TIMEOUT_S:g} (default {DEFAULT_FINAL_EXCHANGE_TIMEOUT_S:g}); "
                         "unset it or set e.g. 10.")
    return seconds


def steps_tensor(per_rank: list[list[StepTimes]]) -> torch.Tensor:
    """``[ranks, steps, COLUMNS]`` float64 from each rank's StepTimes."""
    steps = len(per_rank[0]) if per_rank else 0
    return torch.tensor(rank_rows(per_rank), dtype=torch.float64).reshape(len(per_rank), steps, len(COLUMNS))


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
                 settle_fn: Callable[[float], None] | None = None, local: bool = False) -> None:
        self._wait_fn = wait_fn
        self._extras_width = extras_width
        self._settle_fn = settle_fn
        self._local = local  # no collective: wait_fn only builds the tensor, on whichever thread calls it

    def wait(self) -> tuple[torch.Tensor, torch.Tensor]:
        return _split(self._wait_fn(), self._extras_width)

    def received(self) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
        """Wait for the collective here (cheap, and a failed one raises on the caller's thread);
        the call returned gives what :meth:`wait` does, to be made on another thread. It holds
        the result only: a collective still referenced at interpreter exit aborts the process.
        A world of one's tensor is built by the call returned, off the training thread."""
        extras_width = self._extras_width
        if self._local:
            build = self._wait_fn
            return lambda: _split(build(), extras_width)
        gathered = self._wait_fn()
        return lambda: _split(gathered, extras_width)

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
        self.distributed = distributed.is_up()
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
        if self.world_size == 1:
            extras = self._extras_list(extras)  # checked here, on the caller's thread
            return Gathered(lambda: self._payload(steps, extras).reshape(1, -1), self.extras_width, local=True)
        payload = self._payload(steps, extras)
        if self.nccl:
            return self._start_nccl(payload)
        gathered = torch.empty((self.world_size, payload.numel()), dtype=torch.float64)
        # dist.all_gather, not the group's own allgather (a third cheaper): with that, a rank
        # aborted (std::terminate) within a few hundred log steps of the bench.
        work = dist.all_gather(list(gathered.unbind(0)), payload, async_op=True)  # into rows of one tensor

        def wait() -> torch.Tensor:
            work.wait()
            return gathered

        def settle(timeout_s: float) -> None:
            work.wait(timeout=timedelta(seconds=timeout_s))

        return Gathered(wait, self.extras_width, settle)

    def _payload(self, steps: list[StepTimes], extras: list[float] | None) -> torch.Tensor:
        """``steps * COLUMNS + extras_width`` float64, at every log step (a world of one's on the
        reporting thread): the values go into a C array, copied into the tensor at once (half of
        torch.tensor's cost over a list). Copied, not shared: a tensor over Python memory needs the
        interpreter to be freed, and the collective's own thread frees it, at exit too (std::terminate)."""
        values = array("d", [math.nan if value is None else value for s in steps for value in s])  # COLUMNS
        values.extend(self._extras_list(extras))
        return torch.frombuffer(values, dtype=torch.float64).clone() if values else torch.empty(0, dtype=torch.float64)

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
        # Into the rows of one tensor: no list of outputs, no stack (a kernel and a copy) after it.
        gathered = torch.empty((self.world_size, payload.numel()), dtype=torch.float64, device=device)
        work = dist.all_gather_into_tensor(gathered, sent, async_op=True)
        work.wait()  # makes the current stream wait for NCCL; the host does not block
        host_out = torch.empty((self.world_size, payload.numel()), dtype=torch.float64, pin_memory=True)
        host_out.copy_(gathered, non_blocking=True)
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
        if self.world_size == 1:
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
