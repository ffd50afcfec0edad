"""Megatron-LM and Megatron-Bridge training logs: the ``training_log`` line of each log interval::

     [2024-04-06 02:59:36] iteration       43/     100 | consumed samples:         5504 | elapsed time per
     iteration (ms): 5444.9 | throughput per GPU (TFLOP/s/GPU): 239.8 | learning rate: 8.600000E-06 |
     global batch size:   128 | lm loss: 1.825991E+00 | ...

Both print it on the last rank only (``print_rank_last``), with the same format strings. The time
is the mean over the ``--log-interval`` iterations that end at the printed one; it counts as one
sample at that iteration. The global batch size is the one of that iteration (it changes during
a ``--rampup-batch-size`` ramp).
"""

from __future__ import annotations

import re
from pathlib import Path

from nemo_throughput.importers.lines import Line
from nemo_throughput.importers.nemo import parse_number
from nemo_throughput.importers.steps import Step, StepLog
from nemo_throughput.report.runs import ReportError

NAME = "megatron"
TAG = "elapsed time per iteration (ms)"
BATCH_ORIGIN = "`global batch size:`"

_ITERATION = re.compile(r"\biteration\s+(\d+)/\s*\d+\s*\|")
_ELAPSED = re.compile(r"elapsed time per iteration \(ms\):\s*([^\s|]+)")
_BATCH = re.compile(r"global batch size:\s*(\d+)")


def matches(text: str) -> bool:
    """A step line: an iteration with its time (not, say, a message that names the field)."""
    return TAG in text and _ITERATION.search(text) is not None and _ELAPSED.search(text) is not None


class Reader:
    """One rank's Megatron iteration lines, as they stream in."""

    def __init__(self, path: Path, global_batch_size: int | None = None) -> None:
        self.path = path
        self.log = StepLog(path)
        self.styles = {"Megatron-LM / Megatron-Bridge iteration lines"}

    def feed(self, line: Line) -> bool:
        iteration = _ITERATION.search(line.text)
        elapsed = _ELAPSED.search(line.text)
        if not iteration or not elapsed:
            return False
        try:
            milliseconds = parse_number(elapsed.group(1))
        except ValueError:
            raise ReportError(f"{self.path}: line {line.number}: `{TAG}` is {elapsed.group(1)!r}, not a number "
                              "(is the line cut? give the log as the job wrote it)") from None
        batch = _BATCH.search(line.text)
        self.log.add(Step(int(iteration.group(1)), milliseconds / 1e3, int(batch.group(1)) if batch else None,
                          line.number))
        return True
