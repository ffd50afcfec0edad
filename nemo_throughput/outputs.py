"""Where commands write, checked before any work: one rule for every `--output` and output directory.

A command that trains for an hour, imports a thousand files or renders a report must not find
out at the end that it cannot write its result, nor overwrite what it just read or another
run's summary. Messages are one line, with the path made printable.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from pathlib import Path

from nemo_throughput.errors import NemoThroughputError
from nemo_throughput.text import printable

# A file that starts like this is a run's summary (summary.SCHEMA, without importing torch here).
_SUMMARY_MARK = b'"schema": "nemo-throughput/summary'


class OutputPathError(NemoThroughputError, ValueError):
    """An output path that cannot be used as asked, with what to do instead."""


def check_output_file(path: str | os.PathLike, option: str, *, reads: Iterable[str | os.PathLike] = ()) -> Path:
    """`path` as a file this command may create or replace, or `OutputPathError`.

    Refused: a directory; a path under a file; a directory that does not exist (not created: a
    typo should leave nothing behind); a directory that cannot be written; one of the files the
    command `reads`; a run's summary.
    """
    path = Path(path)
    shown = printable(path)
    _refuse_a_name_too_long(path, option)
    if path.is_dir():
        raise OutputPathError(f"{option} {shown} is a directory; give a file name")
    _refuse_a_file_above(path, option)
    parent = path.parent
    if not parent.is_dir():
        raise OutputPathError(f"{option} {shown}: directory {printable(parent)} does not exist; create it first")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputPathError(f"{option} {shown}: directory {printable(parent)} cannot be written")
    for read in reads:
        if _same_file(path, Path(read)):
            raise OutputPathError(f"{option} {shown} is one of the files this command reads; write elsewhere")
    if _is_summary(path):
        raise OutputPathError(f"{option} {shown} is a run's summary; write elsewhere")
    return path


def write_output(text: str, path: Path | None, option: str) -> None:
    """A command's result: to `path` (checked before with :func:`check_output_file`), or to stdout
    when None. `OutputPathError` when the file cannot be written after all (a full disk)."""
    if path is None:
        sys.stdout.write(text)
        return
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as error:
        raise OutputPathError(f"{option} {printable(path)}: cannot write it ({error.strerror or error})") from error


def check_output_dir(path: str | os.PathLike, option: str) -> Path:
    """`path` as a directory this command may create (with its parents) and write in, or `OutputPathError`.

    Refused: an existing file; a path under a file; a nearest existing directory that cannot be
    written. Nothing is created here.
    """
    path = Path(path)
    _refuse_a_name_too_long(path, option)
    if path.exists() and not path.is_dir():
        raise OutputPathError(f"{option} {printable(path)} is a file, not a directory")
    _refuse_a_file_above(path, option)
    existing = next(p for p in (path, *path.absolute().parents) if p.exists())
    if not os.access(existing, os.W_OK | os.X_OK):
        raise OutputPathError(f"{option} {printable(path)}: directory {printable(existing)} cannot be written")
    return path


def _refuse_a_name_too_long(path: Path, option: str) -> None:
    # ENAMETOOLONG is not "missing" to pathlib: every later is_dir()/exists() would raise it
    try:
        path.exists()
    except OSError as error:
        raise OutputPathError(f"{option} {printable(path)}: {error.strerror}") from None


def _refuse_a_file_above(path: Path, option: str) -> None:
    for above in path.absolute().parents:
        if above.exists():
            if not above.is_dir():
                raise OutputPathError(f"{option} {printable(path)}: {printable(above)} is a file, not a directory")
            return


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def _is_summary(path: Path) -> bool:
    try:
        with path.open("rb") as f:
            return _SUMMARY_MARK in f.read(4096)
    except OSError:
        return False
