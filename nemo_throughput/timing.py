"""Per-step timing that never stalls the device.

One step is one optimizer step, measured from the end of the previous step to the end of this
one, so data loading and the optimizer are inside it: this is "seconds per step" as the
benchmark literature uses it. Inside the step, marks split it into phases:

    previous end -> logged ....... logging: our own log step's work after the previous step (the
                                   exchange, the loggers' and trackers' calls); 0 on other steps
    logged (or previous end)
           -> start .............. data: waiting for the first micro-batch
    start -> backward ............ forward: all forward work (and, with gradient accumulation,
                                   the local backward of earlier micro-batches)
    backward -> optimizer ........ backward of the last micro-batch, including the gradient
                                   all-reduce wait under DDP
    optimizer -> end ............. optimizer step

Marks come from a :class:`Clock`. On CUDA a mark is an event recorded on the current stream;
it is read only when the timer is asked to (on log steps), only if it is at least one step
old, and after it completed: the host waits, if at all, for a step the GPU has normally
finished already while the next step is still queued, so the GPU never idles for us. Events are
taken from a pool and given back once read: a step records events, it creates and destroys none
(after the first log interval).
"""

from __future__ import annotations

import math
import time
from collections import deque
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

if TYPE_CHECKING:
    import torch

# The marks inside a step, slots of its list of marks (an index costs less than a key on the hot path).
LOGGED, START, BACKWARD, OPTIMIZER = range(4)
PHASE_TIMES = ("logging_s", "data_s", "forward_s", "backward_s", "optimizer_s")  # durations between the marks
# What one rank's micro-batches of a step held, where they were counted (batches.TokenCounter):
# real tokens, token slots (padding included) and the sum over sequences of length squared.
BATCH_COUNTS = ("tokens", "slots", "seqlen_sq")
# What the checks of those micro-batches found (batch_checks): how many were bad, and the bitmask of
# their problems (batch_checks.PROBLEMS); exchanged with the counts so that every rank learns of them.
BATCH_CHECKS = ("bad_batches", "batch_problems")


class Clock(Protocol):
    """Source of marks; ``seconds`` may only be called on marks for which ``ready`` is true."""

    def mark(self) -> Any: ...

    def ready(self, mark: Any) -> bool: ...

    def wait(self, mark: Any) -> None: ...

    def seconds(self, earlier: Any, later: Any) -> float: ...

    def release(self, mark: Any) -> None: ...


class HostClock:
    """Host monotonic clock: marks are ``perf_counter_ns`` readings, complete when taken."""

    mark = staticmethod(time.perf_counter_ns)  # the builtin itself: no Python frame per mark

    def ready(self, mark: int) -> bool:
        return True

    def wait(self, mark: int) -> None:
        pass

    def seconds(self, earlier: int, later: int) -> float:
        return (later - earlier) / 1e9

    def release(self, mark: int) -> None:
        pass


class CudaClock:
    """CUDA events on the current stream. ``mark`` enqueues; nothing here blocks but ``wait``.
    An event read (or never to be read) is ``release``d to a pool that ``mark`` takes from.

    ``Event.record()`` finds the current stream through some ten Python calls of torch's
    (``torch.cuda.current_stream``), every time; ``mark`` asks torch's C layer for the current
    device's current stream and records on a Stream object made once per stream: the same stream,
    with no Python frame. Where torch's C layer differs (checked once, here), ``record()`` it is."""

    def __init__(self) -> None:
        import torch  # here, not at the top (nor in mark, every step): summaries and the CLI load no torch

        self._new_event = torch.cuda.Event
        self._free: list[torch.cuda.Event] = []
        self._streams: dict[tuple[int, int, int], torch.cuda.Stream] | None = None  # None: record() finds it
        try:
            current_device, current_stream = torch._C._cuda_getDevice, torch._C._cuda_getCurrentStream
            raw = current_stream(current_device())
            stream = torch.cuda.Stream(stream_id=raw[0], device_index=raw[1], device_type=raw[2])
            if type(raw) is tuple and stream == torch.cuda.current_stream():  # a tuple: a key of _streams
                self._current_device, self._current_stream = current_device, current_stream
                self._record = torch._C._CudaEventBase.record
                self._streams = {tuple(raw): stream}
        except (AttributeError, TypeError, IndexError, ValueError, RuntimeError):
            pass

    def mark(self) -> torch.cuda.Event:
        event = self._free.pop() if self._free else self._new_event(enable_timing=True)
        if self._streams is None:
            event.record()
            return event
        raw = self._current_stream(self._current_device())
        stream = self._streams.get(raw)
        if stream is None:  # a stream this clock has not recorded on yet (a side stream's context)
            import torch

            stream = torch.cuda.Stream(stream_id=raw[0], device_index=raw[1], device_type=raw[2])
            if len(self._streams) < 64:  # kept, unless streams come and go (then made at each mark)
                self._streams[raw] = stream
        self._record(event, stream)
        return event

    def release(self, mark: torch.cuda.Event) -> None:
        self._free.append(mark)

    def ready(self, mark: torch.cuda.Event) -> bool:
        return mark.query()

    def wait(self, mark: torch.cuda.Event) -> None:
        mark.synchronize()  # waits for this event only, not for the device

    def seconds(self, earlier: torch.cuda.Event, later: torch.cuda.Event) -> float:
        return earlier.elapsed_time(later) / 1e3


