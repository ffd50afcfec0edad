"""Goodput: where a job's wall-clock time went, across its restarts.

Each segment of a run (one training process, from its start to its end or its death) keeps a
:class:`Ledger` on rank 0: the seconds spent in each state (start-up, training steps, waiting for
data, validation, checkpoint saves) and the last step finished, in a small file mapped into memory.
An event is one clock read and a few stores into that memory (a step's start is kept until its end
and stored with it); the kernel keeps the pages when the process is killed (SIGKILL included), so a
dead segment's ledger is exact to its last event.

A segment that continues an earlier one (a resume from a checkpoint, a requeued Slurm job, a
restarted Kubernetes pod) takes its run id (goodput.segments says which run it continues);
:func:`stitch` joins a run's segments into the run's goodput (goodput.run writes it to
``goodput.json``): steps trained after a segment's last checkpoint and trained again after the
restart are lost, and the time between segments is the restart's.
"""

from __future__ import annotations

import json
import math
import mmap
import os
import stat
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LEDGER_FILE = "goodput.ledger"
RUN_FILE = "goodput.json"
RUN_SCHEMA = "nemo-throughput/goodput/v1"
# A segment's states, in its ledger; every second from the process start to the last event is in one.
STATES = ("startup", "data", "step", "validation", "checkpoint")
STARTUP, DATA, STEP, VALIDATION, CHECKPOINT = range(len(STATES))  # their indices, for the hot path
# The run's categories: productive steps, then the badput.
CATEGORIES = ("productive", "startup", "data", "validation", "checkpoint", "lost", "restart")

_MAGIC, _VERSION = b"NTGOODPT", 1
_SIZE, _IDENTITY_AT = 4096, 1024  # the file: magic, the numbers, then the segment's identity (JSON)
IDENTITY_BYTES = _SIZE - _IDENTITY_AT  # the most an identity's JSON may take
_CHECKPOINTS = 16  # the last checkpoints kept: (step, step seconds, data seconds) when each was saved
# Indices of the numbers (float64) after the magic.
_STARTED, _LAST, _STATE, _FIRST_STEP, _LAST_STEP, _TOTALS = 0, 1, 2, 3, 4, 5
_SAVED = _TOTALS + len(STATES)  # checkpoints recorded so far (the ring holds the last _CHECKPOINTS)
_RING = _SAVED + 1
_NUMBERS = _RING + 3 * _CHECKPOINTS


def process_start_epoch_s() -> float:
    """When this process started (Linux: /proc, to a clock tick), as a Unix time; now where that
    cannot be read."""
    try:
        with open("/proc/self/stat", encoding="ascii") as file:
            ticks = int(file.read().rsplit(")", 1)[1].split()[19])  # field 22 (after the command name)
        since_boot = time.clock_gettime(time.CLOCK_BOOTTIME)  # the clock starttime counts on, unlike btime's seconds
        return time.time() - since_boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return time.time()


