"""TensorBoard event files of NeMo runs: the ``train_step_timing in s`` scalar, and the
``global_batch_size`` one NeMo logs (NeMo 2 at every step, NeMo 1.x during a batch-size ramp).

An event file is a sequence of TFRecords: uint64 length, uint32 masked CRC-32C of the length,
the data, uint32 masked CRC-32C of the data (little-endian). Every header's checksum is
verified and every length is checked against what is left of the file before anything is
read, so a file that is not an event file is refused at its first record, in bounded memory.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from nemo_throughput.errors import ReportError
from nemo_throughput.importers.lines import input_size, open_input
from nemo_throughput.importers.steps import Step, StepLog

NAME = "tensorboard"
TAG = "train_step_timing in s"
BATCH_TAG = "global_batch_size"
BATCH_ORIGIN = f"the `{BATCH_TAG}` scalar"
MAX_RECORD_BYTES = 64 << 20  # scalars take bytes; a larger record is not one of NeMo's
CHECKED_DATA_RECORDS = 8  # data checksums verified on the first records (pure Python CRC is slow)


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
                          "directory TensorBoardLogger wrote)")
    return files


def read_steps(path: Path) -> StepLog:
    """The step times (step, seconds) from an event file or a directory of them, steps from 1, each
    with the batch its step logged (None where it logged none, or not a whole positive number)."""
    log = StepLog(path, place="value", split="the run restarted from a checkpoint and logged its steps again: "
                  "import each event file, or each segment's directory, on its own")
    for file in event_files(path):
        times, batches = [], {}
        for tag, step, value in _scalars(file, (TAG, BATCH_TAG)):
            if tag == TAG:
                times.append((step, value))
            else:
                batches[step] = int(value) if math.isfinite(value) and value >= 1 and value.is_integer() else None
        for step, value in times:  # `line`: the value's place among all files' step times
            log.add(Step(step + 1, value, batches.get(step), len(log.steps) + 1))
    if not log.steps:
        raise ReportError(f"{path}: no `{TAG}` scalar in its event files (give the event files of a NeMo training "
                          "run, whose timing callback logs it)")
    return log


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

