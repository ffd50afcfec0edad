"""TensorBoard event files of NeMo and Megatron runs: the step-time scalar and the batch-size
scalar each writes, told apart by the step-time scalar's tag.

- NeMo: ``train_step_timing in s``, each step's own time, at NeMo's 0-based global step; and
  ``global_batch_size`` (NeMo 2 at every step, NeMo 1.x during a batch-size ramp).
- Megatron-LM and Megatron-Bridge: ``training_log`` (Megatron-LM ``megatron/training/training.py``
  since 3a26a168, January 2021, to d98e8a64; Bridge ``src/megatron/bridge/training/utils/
  train_utils.py``, v0.2.0 to 067f987d) writes, from the last rank, ``iteration-time`` every
  ``--log-interval`` iterations at the iteration number (from 1): seconds, the mean over the
  iterations since the last log, the text log's ``elapsed time per iteration (ms)`` in seconds;
  only with ``--log-timers-to-tensorboard`` (Bridge: ``logger.log_timers_to_tensorboard``).
  Each value counts as one sample at its iteration, as the text log's. ``batch-size``, the
  global batch of that iteration, is written every ``--tensorboard-log-interval`` iterations
  (Megatron-LM before core 0.9 only with ``--log-batch-size-to-tensorboard``). Not read:
  ``batch-size vs samples`` and the other ``... vs samples`` scalars (their step is the
  consumed samples); Bridge's throughput scalars (``throughput/tflops`` by its own FLOPs,
  ``throughput/samples_per_sec``, a rolling mean of the configured batch).

The frameworks' own model TFLOP/s per GPU are read beside the step times, for
:mod:`~nemo_throughput.importers.crosscheck_nemo` and ``crosscheck_megatron`` only, never as a rate:
NeMo's FLOPs callback's ``TFLOPS_per_GPU`` (``tflops_per_sec_per_gpu`` before NeMo 2.3) and
Megatron-LM's ``throughput`` (with ``--log-throughput``, at the iteration of the same
``iteration-time`` it divides by).

No writer logs both step-time scalars: event files with both are two runs', refused rather
than one picked.

An event file is a sequence of TFRecords: uint64 length, uint32 masked CRC-32C of the length,
the data, uint32 masked CRC-32C of the data (little-endian). Every header's checksum is
verified and every length is checked against what is left of the file before anything is
read, so a file that is not an event file is refused at its first record, in bounded memory.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from nemo_throughput.errors import ReportError
from nemo_throughput.importers.lines import input_size, open_input
from nemo_throughput.importers.steps import Step, StepLog

NAME = "tensorboard"
MAX_RECORD_BYTES = 64 << 20  # scalars take bytes; a larger record is not a training run's
CHECKED_DATA_RECORDS = 8  # data checksums verified on the first records (pure Python CRC is slow)


@dataclass(frozen=True)
class Writer:
    """What wrote an event file, told by its step-time scalar, and how its scalars read."""

    time_tag: str
    batch_tag: str
    step_offset: int  # added to an event's step to number steps from 1
    interval_means: bool  # each time is the mean of the log interval up to its step
    style: str  # environment.log_styles
    rate_tags: tuple[str, ...]  # the framework's own model TFLOP/s per GPU, at the step whose time it divides by

    @property
    def batch_origin(self) -> str:
        return f"the `{self.batch_tag}` scalar"


NEMO = Writer("train_step_timing in s", "global_batch_size", 1, False, "TensorBoard scalar",
              ("TFLOPS_per_GPU", "tflops_per_sec_per_gpu"))
MEGATRON = Writer("iteration-time", "batch-size", 0, True,
                  "TensorBoard `iteration-time` scalar of Megatron-LM / Megatron-Bridge (the mean of each log "
                  "interval)", ("throughput",))
WRITERS = (NEMO, MEGATRON)
# written by Megatron's training_log by default: tells a Megatron event file without its step times
MEGATRON_SIGNS = ("learning-rate", "loss-scale", "lm loss", "batch-size")
TIMING_FLAG = "--log-timers-to-tensorboard or Megatron-Bridge's logger.log_timers_to_tensorboard=True"
RESUMED = "or import each event file on its own"  # what else to do with the segments of a resumed run


@dataclass(frozen=True)
class EventSteps:
    log: StepLog
    writer: Writer
    rate_tag: str | None = None  # the writer's rate tag the files hold, if any


@dataclass(frozen=True)
class _Timed:
    """One step time of an event file, with what was logged at its step."""

    step: int
    seconds: float
    batch: int | None
    tflops_per_gpu: float | None


@dataclass
class _FileScalars:
    """One event file's step times per writer, the rate tags it holds, and whether Megatron wrote it."""

    file: Path
    timed: dict[Writer, list[_Timed]]
    megatron_signs: bool
    rate_tags: set[str] = field(default_factory=set)


