"""What every log reader produces: one rank's steps, each with its time and the batch the log states.

A step printed twice must say the same thing twice. Two different times for one step, or step
numbers going backwards, mean that several ranks print without a prefix that tells them apart,
or that the job restarted into the same file: either way no number can be chosen silently.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from nemo_throughput.errors import ReportError


@dataclass(frozen=True)
class Step:
    step: int  # from 1, as in the callback's summaries
    seconds: float  # as printed: may be NaN, infinite, zero or negative (the importer excludes those)
    global_batch_size: int | None  # as the log states it at this step; None: not stated
    line: int  # where it was printed, for error messages
    tokens_per_s_per_gpu: float | None = None  # as the log states it for this step (AMD Primus); None: not stated


@dataclass
class StepLog:
    """One rank's steps in the order the log printed them."""

    path: Path
    steps: list[Step] = field(default_factory=list)
    place: str = "line"  # what Step.line counts, for the messages
    split: str = ("several ranks print without a rank prefix, or the job restarted into this log: run with srun "
                  "--label or torchrun --tee, or split the log where the job restarted")  # what to do about a clash
    _index: dict[int, int] = field(default_factory=dict, init=False, repr=False)

    def add(self, step: Step) -> None:
        seen = self._index.get(step.step)
        if seen is not None:
            earlier = self.steps[seen]
            if not _same(earlier, step):
                raise ReportError(
                    f"{self.path}: step {step.step} is printed twice with different values ({self.place} "
                    f"{earlier.line}: {earlier.seconds:g} s, {self.place} {step.line}: {step.seconds:g} s) "
                    f"({self.split})")
            return
        if self.steps and step.step < self.steps[-1].step:
            last = self.steps[-1]
            raise ReportError(
                f"{self.path}: step numbers go backwards at {self.place} {step.line} (step {step.step} after step "
                f"{last.step} at {self.place} {last.line}) ({self.split})")
        self._index[step.step] = len(self.steps)
        self.steps.append(step)


def _same(a: Step, b: Step) -> bool:
    times_agree = a.seconds == b.seconds or (math.isnan(a.seconds) and math.isnan(b.seconds))
    return times_agree and a.global_batch_size == b.global_batch_size
