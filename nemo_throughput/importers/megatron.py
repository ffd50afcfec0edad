"""Megatron-LM and Megatron-Bridge training logs: the ``training_log`` line of each log interval::

     [2024-04-06 02:59:36] iteration       43/     100 | consumed samples:         5504 | elapsed time per
     iteration (ms): 5444.9 | throughput per GPU (TFLOP/s/GPU): 239.8 | learning rate: 8.600000E-06 |
     global batch size:   128 | lm loss: 1.825991E+00 | ...

Both print it on the last rank only (``print_rank_last``), with the same format strings. The time
is the mean over the ``--log-interval`` iterations that end at the printed one; it counts as one
sample at that iteration. The global batch size is the one of that iteration (it changes during
a ``--rampup-batch-size`` ramp). Where a line does not print it (some versions and forks), it is
what ``consumed samples`` grew by since the line before, per iteration (Megatron counts the
samples of skipped iterations too): a line without a line before it states none.

Megatron-Bridge adds, on rank 0 (``print_rank_0``), a line per log interval such as
``Step Time : 4.65s GPU utilization: 1176.2MODEL_TFLOP/s/GPU`` (``TFLOP/s/GPU`` in older
versions). It tells a Bridge log apart but is not read as a step: it has no iteration number and
repeats the iteration line's time rounded to 10 ms.

AMD's Primus trainer prints the same line (on the last rank, after its own logger prefix
``[20251202 09:12:08][rank-7/8][INFO ] [--------trainer.py:2560] :``) with each rate as
``<this interval>/<running average>``: ``elapsed time per iteration (ms): 13372.8/13364.7``,
``throughput per GPU (TFLOP/s/GPU): 567.6/568.0`` (later ``compute per GPU (TFLOP/s/GPU): 615.5
(avg 615.5)``) and ``tokens per GPU (tokens/s/GPU): 9801.4/9807.3`` (later ``tokens/s/GPU
inst/harmonic mean: X/Y``); its first iterations print single values. The first number is read,
never the average; the tokens per GPU it states (sequence length x global batch / time / world
size) are kept to check the facts given on the command line.

The TFLOP/s per GPU a line states (``throughput per GPU``, Primus' ``compute per GPU``, Bridge's
``GPU utilization``) is the framework's own count of model FLOPs: it is kept, as printed (NaN,
zero and negative included), for :mod:`~nemo_throughput.importers.crosscheck`, never used as a rate.

Megatron-DeepSpeed prints the same line. BigScience's fork (and the forks made from it) prints
the time in seconds, ``elapsed time per iteration (s): 7.2310``; Microsoft's prints milliseconds
and adds ``tokens per gpu per second (tgs): 142.612`` (the same quantity as Primus' tokens per GPU,
checked the same way).
"""

from __future__ import annotations

import math
import re
from pathlib import Path

from nemo_throughput.errors import ReportError
from nemo_throughput.importers.lines import Line
from nemo_throughput.importers.nemo import parse_number
from nemo_throughput.importers.steps import Step, StepLog

NAME = "megatron"
TAG = "elapsed time per iteration (ms)"
SECONDS_TAG = "elapsed time per iteration (s)"  # Megatron-DeepSpeed (BigScience's fork): seconds
KEY_TAG = "elapsed_time_per_iteration_ms="  # Argonne's Megatron-DeepSpeed (AuroraGPT): the fields as key=value
BATCH_ORIGIN = "`global batch size:`, or `consumed samples:` from one printed iteration to the next"

# Each field as Megatron-LM prints it (`iteration   10/  100 |`, `global batch size:   128 |`), or as
# Argonne's Megatron-DeepSpeed does, its words joined by `_` and its value after `=` (`iteration=  10/  100 |`).
_ITERATION = re.compile(r"\biteration(?:\s+|=\s*)(\d+)/\s*\d+\s*\|")
# the value of this interval, then Primus' running average after a "/" (not read)
_ELAPSED = re.compile(r"elapsed(?: time per iteration \((ms|s)\):|_time_per_iteration_(ms)=)\s*([^\s|/]*)")
_BATCH = re.compile(r"global(?: batch size:|_batch_size=)\s*(\d+)")
_CONSUMED = re.compile(r"consumed(?: samples:|_samples=)\s*(\d+)")
_TOKENS_PER_GPU = re.compile(r"(?:tokens per GPU \(tokens/s/GPU\):|tokens/s/GPU inst/harmonic mean:"
                             r"|tokens per gpu per second \(tgs\):|tokens_per_gpu_per_second_tgs=)"
                             r"\s*([\d.]+)(?=[/\s|])")  # a number without what follows it may be cut
