"""NeMo training logs: NeMo 1.x's progress bar and NeMo 2's progress printer.

NeMo 2 (``nemo.lightning`` ProgressPrinter) prints one line per step, integers as integers::

    Training epoch 0, iteration 28/99 | lr: 5.6e-06 | global_batch_size: 32 | global_step: 28 |
    reduced_train_loss: 2.778 | train_step_timing in s: 0.189 | consumed_samples: 928

NeMo 1.x (``MegatronProgressBar``, a tqdm bar) redraws one line with carriage returns::

    Epoch 0: :  47%|████▋     | 7/15 [06:19<07:13, reduced_train_loss=11.50, global_step=5.000,
    consumed_samples=12288.0, train_step_timing in s=49.50]

tqdm prints each postfix number with ``format_num``: three significant digits in e-notation
whenever that is shorter than ``str(value)``. For the integers global_step and consumed_samples
that means exact below 1,000 and at most digits otherwise, except values whose rounding is
shorter (``1e+3``, ``1.2e+4``, ``2e+3`` for anything from 1,995 to 2,005) and everything from
100,000 on (``1.23e+5``). So a step number is never read from a rounded value: steps are
counted from the order of the bar's updates (its ``n/total`` counter is exact), anchored on and
checked against every value that is exact, and checked against the range each rounded value
allows. Anything that does not fit is an error, not a guess.

The bar draws at counter n the metrics of the step before (it redraws, then sets the new
metrics without drawing); a redraw at the same counter with new metrics (validation end, end of
training) shows step n itself, and the next counter then shows that step again.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

from nemo_throughput.errors import ReportError
from nemo_throughput.importers.lines import Line
from nemo_throughput.importers.steps import Step, StepLog

NAME = "nemo"
TAG = "train_step_timing in s"
# Lightning's word, once a fit has restored a checkpoint (`_CheckpointConnector.resume_end`, rank_zero_info:
# global rank 0, the rank that prints NeMo's steps): "... checkpoint file at" before Lightning 2.0, "...
# checkpoint at" since. A NeMo process that resumes, even past the last printed step, prints it before its
# first step; one that does not resume starts again from step 1, which its steps show. NeMo 1.x also prints
# it after the last step when it restores the best checkpoint at the end of training: no step follows it.
_RESUMED = re.compile(r"Restored all states from the checkpoint (?:file )?at ")
PROCESS_START = "`Restored all states from the checkpoint`: a run resumed"
BANNER_ON_STEP_RANK = True  # printed by the process whose steps are read: another rank's is not this process's
BATCH_ORIGIN = "NeMo 2's `global_batch_size:`; NeMo 1.x's consumed_samples / steps"
# FLOPsMeasurementCallback's model TFLOP/s per GPU on NeMo 2's lines (NeMo 2.3 on; 2.0 to 2.2): read for
# importers.crosscheck_nemo, never as a rate. NeMo 1.x's bar prints none.
RATE_FIELDS = ("TFLOPS_per_GPU", "tflops_per_sec_per_gpu")

_NUMBER = r"[-+]?(?:nan|inf)(?:\.0*)?|[-+]?\d*\.?\d+(?:e[-+]?\d+)?"
_BAR_FIELD = re.compile(r"(global_step|consumed_samples|train_step_timing in s|reduced_train_loss)=(" + _NUMBER
                        + r")(?=[,\]\s]|$)", re.IGNORECASE)
_BAR_COUNTER = re.compile(r"\|\s*(\d+)/(\d+)\s*\[")
_BAR_EPOCH = re.compile(r"Epoch (\d+)")
_PRINTER = re.compile(r"Training epoch (\d+), iteration (\d+)/(\d+)")
_PRINTER_FIELD = re.compile(r"\|\s*([^|:]+?):\s*([^|\s]+)")


_STEP_TIME = re.compile(re.escape(TAG) + r"\s*[=:]\s*(?:" + _NUMBER + ")", re.IGNORECASE)


def matches(text: str) -> bool:
    """A step line: the tag with a value (not, say, a warning that names the metric)."""
    return TAG in text and _STEP_TIME.search(text) is not None


def starts_process(text: str) -> bool:
    """Whether a line says a NeMo process resumed from a checkpoint (see above). Anywhere in the line: a
    killed process's last progress bar has no line break, so the next process's first line is glued to it."""
    return _RESUMED.search(text) is not None


def is_whole(text: str) -> bool:
    """Whether a line is complete: a progress bar ends with `]`; a NeMo 2 line cannot tell."""
    return text.rstrip().endswith("]")


def parse_number(text: str) -> float:
    """A number as NeMo, tqdm or Megatron print it, including tqdm's ``nan.0`` and ``inf.0``."""
    lowered = text.strip().lower()
    if lowered.lstrip("+-").startswith(("nan", "inf")):
        lowered = lowered.split(".")[0]
    return float(lowered)