class Ledger:
    """One segment's seconds by state, in ``goodput.ledger``; its methods are the hot path's."""

    def __init__(self, directory: str | os.PathLike, started_epoch_s: float | None = None) -> None:
        self.path = Path(directory) / LEDGER_FILE
        # Never through a link: a ledger path that is one would truncate the file it points to.
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o666)
        try:
            os.ftruncate(fd, _SIZE)
            self._map = mmap.mmap(fd, _SIZE)
        finally:
            os.close(fd)
        self._map[:len(_MAGIC)] = _MAGIC
        self._numbers = memoryview(self._map)[len(_MAGIC):len(_MAGIC) + 8 * _NUMBERS].cast("d")
        started = process_start_epoch_s() if started_epoch_s is None else started_epoch_s
        # Durations come from the monotonic clock; the epoch anchors them for joining segments.
        self._epoch_minus_monotonic = time.time() - time.monotonic()
        self._since = started - self._epoch_minus_monotonic
        self._state = 0
        self._step_started: float | None = None  # monotonic; a step's start not written yet (step_starts)
        self._numbers[_STARTED] = started
        self._numbers[_FIRST_STEP] = self._numbers[_LAST_STEP] = -1.0
        self._numbers[_LAST] = started

    def step_starts(self) -> None:
        """A step (or a micro-batch of it) starts: kept in memory, written by the next event (its end,
        normally), so that an ordinary step writes to the mapped page once. A segment killed within a
        step keeps its ledger as of the step before."""
        if self._step_started is None:
            self._step_started = time.monotonic()

    def switch(self, state: int, last_step: int | None = None) -> None:
        """The time since the last event was spent in the current state (and, after a step's start,
        in the step); ``state`` (STARTUP...) starts now. ``last_step``: the step just finished (a
        step's end is ``switch(DATA, step)``: one call, on every step)."""
        now = time.monotonic()
        numbers, started = self._numbers, self._step_started
        if started is not None:
            numbers[_TOTALS + self._state] += started - self._since
            self._since, self._state, self._step_started = started, STEP, None
        numbers[_TOTALS + self._state] += now - self._since
        if last_step is not None:
            numbers[_LAST_STEP] = last_step
        self._since, self._state = now, state
        numbers[_STATE] = state
        numbers[_LAST] = now + self._epoch_minus_monotonic

    def charge(self, state: int) -> None:
        """The time since the last event was spent in ``state`` (learnt after the fact: Megatron-Bridge
        tells of a checkpoint once saved; a step's start still unwritten counts as the step's); the
        current state goes on from now."""
        current = self._state
        self._state = state
        self.switch(current)

    def start_training(self, first_step: int, identity: Mapping[str, Any]) -> None:
        """Start-up is over; ``identity`` (JSON) says which run and segment this is."""
        text = json.dumps(identity).encode()
        if len(text) > IDENTITY_BYTES:
            raise ValueError(f"goodput identity too long ({len(text)} bytes)")
        self._map[_IDENTITY_AT:] = text.ljust(_SIZE - _IDENTITY_AT)
        self._numbers[_FIRST_STEP] = first_step
        self.switch(DATA, first_step)

    def checkpoint(self, step: int) -> None:
        """A checkpoint of ``step`` is saved: the step and data seconds so far, to price lost steps. Another
        save of the same step (Lightning's last.ckpt beside the periodic one) replaces its record."""
        saved = int(self._numbers[_SAVED])
        if saved and self._numbers[_RING + 3 * ((saved - 1) % _CHECKPOINTS)] == step:
            saved -= 1
        slot = _RING + 3 * (saved % _CHECKPOINTS)
        numbers = self._numbers
        numbers[slot], numbers[slot + 1], numbers[slot + 2] = step, self._total(STEP), self._total(DATA)
        self._numbers[_SAVED] = saved + 1

    @property
    def last_step(self) -> int:
        """The last step finished (the first step before any; -1 before training)."""
        return int(self._numbers[_LAST_STEP])

    def _total(self, state: int) -> float:
        extra = time.monotonic() - self._since if self._state == state else 0.0
        return self._numbers[_TOTALS + state] + extra

    def close(self) -> None:
        self._map.flush()
        self._numbers.release()
        self._map.close()


@dataclass(frozen=True)
class Segment:
    """A segment's ledger as read back."""

    directory: Path
    identity: dict[str, Any]
    started_epoch_s: float
    last_epoch_s: float
    first_step: int
    last_step: int
    seconds: dict[str, float]  # by state
    checkpoints: list[tuple[int, float, float]]  # (step, step seconds, data seconds), oldest first

    @property
    def run_id(self) -> str:
        return self.identity["run_id"]


def read_ledger(path: str | os.PathLike) -> Segment | None:
    """A ledger file's segment; None when it is not one (or its training never started). Read without
    following a link, from a regular file of a ledger's size only, and never waiting: a FIFO, a
    device, a link to /dev/zero or a directory where a ledger belongs is no segment. Numbers that are
    not finite (a file written by hand, or broken) make none either."""
    path = Path(path)
    data = _ledger_bytes(path)
    if data is None or not data.startswith(_MAGIC):
        return None
    numbers = memoryview(data)[len(_MAGIC):len(_MAGIC) + 8 * _NUMBERS].cast("d")
    if not all(math.isfinite(number) for number in numbers):
        return None
    try:
        identity = json.loads(data[_IDENTITY_AT:].decode().strip() or "null")
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not (isinstance(identity, dict) and all(isinstance(identity.get(k), str) for k in ("run_id", "root"))
            and numbers[_FIRST_STEP] >= 0):
        return None  # not one of ours (written by hand, or cut short), or its training never started
    saved = int(numbers[_SAVED])
    slots = range(max(saved - _CHECKPOINTS, 0), saved)
    checkpoints = [(int(numbers[_RING + 3 * (i % _CHECKPOINTS)]), numbers[_RING + 3 * (i % _CHECKPOINTS) + 1],
                    numbers[_RING + 3 * (i % _CHECKPOINTS) + 2]) for i in slots]
    return Segment(path.parent, identity, numbers[_STARTED], numbers[_LAST], int(numbers[_FIRST_STEP]),
                   int(numbers[_LAST_STEP]), {state: numbers[_TOTALS + i] for i, state in enumerate(STATES)},
                   checkpoints)


