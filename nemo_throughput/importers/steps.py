"""What every log reader produces: one rank's steps, each with its time and the batch the log states.

A step printed twice must say the same thing twice. Two different times for one step, or step
numbers going backwards, mean that the job restarted into the same log (a requeued Slurm job
appends to its file; the resumed process starts again from its last checkpoint), or that several
ranks print without a prefix that tells them apart. Either way no number can be chosen silently:
the log is cut into segments there, and the importer reads one only when told which
(:mod:`~nemo_throughput.importers.segments`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True, slots=True)  # slots: a long run's log holds a million of them
class Step:
    step: int  # from 1, as in the callback's summaries
    seconds: float  # as printed: may be NaN, infinite, zero or negative (the importer excludes those)
    global_batch_size: int | None  # as the log states it at this step; None: not stated
    line: int  # where it was printed, for error messages
    tokens_per_s_per_gpu: float | None = None  # as the log states it for this step (AMD Primus); None: not stated
    tflops_per_gpu: float | None = None  # model TFLOP/s per GPU as the log states it (its own count); None: not stated


@dataclass
class Segment:
    """Steps printed in order without a restart between them."""

    start: str | None = None  # why a segment starts here (where the one before ended); None: the log's first
    steps: list[Step] = field(default_factory=list)
    _index: dict[int, int] = field(default_factory=dict, repr=False)

    def printed(self, number: int) -> Step | None:
        seen = self._index.get(number)
        return None if seen is None else self.steps[seen]

    def append(self, step: Step) -> None:
        self._index[step.step] = len(self.steps)
        self.steps.append(step)


@dataclass
class StepLog:
    """One rank's steps in the order the log printed them, cut into segments where the job restarted."""

    path: Path
    place: str = "line"  # what Step.line counts, for the messages
    split: str = ("or several ranks print without a rank prefix: run with srun --label or torchrun "
                  "--tee")  # what else a new segment can mean, and what to do about it
    segments: list[Segment] = field(default_factory=lambda: [Segment()])
    _restart: str | None = field(default=None, init=False, repr=False)  # why the next step opens a segment

    @property
    def steps(self) -> list[Step]:
        """Every segment's steps, in the order printed."""
        return [step for segment in self.segments for step in segment.steps]

    def restarted(self, why: str) -> None:
        """A process started (a restart banner), told once the steps printed before it are added: the next
        step added opens a segment."""
        self._restart = why

    def add(self, step: Step) -> None:
        current = self.segments[-1]
        seen = current.printed(step.step)
        if seen is not None and _same(seen, step):
            return  # drawn or printed again: the same step
        why = self._new_segment_reason(current, seen, step)
        if why is not None and current.steps:
            current = Segment(why)
            self.segments.append(current)
        current.append(step)

    def _new_segment_reason(self, current: Segment, seen: Step | None, step: Step) -> str | None:
        if self._restart is not None:
            why, self._restart = self._restart, None
            return why
        if seen is not None:
            return (f"step {step.step} is printed again with different values ({self.place} {seen.line}: "
                    f"{seen.seconds:g} s, {self.place} {step.line}: {step.seconds:g} s)")
        last = current.steps[-1] if current.steps else None
        if last is not None and step.step < last.step:
            return f"step numbers go backwards (step {step.step} after step {last.step} at {self.place} {last.line})"
        return None


def _same(a: Step, b: Step) -> bool:
    times_agree = a.seconds == b.seconds or (math.isnan(a.seconds) and math.isnan(b.seconds))
    return times_agree and a.global_batch_size == b.global_batch_size
