"""A log file as text lines, each tagged with the rank that printed it, read in bounded memory.

Cluster logs interleave what many processes print, each launcher with its own prefix:
``srun --label`` puts `` 12: `` before every line, torchrun ``--tee``/``--redirect`` puts
``[default3]:``, NeMo-Run's TorchX ``pretraining/0 [default3]:``, PyTorch's distributed logging
``[rank3]:``, Ray ``(name, pid=42)``;
``kubectl logs --timestamps`` and many wrappers put a timestamp first. Progress bars redraw with
carriage returns, so one file line can hold thousands of updates. This module splits a file on
both ``\\n`` and ``\\r``, strips those prefixes and says which rank each piece came from; the
format readers then never see a prefix and the importer can read one rank at a time. Terminal
control sequences (colours from a console logger or ``FORCE_COLOR``, tqdm's cursor moves) are
removed first: they carry no value, and may sit inside a field, between its name and its number.
A log that went through syslog (rsyslog, and the services that collect from it) has its control
characters written as ``#`` and three octal digits: a progress bar's carriage return as ``#015``,
a colour's escape as ``#033``; they are read as the characters they stand for.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from nemo_throughput.errors import ReportError
from nemo_throughput.importers import notice

CHUNK_BYTES = 1 << 20
SNIFF_BYTES = 64 * 1024
MAX_PIECE_BYTES = 256 * 1024  # a longer run of bytes without \n or \r is not a log line: skipped
MAX_UNDECODABLE_SHARE = 0.01  # of the first SNIFF_BYTES: more and the file is not text
WAIT_NOTICE_S = 2.0  # a named pipe no program writes to yet: said after this long
PROGRESS_EVERY_S = 5.0  # a long read says how far it is, at most this often (a million-step log: a minute a pass)
WAITING = "a named pipe no program has opened for writing yet: waiting for one (Ctrl-C stops)"

_TIMESTAMP = re.compile(r"\s*\[?\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?\]?\s+")
_SRUN = re.compile(r"\s*(\d+): ")
_TORCHX = re.compile(r"[\w.-]+/(\d+) (?=\[(?:default|rank)\d+\]:)")  # NeMo-Run (TorchX): "<role>/<replica> "
_TORCHRUN = re.compile(r"\[(?:default|rank)(\d+)\]:\s?")
_PROCESS = re.compile(r"\([\w.-]+, pid=(\d+)(?:, ip=[\d.]+)?\)\s")
_CONTROL_SEQUENCE = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")  # ECMA-48 CSI: colours, cursor moves, erasing
# rsyslog's EscapeControlCharactersOnReceive: `#` and three octal digits (not `#0152`, an issue's number)
_SYSLOG_ESCAPES = re.compile(r"#0(33|15)(?!\d)")
_SYSLOG_CHARACTERS = {"33": "\x1b", "15": "\r"}


@dataclass(frozen=True)
class Line:
    """One piece of a log between line breaks or carriage returns."""

    number: int  # 1-based line (\n) number in the file
    rank: str | None  # "3" (srun or torchrun), "0/3" (srun task or TorchX replica 0, local rank 3), "pid 42"
    text: str  # with the prefixes and terminal control sequences removed
    redraw: bool  # came after a carriage return: a progress bar drawn again on the same line
    cut: bool = False  # the file's last piece, without a line break: maybe cut while being written


_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
_SPACES = re.compile(r"\s+")


def cut_reason(last: Line, before: Line | None, is_whole: Callable[[str], bool]) -> str | None:
    """Why the last step line of a log looks cut (the job killed, or the file copied, while it was
    printed), or None: it has no line break and lacks its format's end (``is_whole``); the step line
    before it has that end and it does not; or it stops within the fields of the line before it
    (what follows where they differ, if anything, holds no `|` field: Slurm's kill message, say)."""
    if last.cut and not is_whole(last.text):
        return "no line break, and not the end of a step line"
    if before is None:
        return None
    if is_whole(before.text) and not is_whole(last.text):
        return "not the end of a step line, as the line before it has"
    shape, before_shape = _shape(last.text), _shape(before.text)
    common = len(os.path.commonprefix([shape, before_shape]))
    if common < len(before_shape) and "|" not in shape[common:]:
        return "it stops within the fields of the step line before it"
    return None


def _shape(text: str) -> str:
    """A line with each number as `#` and each run of spaces as one."""
    return _SPACES.sub(" ", _NUMBER.sub("#", text)).strip()


def check_text(path: Path) -> None:
    """Refuse binary input early, naming the file, before any line is parsed."""
    head = _read_head(path)
    if b"\x00" in head:
        raise ReportError(f"{path}: binary data (NUL bytes), not a text log (give the training log, e.g. the "
                          "Slurm .out file, or a TensorBoard event file)")
    undecodable = head.decode("utf-8", errors="replace").count("\ufffd")
    if head and undecodable > MAX_UNDECODABLE_SHARE * len(head):
        raise ReportError(f"{path}: not UTF-8 text: {undecodable:,} undecodable bytes in the first {len(head):,} "
                          "(give the training log as the job wrote it)")


def read_lines(path: Path) -> Iterator[Line]:
    """Every piece of text of the file in order, with its rank; pieces longer than MAX_PIECE_BYTES skipped."""
    number, rank, after_return = 1, None, False
    for piece, separator in _pieces(path):
        texts = _unescape_syslog(piece.decode("utf-8", errors="replace")) if piece else []
        for index, text in enumerate(texts):
            redraw = after_return or index > 0  # after a carriage return, real or written as #015
            if not text:
                continue
            if "\x1b" in text:
                text = _CONTROL_SEQUENCE.sub("", text)
            own_rank, text = strip_prefixes(text)
            if not redraw or own_rank is not None:
                rank = own_rank
            yield Line(number, rank, text, redraw, cut=not separator and index == len(texts) - 1)
        after_return = separator == b"\r"
        if separator == b"\n":
            number, rank = number + 1, None


def _unescape_syslog(text: str) -> list[str]:
    """A piece of text with syslog's escapes read back, split where it holds carriage returns."""
    if "#0" not in text:
        return [text]
    text = _SYSLOG_ESCAPES.sub(lambda found: _SYSLOG_CHARACTERS[found.group(1)], text)
    return text.split("\r")


def strip_prefixes(text: str) -> tuple[str | None, str]:
    """(rank label or None, text without launcher and timestamp prefixes)."""
    text = _strip(_TIMESTAMP, text)[1]
    labels = []
    for pattern in (_SRUN, _TORCHX, _TORCHRUN):
        label, text = _strip(pattern, text)
        if label is not None:
            labels.append(label)
    if not labels:
        pid, text = _strip(_PROCESS, text)
        if pid is not None:
            labels.append(f"pid {pid}")
    return ("/".join(labels) if labels else None), text


def _strip(pattern: re.Pattern[str], text: str) -> tuple[str | None, str]:
    match = pattern.match(text)
    if not match:
        return None, text
    return (match.group(1) if pattern.groups else ""), text[match.end():]


def _pieces(path: Path) -> Iterator[tuple[bytes, bytes]]:
    """(bytes, the separator that ended them: b"\\n", b"\\r" or b"" at the end of the file)."""
    pending = b""
    skipping = False  # inside an over-long piece: drop bytes up to the next separator
    progress = _Progress(path)
    try:
        with open_input(path) as f:
            while chunk := f.read(CHUNK_BYTES):
                progress.read(len(chunk))
                pending += chunk
                parts = re.split(rb"([\r\n])", pending)
                pending = parts.pop()
                for i in range(0, len(parts), 2):
                    yield (b"" if skipping else parts[i]), parts[i + 1]
                    skipping = False
                if len(pending) > MAX_PIECE_BYTES:
                    pending, skipping = b"", True
    except OSError as error:
        raise ReportError(f"{path}: cannot read it ({error.strerror or error})") from error
    if pending and not skipping:
        yield pending, b""


class _Progress:
    """A line on stderr every PROGRESS_EVERY_S while one pass over a file goes on, so that a long import
    does not look hung; none for a file read within that time."""

    def __init__(self, path: Path) -> None:
        self.path, self.done = path, 0
        self.next_at = time.monotonic() + PROGRESS_EVERY_S

    def read(self, count: int) -> None:
        self.done += count
        if time.monotonic() < self.next_at:
            return
        self.next_at = time.monotonic() + PROGRESS_EVERY_S
        print(notice(self.path, f"still reading: {self._how_far()} in this pass"), file=sys.stderr, flush=True)

    def _how_far(self) -> str:
        """The share read of the file's size now: a log still being written grows as it is read, one
        truncated or removed meanwhile has no size to tell of (then the bytes read are said)."""
        try:
            size = input_size(self.path)
        except OSError:
            size = 0
        if size < self.done:
            return f"{self.done / 1e6:,.0f} MB read"
        return f"{self.done / size:.0%} of its {size / 1e6:,.0f} MB"


def _read_head(path: Path) -> bytes:
    try:
        with open_input(path) as f:
            return f.read(SNIFF_BYTES)
    except OSError as error:
        raise ReportError(f"{path}: cannot read it ({error.strerror or error})") from error


_COPIES: dict[Path, Path] = {}  # an input that can be read only once -> the file its one reading went to


@contextmanager
def read_once(path: Path) -> Iterator[None]:
    """Within it, `path` can be read many times even when it is a named pipe or `<(command)`: such an
    input is read once, into a temporary file that `open_input` and `input_size` then use."""
    if not _is_stream(path):
        yield
        return
    # Opening a named pipe waits for a writer, for ever if none comes: after a while, say so.
    waiting = threading.Timer(WAIT_NOTICE_S, lambda: print(notice(path, WAITING), file=sys.stderr, flush=True))
    waiting.daemon = True
    with tempfile.NamedTemporaryFile(prefix="nemo-throughput-import-") as copy:
        waiting.start()
        try:
            with path.open("rb") as stream:
                waiting.cancel()
                shutil.copyfileobj(stream, copy, CHUNK_BYTES)
        except OSError as error:
            raise ReportError(f"{path}: cannot read it ({error.strerror or error})") from error
        finally:
            waiting.cancel()
        copy.flush()
        _COPIES[path] = Path(copy.name)
        try:
            yield
        finally:
            del _COPIES[path]


def open_input(path: Path) -> BinaryIO:
    """The input's bytes from the start: its copy where `read_once` made one."""
    return _COPIES.get(path, path).open("rb")


def input_size(path: Path) -> int:
    return _COPIES.get(path, path).stat().st_size


def _is_stream(path: Path) -> bool:
    """A FIFO or character device (`<(command)` is one): what is read from it is gone."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return False  # the reader says what is wrong with it
    return stat.S_ISFIFO(mode) or stat.S_ISCHR(mode)