def _ledger_bytes(path: Path) -> bytes | None:
    """The file's bytes where it is a regular file of a ledger's size, opened without following a
    link and without blocking (a FIFO would stall the resume); else None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode) or status.st_size != _SIZE:
            return None
        data = os.read(fd, _SIZE + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    return data if len(data) == _SIZE else None


def stitch(segments: list[Segment], notes: Sequence[str] = ()) -> dict[str, Any]:
    """The run's goodput from its segments (oldest first): seconds by category (CATEGORIES), the
    goodput share, and each segment's part. A segment's steps after the step the next segments
    resumed from are lost: their step and data seconds, priced at the checkpoint they resumed from
    (estimated at the segment's mean step where no recorded checkpoint matches, and flagged).
    ``notes``: what joining the segments found ambiguous or missing, kept with the numbers."""
    if not segments:
        raise ValueError("no segments to stitch")
    totals = dict.fromkeys(CATEGORIES, 0.0)
    rows, lost_steps, clock_notes = [], 0, []
    for index, segment in enumerate(segments):
        resumed = min((s.first_step for s in segments[index + 1:]), default=None)
        lost, lost_s, estimated = _lost(segment, resumed)
        lost_steps += lost
        seconds = segment.seconds
        totals["productive"] += seconds["step"] - lost_s["step"]
        totals["data"] += seconds["data"] - lost_s["data"]
        for state in ("startup", "validation", "checkpoint"):
            totals[state] += seconds[state]
        totals["lost"] += lost_s["step"] + lost_s["data"]
        if index:
            gap = segment.started_epoch_s - segments[index - 1].last_epoch_s
            if gap < 0:  # its host's clock is behind the last one's: the gap is unknown, not negative
                clock_notes.append(f"segment {index + 1} started {-gap:.1f} s before segment {index}'s last event by "
                                   "their hosts' clocks: the clocks disagree, and the restart between them is not "
                                   "counted")
            totals["restart"] += max(gap, 0.0)
        rows.append({"dir": str(segment.directory), "run_id": segment.identity.get("segment_run_id"),
                     "segment": index + 1, "restart_count": segment.identity.get("restart_count"),
                     "started_at": _iso(segment.started_epoch_s), "last_event_at": _iso(segment.last_epoch_s),
                     "first_step": segment.first_step, "last_step": segment.last_step, "lost_steps": lost,
                     "lost_s": lost_s["step"] + lost_s["data"], "lost_estimated": estimated,
                     "joined_by": segment.identity.get("joined_by"),
                     "seconds": dict(segment.seconds)})
    # Each segment's span is its own host's (one clock); between segments, the restarts counted above.
    wall_s = sum(s.last_epoch_s - s.started_epoch_s for s in segments) + totals["restart"]
    return {
        "schema": RUN_SCHEMA,
        "run_id": segments[0].run_id,
        "scheduler_key": segments[0].identity.get("scheduler_key"),
        "wall_s": wall_s,
        "goodput_pct": 100.0 * totals["productive"] / wall_s if wall_s > 0 else None,
        "seconds": totals,
        "steps": {"trained": sum(s.last_step - s.first_step for s in segments), "lost": lost_steps,
                  "last": segments[-1].last_step},
        "segments": rows,
        "clock_notes": clock_notes,
        "notes": list(notes),
    }


def _lost(segment: Segment, resumed: int | None) -> tuple[int, dict[str, float], bool]:
    """(steps of ``segment`` trained again later, their step and data seconds, whether estimated)."""
    priced = ("step", "data")
    if resumed is None or resumed >= segment.last_step:
        return 0, dict.fromkeys(priced, 0.0), False
    kept_through = max(resumed, segment.first_step)
    lost = segment.last_step - kept_through
    at = dict.fromkeys(priced, 0.0) if kept_through == segment.first_step else next(
        (dict(zip(priced, seconds, strict=True)) for step, *seconds in reversed(segment.checkpoints)
         if step == kept_through), None)
    if at is None:  # no checkpoint of that step recorded here: the segment's mean step
        trained = segment.last_step - segment.first_step
        return lost, {state: segment.seconds[state] * lost / trained for state in priced}, True
    return lost, {state: segment.seconds[state] - at[state] for state in priced}, False


def _iso(epoch_s: float) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(epoch_s, dt.timezone.utc).isoformat(timespec="milliseconds")