_BRIDGE_STEP_TIME = re.compile(r"Step Time : (\S+)s GPU utilization: (\S*?)(?:MODEL_)?TFLOP/s/GPU")
# Megatron-LM's `throughput per GPU`, Primus' `compute per GPU` (then `(avg ...)`): the first value only
_STATED_TFLOPS = re.compile(r"(?:throughput|compute) per GPU \(TFLOP/s/GPU\):\s*([^\s|/]*)")
BRIDGE_STYLE = "Megatron-Bridge `Step Time :` lines"
# Printed by rank 0 once per process, before any iteration: Megatron-LM's _initialize_distributed
# (megatron/training/initialize.py, since 2020: "> initializing torch distributed ...") and
# Megatron-Bridge's (src/megatron/bridge/training/initialize.py: "... with N workers."). After an
# iteration line it means a new process: a restart into the same log, even one that resumes past
# the last printed iteration, so that no step number repeats.
_PROCESS_START = re.compile(r"^\s*> initializing torch distributed\b")
PROCESS_START = "`> initializing torch distributed`"
BANNER_ON_STEP_RANK = False  # rank 0 prints the banner, the last rank the steps: any rank's counts


def matches(text: str) -> bool:
    """A step line: an iteration with its time (not, say, a message that names the field)."""
    return ((TAG in text or SECONDS_TAG in text or KEY_TAG in text) and _ITERATION.search(text) is not None
            and _ELAPSED.search(text) is not None)


def is_whole(text: str) -> bool:
    """Whether a line is complete: every field of the iteration line ends with `|` (a colour reset
    Primus adds after it is gone with the line's other control sequences, importers.lines)."""
    return text.rstrip().endswith("|")


def starts_process(text: str) -> bool:
    """Whether a line is the banner every Megatron process prints as it starts (see above)."""
    return _PROCESS_START.match(text) is not None


def is_bridge_step_time(text: str) -> bool:
    """Megatron-Bridge's rank-0 ``Step Time : ... TFLOP/s/GPU`` line (not a step line: see above)."""
    return _BRIDGE_STEP_TIME.search(text) is not None


def bridge_step_time(text: str) -> tuple[float, float] | None:
    """(seconds, TFLOP/s per GPU) a Bridge ``Step Time :`` line prints, NaN for what is no number; None
    for any other line."""
    found = _BRIDGE_STEP_TIME.search(text)
    return None if found is None else (_number_or_nan(found.group(1)), _number_or_nan(found.group(2)))


def stated_tflops(text: str) -> float | None:
    """The TFLOP/s per GPU an iteration line states (Primus: this interval's, before the `/`), NaN where
    it prints no number there; None where the line has no such field."""
    found = _STATED_TFLOPS.search(text)
    return None if found is None else _number_or_nan(found.group(1))


def _number_or_nan(text: str) -> float:
    try:
        return parse_number(text)
    except ValueError:
        return math.nan


class Reader:
    """One rank's Megatron iteration lines, as they stream in."""

    def __init__(self, path: Path, global_batch_size: int | None = None) -> None:
        self.path = path
        self.log = StepLog(path)
        self.styles = {"Megatron-LM / Megatron-Bridge iteration lines"}
        self.no_value_lines: list[int] = []  # Primus lines with only the running average (`: /13364.7`)
        self._consumed: tuple[int, int, int | None] | None = None  # iteration, consumed samples, batch of the last line

    def feed(self, line: Line) -> bool:
        iteration = _ITERATION.search(line.text)
        elapsed = _ELAPSED.search(line.text)
        if not iteration or not elapsed:
            return False
        unit, value = elapsed.group(1) or elapsed.group(2), elapsed.group(3)
        if not value:
            self.no_value_lines.append(line.number)
            return True
        try:
            seconds = parse_number(value) / (1e3 if unit == "ms" else 1.0)
        except ValueError:
            raise ReportError(f"{self.path}: line {line.number}: `elapsed time per iteration ({unit})` is {value!r}, "
                              "not a number (is the line cut? give the log as the job wrote it)") from None
        step = int(iteration.group(1))
        tokens = _TOKENS_PER_GPU.search(line.text)
        self.log.add(Step(step, seconds, self._batch(step, line.text), line.number,
                          float(tokens.group(1)) if tokens else None, stated_tflops(line.text)))
        return True

    def _batch(self, step: int, text: str) -> int | None:
        """The global batch size the line prints, else the growth of ``consumed samples`` per
        iteration since the line before (None where there is none, or it does not divide evenly)."""
        stated, consumed = _BATCH.search(text), _CONSUMED.search(text)
        batch = int(stated.group(1)) if stated else None
        if consumed is None:
            return batch
        samples, previous = int(consumed.group(1)), self._consumed
        if previous is not None and previous[:2] == (step, samples):
            return previous[2] if batch is None else batch  # the same line printed again
        if batch is None and previous is not None and step > previous[0]:
            grown, iterations = samples - previous[1], step - previous[0]
            batch = grown // iterations if grown > 0 and grown % iterations == 0 else None
        self._consumed = (step, samples, batch)
        return batch
