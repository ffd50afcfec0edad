"""Which segment of a restarted log to import: ``--segment N`` (from 1) or ``--segment last``.

A job requeued by Slurm (``--open-mode=append``) or restarted by Kubernetes with a persistent log
writes every process into the same file; each process resumes from its last checkpoint, so its
steps repeat some of the last one's, with other times. The importer never merges two processes'
steps: a log of several segments is refused, naming them, until one is chosen.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nemo_throughput.errors import ReportError
from nemo_throughput.importers.steps import Segment, Step, StepLog
from nemo_throughput.values import whole_number

LAST = "last"
LISTED_FIRST = 3  # segments named in a message: these first ones and the last, then the count
SEGMENT_HELP = ("the segment of a log the job restarted into (a requeued Slurm job appends to its log): a number "
                "from 1, or last; without it such a log is refused, naming its segments")


def parse_choice(text: str | None) -> int | str | None:
    """--segment as given: a number from 1, LAST, or None (not given)."""
    if text is None:
        return None
    if text.strip().lower() == LAST:
        return LAST
    number = whole_number(text.strip())
    if number is None or number < 1:
        raise ReportError(f"--segment {text}: not a segment (give a number from 1, the log's first, or last)")
    return number


@dataclass(frozen=True)
class ChosenSegment:
    """The segment read, and where it lies in the log."""

    number: int  # from 1
    of: int  # segments in the log
    steps: list[Step]
    place: str  # what its places count: line (text logs), value (event files)

    @property
    def where(self) -> str:
        """``segment 2 of 3 (steps 44-80, lines 120-310)``, for notes and messages."""
        return f"segment {self.number} of {self.of} ({_span(self.steps, self.place)})"

    def record(self) -> dict[str, Any] | None:
        """environment.imported_segment: None for a log of one segment."""
        if self.of == 1:
            return None
        first, last = self.steps[0], self.steps[-1]
        return {"number": self.number, "of": self.of, "steps": [first.step, last.step],
                f"{self.place}s": [first.line, last.line]}


def choose(log: StepLog, choice: int | str | None) -> ChosenSegment:
    """The segment asked for; without a choice the only one, else refused naming them all."""
    segments = [segment for segment in log.segments if segment.steps]
    count = len(segments)
    if choice is None and count > 1:
        raise ReportError(f"{log.path}: {count} segments, as a job restarted into the same log prints them: "
                          f"{listing(segments, log.place)} (import one with --segment N, from 1, or --segment last"
                          f"{'; ' + log.split if log.split else ''})")
    number = count if choice in (None, LAST) else int(choice)
    if number > count:
        kind = "one segment (no restart found)" if count == 1 else f"{count} segments: {listing(segments, log.place)}"
        raise ReportError(f"{log.path}: --segment {choice}: the log has {kind} (give a number from 1 to {count}, "
                          "or last)")
    return ChosenSegment(number, count, segments[number - 1].steps, log.place)


def listing(segments: list[Segment], place: str) -> str:
    """Each segment's steps and places, and why it starts; past LISTED_FIRST + 1, the first ones, the count
    left out and the last."""
    described = [_described(number, segment, place) for number, segment in enumerate(segments, start=1)]
    if len(described) > LISTED_FIRST + 1:
        described = [*described[:LISTED_FIRST], f"... {len(described) - LISTED_FIRST - 1} more ...", described[-1]]
    return "; ".join(described)


def _described(number: int, segment: Segment, place: str) -> str:
    start = f", starting where {segment.start}" if segment.start else ""
    return f"{number}: {_span(segment.steps, place)}{start}"


def _span(steps: list[Step], place: str) -> str:
    first, last = steps[0], steps[-1]
    return (f"steps {first.step}-{last.step}, {len(steps)} printed, {place}s {first.line}-{last.line}"
            if len(steps) > 1 else f"step {first.step}, {place} {first.line}")