def clock_for(device: torch.device) -> Clock:
    return CudaClock() if device.type == "cuda" else HostClock()


class StepTimes(NamedTuple):
    """Durations of one optimizer step on one rank, in seconds (None: phase not observed), and
    what its batches held where they were counted (:data:`BATCH_COUNTS`; None: not counted) and
    what their checks found (:data:`BATCH_CHECKS`; None: not checked).

    A named tuple, immutable: made for every step on log steps, it costs a fifth of a frozen
    dataclass."""

    step: int
    step_s: float
    logging_s: float | None = None
    data_s: float | None = None
    forward_s: float | None = None
    backward_s: float | None = None
    optimizer_s: float | None = None
    tokens: float | None = None
    slots: float | None = None
    seqlen_sq: float | None = None
    bad_batches: float | None = None
    batch_problems: float | None = None

    VALUES = ("step_s", *PHASE_TIMES, *BATCH_COUNTS, *BATCH_CHECKS)

    @property
    def local_s(self) -> float | None:
        """Data wait plus forward: the part of a step in which a DDP rank waits for no other."""
        if self.data_s is None or self.forward_s is None:
            return None
        return self.data_s + self.forward_s

    def to_floats(self) -> list[float]:
        """The values of VALUES in order, NaN for None."""
        return [math.nan if value is None else float(value) for value in self[1:]]

    @classmethod
    def from_floats(cls, step: int, values: list[float]) -> StepTimes:
        kwargs = {name: (None if math.isnan(v) else v) for name, v in zip(cls.VALUES, values, strict=True)}
        return cls(step=step, **kwargs)


class StepTimer:
    """Records marks on the hot path and turns them into :class:`StepTimes` when collected.

    A finished step waits in ``_pending`` as a plain tuple (one is made every step): ``(step, anchor,
    end, marks, counts)``; ``anchor`` is the previous step's end (or a fresh anchor after
    validation), ``marks`` its list indexed by LOGGED..OPTIMIZER (None: not marked), ``counts`` its
    batches.StepCounts (None: not counted)."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._now = clock.mark  # bound once: a host clock's is the builtin itself
        self._anchor: Any = None
        self._marks: list[Any] = [None] * 4
        self._pending: deque[tuple[int, Any, Any, list[Any], Any]] = deque()

    def anchor(self) -> None:
        """Start the next step's interval now (at training start, and after validation)."""
        self._anchor = self._now()
        self._marks = [None] * 4

    def mark(self, index: int) -> None:
        """Mark LOGGED, START, BACKWARD or OPTIMIZER in the step in progress; START keeps its first,
        others their last (an earlier micro-batch's is never read)."""
        replaced = self._marks[index]
        if replaced is not None:
            if index == START:
                return
            self.clock.release(replaced)
        self._marks[index] = self._now()

    def end_step(self, step: int, counts: Any = None) -> None:
        """``counts``: the step's batch counts (batches.StepCounts), whose copy to the host was
        enqueued before this end mark: complete when the mark is."""
        end = self._now()
        anchor = self._anchor if self._anchor is not None else self._marks[START]
        if anchor is not None:
            self._pending.append((step, anchor, end, self._marks, counts))
        self._anchor, self._marks = end, [None] * 4

    @property
    def pending(self) -> int:
        return len(self._pending)

    def collect(self, through_step: int | None = None, wait: bool = True) -> list[StepTimes]:
        """Times of the pending steps up to ``through_step`` (all if None), oldest first.

        Waits for a step's end mark only if it has not completed yet; callers pass the
        previous step on log steps so the wait, if any, is for work the GPU is finishing.
        With ``wait=False`` it stops at the first step not complete (after an error the device
        may be stuck behind a collective that will never finish).
        """
        collected, release = [], self.clock.release
        while self._pending and (through_step is None or self._pending[0][0] <= through_step):
            end = self._pending[0][2]
            if not self.clock.ready(end):
                if not wait:
                    break
                self.clock.wait(end)
            open_step = self._pending.popleft()
            collected.append(self._read(*open_step))
            # Read: its anchor and marks go back to the pool (each once: the anchor may be its START),
            # and its end too unless it is the next step's anchor (a validation gave that a fresh one).
            _, anchor, end, marks, _ = open_step
            release(anchor)
            for mark in marks:
                if mark is not None and mark is not anchor:
                    release(mark)
            if end is not (self._pending[0][1] if self._pending else self._anchor):
                release(end)
        return collected

    def _read(self, step: int, anchor: Any, end: Any, marks: list[Any], counts: Any) -> StepTimes:
        # Each phase is measured between the marks that bound it, the chain from the LOGGED mark (else
        # the anchor) through START, BACKWARD and OPTIMIZER to the end; a missing mark leaves the phases
        # it bounds None. A step after no log step of ours has no LOGGED mark: its logging phase is 0.
        # Written out, not looped over pairs: on log steps this runs for every step of the interval.
        seconds = self.clock.seconds
        logged, start, backward, optimizer = marks
        return StepTimes(
            step, seconds(anchor, end),
            seconds(anchor, logged) if logged is not None else 0.0,
            seconds(anchor if logged is None else logged, start) if start is not None else None,
            seconds(start, backward) if start is not None and backward is not None else None,
            seconds(backward, optimizer) if backward is not None and optimizer is not None else None,
            seconds(optimizer, end) if optimizer is not None else None,
            *(counts.read() if counts is not None else ()))
