"""The stall watch: a run that stops making progress says so itself, without Prometheus.

Every rank's reporting thread looks, between its tasks, at the last step its training thread
finished (a number the hot path stores anyway: nothing is added to a step). No step for longer
than ``stall_factor`` x the median step, and at least ``stall_min_s``, is a stall. Then each rank
that can still write dumps every thread's Python stack (``faulthandler``) into
``stacks.rank<N>.txt`` beside the summary and logs one warning naming it; rank 0 writes the
summary with status ``stalled``. When steps resume the status goes back to ``running``, and the
summary keeps the stall in ``stalls``: when, how long, after which step, and the stacks' file.

The watch starts once the statistics have a median (the first log interval after the warm-up), so
that compilation and warm-up are never taken for a stall, and stops when training ends. The time
of the last step is when the watch first saw it: exact to one look (at most 5 s apart).
"""

from __future__ import annotations

import datetime as dt
import faulthandler
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nemo_throughput.text import package_logger, printable

log = package_logger(__name__)

STACKS_FILE = "stacks.rank{rank}.txt"
LONGEST_LOOK_S = 5.0  # between two looks, at most; shorter where the shortest stall is short


def look_every_s(min_s: float) -> float:
    """Seconds between two looks: a twentieth of the shortest stall, 50 ms to LONGEST_LOOK_S."""
    return min(max(min_s / 20, 0.05), LONGEST_LOOK_S)


@dataclass
class Stall:
    """One stall: after which step, since when (Unix time of the last step, as first seen), and
    for how long (so far, while ``ongoing``)."""

    after_step: int
    since_epoch_s: float
    seconds: float
    ongoing: bool
    stacks: str | None  # the stacks' file, relative to the output directory; None: could not write

    def record(self) -> dict[str, Any]:
        """As the summary's ``stalls`` holds it."""
        since = dt.datetime.fromtimestamp(self.since_epoch_s, dt.timezone.utc).isoformat(timespec="seconds")
        return {"after_step": self.after_step, "since": since, "seconds": round(self.seconds, 3),
                "ongoing": self.ongoing, "stacks": self.stacks}


def stall_watch(config: Any, rank: int, output_dir: str, last_step: Callable[[], int],
                median_step_s: Callable[[], float | None]) -> StallWatch | None:
    """This rank's watch as the settings (config.ThroughputConfig) ask; None where stall_factor is 0."""
    if config.stall_factor == 0:
        return None
    return StallWatch(config.stall_factor, config.stall_min_s, rank, output_dir, last_step, median_step_s)


class StallWatch:
    """One rank's watch; :meth:`look` is called on the reporting thread, :meth:`stop` on the training
    thread (a lock keeps the two from both ending one stall).

    ``last_step`` reads the training thread's last finished step; ``median_step_s`` the statistics'
    median step time (None before it is known)."""

    def __init__(self, factor: float, min_s: float, rank: int, output_dir: str, last_step: Callable[[], int],
                 median_step_s: Callable[[], float | None]) -> None:
        self._factor, self._min_s, self._rank = factor, min_s, rank
        self._output_dir = output_dir
        self._last_step, self._median_step_s = last_step, median_step_s
        self._seen_step: int | None = None
        self._seen_at = 0.0  # monotonic time the step was first seen
        self.last_step_epoch_s = 0.0  # the same, as a Unix time (0: no look yet)
        self.look_every_s = look_every_s(min_s)
        self.stalls: list[Stall] = []
        self.stopped = False  # training ended (stop): no more looks
        self._lock = threading.Lock()

    @property
    def stalled(self) -> bool:
        return bool(self.stalls) and self.stalls[-1].ongoing

    def stop(self) -> str | None:
        """Training ended: no more looks. "resumed" where a stall's steps resumed since the last look
        (the run may end within one look of resuming): that stall is over."""
        with self._lock:
            self.stopped = True
            if self.stalled and self._last_step() != self._seen_step:
                self.stalls[-1].ongoing = False
                return "resumed"
            return None

    def records(self) -> list[dict[str, Any]]:
        """The summary's ``stalls``: every stall so far, the ongoing one last."""
        return [stall.record() for stall in self.stalls]

    def threshold_s(self) -> float | None:
        """Seconds without a step that make a stall; None while the median is unknown."""
        median = self._median_step_s()
        return None if median is None else max(self._factor * median, self._min_s)

    def look(self, now: float | None = None) -> str | None:
        """"stalled" when a stall starts, "resumed" when steps resume after one, else None."""
        with self._lock:
            return self._look(now)

    def _look(self, now: float | None) -> str | None:
        if self.stopped:
            return None
        now = time.monotonic() if now is None else now
        step = self._last_step()
        if step != self._seen_step:
            self._seen_step, self._seen_at = step, now
            self.last_step_epoch_s = time.time() - (time.monotonic() - now)
            if self.stalled:
                self.stalls[-1].ongoing = False
                return "resumed"
            return None
        silent_s = now - self._seen_at
        if self.stalled:
            self.stalls[-1].seconds = silent_s
            return None
        threshold = self.threshold_s()
        if threshold is None or silent_s <= threshold:
            return None
        self.stalls.append(Stall(step, self.last_step_epoch_s, silent_s, True, self._dump_stacks(step, silent_s)))
        return "stalled"

    def _dump_stacks(self, step: int, silent_s: float) -> str | None:
        """Every thread's Python stack, appended to this rank's stacks file; its name, or None."""
        name = STACKS_FILE.format(rank=self._rank)
        path = os.path.join(self._output_dir, name)
        try:  # never through a link planted at the path; appended, so that every stall is kept
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
        except OSError as error:
            log.warning("nemo-throughput: rank %d: no step for %.0f s, and its threads' stacks could not be written "
                        "to %s (%s)", self._rank, silent_s, printable(path), error)
            return None
        with os.fdopen(fd, "w") as file:
            file.write(f"=== rank {self._rank}: no step since step {step} for {silent_s:.1f} s "
                       f"({dt.datetime.now(dt.timezone.utc).isoformat(timespec='seconds')}) ===\n")
            file.flush()
            faulthandler.dump_traceback(file=file, all_threads=True)
        return name