def is_event_file(path: Path) -> bool:
    """Whether the file starts with a TFRecord whose header checksum holds."""
    try:
        with open_input(path) as f:
            header = f.read(12)
    except OSError:
        return False
    return len(header) == 12 and _masked_crc(header[:8]) == struct.unpack("<I", header[8:])[0]


def event_files(path: Path) -> list[Path]:
    files = sorted(p for p in path.rglob("*tfevents*") if p.is_file()) if path.is_dir() else [path]
    if not files:
        raise ReportError(f"{path}: no TensorBoard event files (*tfevents*) in it (give a log file, or the "
                          "directory TensorBoardLogger or Megatron's --tensorboard-dir wrote)")
    return files


def read_steps(path: Path) -> EventSteps:
    """The step times of an event file or a directory of them (files in name order, which is the
    order they were written in), steps from 1, each with the batch logged at its step (None where
    none was, or not a whole positive number)."""
    read = [_file_scalars(file) for file in event_files(path)]
    writer = _writer(path, read)
    log = StepLog(path, place="value", split=RESUMED)
    values = (value for scalars in read for value in scalars.timed[writer])
    for place, timed in enumerate(values, start=1):  # `line`: the place among all files' times
        log.add(Step(timed.step + writer.step_offset, timed.seconds, timed.batch, place,
                     tflops_per_gpu=timed.tflops_per_gpu))
    rate_tag = next((tag for tag in writer.rate_tags if any(tag in r.rate_tags for r in read)), None)
    return EventSteps(log, writer, rate_tag)


def _file_scalars(file: Path) -> _FileScalars:
    times: dict[Writer, list[tuple[int, float]]] = {writer: [] for writer in WRITERS}
    at_step: dict[str, dict[int, float]] = {}  # the batch and rate tags' values by step
    by_time_tag = {writer.time_tag: writer for writer in WRITERS}
    logged_with = [tag for writer in WRITERS for tag in (writer.batch_tag, *writer.rate_tags)]
    signs = False
    for tag, step, value in _scalars(file, (*by_time_tag, *logged_with, *MEGATRON_SIGNS)):
        signs = signs or tag in MEGATRON_SIGNS
        if tag in by_time_tag:
            times[by_time_tag[tag]].append((step, value))
        elif tag in logged_with:
            at_step.setdefault(tag, {})[step] = value
    timed = {writer: [_timed(writer, step, value, at_step) for step, value in times[writer]] for writer in WRITERS}
    return _FileScalars(file, timed, signs, set(at_step) - {writer.batch_tag for writer in WRITERS})


def _timed(writer: Writer, step: int, seconds: float, at_step: dict[str, dict[int, float]]) -> _Timed:
    batch = at_step.get(writer.batch_tag, {}).get(step)
    rate = next((at_step[tag][step] for tag in writer.rate_tags if step in at_step.get(tag, {})), None)
    return _Timed(step, seconds, None if batch is None else _whole_batch(batch), rate)


def _whole_batch(value: float) -> int | None:
    return int(value) if math.isfinite(value) and value >= 1 and value.is_integer() else None


def _writer(path: Path, read: list[_FileScalars]) -> Writer:
    """The one writer whose step times the files hold; refused where none or both do."""
    found = {writer: next((r.file for r in read if r.timed[writer]), None) for writer in WRITERS}
    if found[NEMO] and found[MEGATRON]:
        raise ReportError(f"{path}: both NeMo's `{NEMO.time_tag}` scalar ({found[NEMO].name}) and Megatron's "
                          f"`{MEGATRON.time_tag}` ({found[MEGATRON].name}): no run writes both (import each run's "
                          "event files on their own)")
    if found[MEGATRON]:
        return MEGATRON
    if found[NEMO]:
        return NEMO
    if any(r.megatron_signs for r in read):
        raise ReportError(f"{path}: Megatron-LM / Megatron-Bridge event files without the `{MEGATRON.time_tag}` "
                          f"scalar, which they write only with {TIMING_FLAG} (run with it, or import the job's text "
                          "log with --format megatron)")
    raise ReportError(f"{path}: no `{NEMO.time_tag}` scalar in its event files, nor Megatron's "
                      f"`{MEGATRON.time_tag}` (give the event files of a NeMo training run, whose timing callback "
                      f"logs the first, or of a Megatron-LM / Megatron-Bridge run with {TIMING_FLAG}, which writes "
                      "the second)")


