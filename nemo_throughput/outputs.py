"""Where commands write, checked before any work: one rule for every `--output` and output directory.

A command that trains for an hour, imports a thousand files or renders a report must not find
out at the end that it cannot write its result, nor overwrite what it just read or another
run's summary. Messages are one line, with the path made printable. Every file is written whole
or not at all (:func:`write_text_atomic`): a reader never sees half of one, and a link at the
path is replaced, never followed to overwrite (or change the mode of) what it points to.
"""

from __future__ import annotations

import os
import secrets
import stat
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

    Refused: a directory; a FIFO, socket or device; a path under a file; a directory that does not
    exist (not created: a typo should leave nothing behind); a directory that cannot be written;
    one of the files the command `reads`; a run's summary.
    """
    path = Path(path)
    shown = printable(path)
    _refuse_a_name_too_long(path, option)
    if path.is_dir():
        raise OutputPathError(f"{option} {shown} is a directory; give a file name")
    if path.exists() and not path.is_file():  # a FIFO would block the summary check below, and the write
        raise OutputPathError(f"{option} {shown} is not a regular file (a FIFO, socket or device); give a file name")
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
        write_text_atomic(path, text, durable=False)
    except OSError as error:
        raise OutputPathError(f"{option} {printable(path)}: cannot write it ({error.strerror or error})") from error


def write_text_atomic(path: str | os.PathLike, text: str, durable: bool = True, mode: int | None = None) -> None:
    """Write ``text`` (UTF-8) so that readers see the old file or the new one, never a mix
    (:func:`write_bytes_atomic`)."""
    write_bytes_atomic(path, text.encode("utf-8"), durable, mode)


def write_bytes_atomic(path: str | os.PathLike, data: bytes, durable: bool = True, mode: int | None = None) -> None:
    """Write ``data`` so that readers see the old file or the new one, never a mix.

    Writes a temporary file in the same directory and renames it over ``path`` (atomic on POSIX
    file systems; a link at ``path`` is replaced, its target untouched). ``durable`` also fsyncs it
    before the rename, so that it survives a machine crash, at the cost of a disk flush (about a
    millisecond). The file gets the user's umask like any log (a team reads each other's runs),
    or ``mode`` where given (an executable script).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _create_temporary(path)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if mode is not None:
                os.fchmod(f.fileno(), mode)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _create_temporary(path: Path) -> tuple[int, Path]:
    # Not tempfile.mkstemp: it creates files 0600 whatever the umask; here the kernel applies it.
    while True:
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), tmp
        except FileExistsError:
            continue


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
    try:  # never waiting: a FIFO planted after the check above would block the open
        with os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as f:
            return stat.S_ISREG(os.fstat(f.fileno()).st_mode) and _SUMMARY_MARK in f.read(4096)
    except OSError:
        return False