def tqdm_range(text: str) -> tuple[float, float]:
    """The values tqdm's ``format_num`` prints as ``text``: one value, or a range when it rounded."""
    value = parse_number(text)
    if "e" not in text.lower() or not math.isfinite(value) or value == 0:
        return value, value
    mantissa, exponent = text.lower().split("e")
    leading_digits = len(mantissa.lstrip("+-").split(".")[0])
    half_unit = 0.5 * 10.0 ** (int(exponent) + leading_digits - 1 - 2)  # 3 significant digits
    return value - half_unit, value + half_unit


@dataclass(frozen=True)
class _BarUpdate:
    epoch: int | None
    counter: int | None
    fields: tuple[str | None, ...]  # global_step, consumed_samples, train_step_timing in s, reduced_train_loss
    line: int

    @property
    def global_step(self) -> str | None:
        return self.fields[0]

    @property
    def consumed_samples(self) -> str | None:
        return self.fields[1]

    @property
    def seconds(self) -> str | None:
        return self.fields[2]

    def drawn_as(self, other: _BarUpdate) -> bool:
        """Whether this is a redraw of ``other``: same epoch, counter and step fields."""
        return (self.epoch, self.counter, self.fields) == (other.epoch, other.counter, other.fields)


class Reader:
    """One rank's NeMo step lines, as they stream in."""

    def __init__(self, path: Path, global_batch_size: int | None = None) -> None:
        self.path = path
        self.log = StepLog(path)
        self.given_batch = global_batch_size
        self._bar_batch: int | None = None  # consumed_samples / step where both are exact
        self._last: _BarUpdate | None = None
        self._last_step: int | None = None
        self._last_fresh = False  # the last update showed its own counter's step (not the one before)
        self.styles: set[str] = set()
        self.rate_field: str | None = None  # the RATE_FIELDS name the lines print

    def feed(self, line: Line) -> bool:
        """Take one line; True when it was a step line."""
        if TAG not in line.text:
            return False
        printer = _PRINTER.search(line.text)
        if printer:
            self._printer_line(line, printer.end())
        elif "=" in line.text:
            self._bar_update(line)
        else:
            return False
        return True

    # ------------------------------------------------------------------------------ NeMo 2
    def _printer_line(self, line: Line, fields_at: int) -> None:
        self.styles.add("NeMo 2 progress printer")
        fields = {name.strip(): value for name, value in _PRINTER_FIELD.findall(line.text[fields_at:])}
        if "global_step" not in fields or TAG not in fields:
            raise ReportError(f"{self.path}: line {line.number}: a NeMo 2 progress line without global_step or "
                              f"`{TAG}` (is the log cut? give the whole log)")
        global_step = self._integer(fields["global_step"], "global_step", line)
        batch = fields.get("global_batch_size")
        self.log.add(Step(global_step + 1, self._seconds(fields[TAG], line),
                          self._integer(batch, "global_batch_size", line) if batch else None, line.number,
                          tflops_per_gpu=self._stated_rate(fields)))

    def _stated_rate(self, fields: dict[str, str]) -> float | None:
        """The FLOPs callback's figure on the line; NaN where it is no number (then named, not read)."""
        name = next((name for name in RATE_FIELDS if name in fields), None)
        if name is None:
            return None
        self.rate_field = self.rate_field or name
        try:
            return parse_number(fields[name])
        except ValueError:
            return math.nan

    # ------------------------------------------------------------------------------ NeMo 1.x
    def _bar_update(self, line: Line) -> None:
        end = line.text.find("]", line.text.find(TAG))
        postfix = line.text if end < 0 else line.text[:end]
        found: dict[str, str] = {}
        for name, value in _BAR_FIELD.findall(postfix):  # the bar's own postfix only, not text printed after it
            found.setdefault(name, value)
        if TAG not in found:
            return
        self.styles.add("NeMo 1.x progress bar")
        if "global_step" not in found:
            raise ReportError(f"{self.path}: line {line.number}: a progress bar with `{TAG}` but no global_step, so "
                              "no step number (give the log of a NeMo run as it printed it)")
        if not math.isfinite(parse_number(found["global_step"])):
            raise ReportError(f"{self.path}: line {line.number}: the progress bar prints global_step="
                              f"{found['global_step']}, not a step number (give the log as the job wrote it)")
        counter = _BAR_COUNTER.search(line.text)
        epoch = _BAR_EPOCH.search(line.text)
        update = _BarUpdate(int(epoch.group(1)) if epoch else None, int(counter.group(1)) if counter else None,
                            tuple(found.get(name) for name in ("global_step", "consumed_samples", TAG,
                                                               "reduced_train_loss")), line.number)
        last = self._last
        if last is not None and update.drawn_as(last):
            return  # the same update drawn again
        self._learn_batch(update)
        step, fresh = self._number(update, last)
        self._last, self._last_fresh = update, fresh
        if step is None:
            return  # a step shown again at the next counter after a redraw
        self._last_step = step
        self.log.add(Step(step, self._seconds(update.seconds, line), self._batch_of(update, step), line.number))

    def _number(self, update: _BarUpdate, last: _BarUpdate | None) -> tuple[int | None, bool]:
        """(step of the update, whether it shows its own counter's step); step None: already counted."""
        low, high = self._step_range(update)
        expected, fresh = self._expected_step(update, last)
        if expected is not None and expected == self._last_step:
            if update.fields == last.fields:
                return None, False
            expected = self._last_step + 1
        if low == high:
            return low, fresh
        if expected is None:
            raise ReportError(
                f"{self.path}: line {update.line}: cannot tell which step the first progress bar update is: it "
                f"prints {self._shown(update)}, rounded by tqdm, which allows steps {low:,} to {high:,} (give the "
                "log from the start of the run, where the bar prints exact step numbers)")
        if not low <= expected <= high:
            raise ReportError(
                f"{self.path}: line {update.line}: the progress bar updates count step {expected:,} here but it "
                f"prints {self._shown(update)}, which allows steps {low:,} to {high:,} only (updates are missing "
                "from the log, or it holds more than one run: give one run's complete log)")
        return expected, fresh

    def _expected_step(self, update: _BarUpdate, last: _BarUpdate | None) -> tuple[int | None, bool]:
        if self._last_step is None or last is None:
            return None, False
        if update.counter is None or last.counter is None or update.epoch != last.epoch:
            return self._last_step + 1, False
        advance = update.counter - last.counter
        if advance == 0:
            return self._last_step + 1, True  # redrawn with the next step's metrics
        if advance < 0:
            return self._last_step + 1, False
        return self._last_step + advance - (1 if self._last_fresh else 0), False

    def _step_range(self, update: _BarUpdate) -> tuple[int, int]:
        """The steps the printed global_step and consumed_samples allow, as whole numbers (inclusive)."""
        low, high = 1, 2**63
        if update.global_step is not None:
            first, last = tqdm_range(update.global_step)
            low, high = max(low, math.ceil(first - 1e-9) + 1), min(high, math.floor(last + 1e-9) + 1)
        batch = self._bar_batch or self.given_batch  # the log's own first: a wrong given one is named later
        if update.consumed_samples is not None and batch:
            first, last = tqdm_range(update.consumed_samples)
            low, high = max(low, math.ceil(first / batch - 1e-9)), min(high, math.floor(last / batch + 1e-9))
        if low > high:
            raise ReportError(
                f"{self.path}: line {update.line}: the progress bar prints {self._shown(update)}, which do not "
                f"fit one step at {batch} samples per step (a batch-size ramp, or a wrong --global-batch-size)")
        return low, high

    def _learn_batch(self, update: _BarUpdate) -> None:
        """The log's samples per step, from the first update whose step and consumed_samples are both exact."""
        if self._bar_batch is None and update.global_step is not None:
            low, high = tqdm_range(update.global_step)
            if low == high and math.isfinite(low):
                self._bar_batch = self._batch_of(update, int(low) + 1)

    @staticmethod
    def _batch_of(update: _BarUpdate, step: int) -> int | None:
        """consumed_samples / step where consumed_samples is exact and divides evenly."""
        if update.consumed_samples is None:
            return None
        low, high = tqdm_range(update.consumed_samples)
        if low != high or not math.isfinite(low) or low <= 0 or low % step:
            return None
        return int(low) // step

    @staticmethod
    def _shown(update: _BarUpdate) -> str:
        names = ("global_step", "consumed_samples")
        shown = zip(names, update.fields[:2], strict=True)
        return ", ".join(f"{name}={value}" for name, value in shown if value is not None)

    # ------------------------------------------------------------------------------ numbers
    def _seconds(self, text: str | None, line: Line) -> float:
        try:
            return parse_number(text or "")
        except ValueError:
            raise ReportError(f"{self.path}: line {line.number}: `{TAG}` is {text!r}, not a number (is the line "
                              "cut? give the log as the job wrote it)") from None

    def _integer(self, text: str, name: str, line: Line) -> int:
        try:
            value = parse_number(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value != int(value) or value < 0:
            raise ReportError(f"{self.path}: line {line.number}: {name} is {text!r}, not a whole number (is the "
                              "line cut? give the log as the job wrote it)")
        return int(value)