def _scalars(file: Path, tags: tuple[str, ...]) -> Iterator[tuple[str, int, float]]:
    try:
        size = input_size(file)
        with open_input(file) as f:
            for number, record in enumerate(_records(f, size), start=1):
                try:
                    yield from _scalars_of_event(record, tags)
                except (IndexError, ValueError, struct.error, UnicodeDecodeError) as error:
                    raise ReportError(f"{file}: record {number} is not a readable event ({error}) (is the file "
                                      "cut or corrupted? give an intact event file)") from None
    except OSError as error:
        raise ReportError(f"{file}: cannot read it ({error.strerror or error})") from error


def _records(f: BinaryIO, size: int) -> Iterator[bytes]:
    offset, number = 0, 0
    while header := f.read(12):
        number += 1
        if len(header) < 12:
            raise _not_events(f, f"record {number} is cut short")
        (length,), (length_crc,) = struct.unpack("<Q", header[:8]), struct.unpack("<I", header[8:])
        if _masked_crc(header[:8]) != length_crc:
            raise _not_events(f, f"record {number}'s header checksum does not match")
        if length > MAX_RECORD_BYTES:
            raise _not_events(f, f"record {number} claims {length:,} bytes, more than any event takes")
        if length > size - offset - 16:
            raise _not_events(f, f"record {number} is cut short: it claims {length:,} bytes, the file holds "
                                 f"{max(size - offset - 16, 0):,} more")
        data, footer = f.read(length), f.read(4)
        if len(data) < length or len(footer) < 4:
            raise _not_events(f, f"record {number} is cut short")
        if number <= CHECKED_DATA_RECORDS and _masked_crc(data) != struct.unpack("<I", footer)[0]:
            raise _not_events(f, f"record {number}'s data checksum does not match")
        offset += 16 + length
        yield data


def _not_events(f: BinaryIO, what: str) -> ReportError:
    return ReportError(f"{f.name}: not a readable TensorBoard event file: {what} (give an intact *tfevents* file "
                       "or the directory TensorBoardLogger wrote)")


def _scalars_of_event(event: bytes, tags: tuple[str, ...]) -> Iterator[tuple[str, int, float]]:
    # Event{2: step (varint), 5: Summary{1: repeated Value{1: tag, 2: simple_value (float),
    # 8: TensorProto{1: dtype, 4: tensor_content, 5: float_val, 6: double_val}}}}
    step = 0
    summaries = []
    for number, _, value in _protobuf_fields(event):
        if number == 2:
            step = value
        elif number == 5:
            summaries.append(value)
    for summary in summaries:
        for number, _, value in _protobuf_fields(summary):
            if number != 1:
                continue
            fields = {n: v for n, _, v in _protobuf_fields(value)}
            tag = fields.get(1, b"").decode(errors="replace")
            if tag not in tags:
                continue
            if 2 in fields:
                yield tag, step, struct.unpack("<f", fields[2])[0]
            elif 8 in fields:
                yield tag, step, _tensor_scalar(fields[8])


def _tensor_scalar(tensor: bytes) -> float:
    fields = {n: v for n, _, v in _protobuf_fields(tensor)}
    if 5 in fields:  # float_val, packed
        return struct.unpack("<f", fields[5][:4])[0]
    if 6 in fields:  # double_val, packed
        return struct.unpack("<d", fields[6][:8])[0]
    content, dtype = fields.get(4, b""), fields.get(1, 1)
    return struct.unpack("<d" if dtype == 2 else "<f", content[:8 if dtype == 2 else 4])[0]


def _protobuf_fields(buffer: bytes) -> Iterator[tuple[int, int, Any]]:
    i = 0
    while i < len(buffer):
        key, i = _varint(buffer, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(buffer, i)
        elif wire == 1:
            value, i = buffer[i:i + 8], i + 8
        elif wire == 2:
            length, i = _varint(buffer, i)
            value, i = buffer[i:i + length], i + length
        elif wire == 5:
            value, i = buffer[i:i + 4], i + 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        if i > len(buffer):
            raise ValueError("a field runs past the end of its message")
        yield number, wire, value


def _varint(buffer: bytes, i: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = buffer[i]
        i += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, i
        shift += 7
        if shift > 63:
            raise ValueError("a varint longer than 64 bits")


def _crc32c_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
        table.append(crc)
    return table


_CRC_TABLE = _crc32c_table()


def _masked_crc(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _CRC_TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    crc ^= 0xFFFFFFFF
    return ((crc >> 15 | crc << 17) + 0xA282EAD8) & 0xFFFFFFFF

