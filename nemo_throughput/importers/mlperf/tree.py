"""The MLPerf result files to import: each file given, and the ``result_*.txt`` files found under each
folder given (a submitter's folder: those of ``results/<system>/<benchmark>/``, result_summarizer's
layout). A tree is walked without following links to folders and nothing but a regular file is ever
opened; what is left out (links to nowhere, FIFOs, unreadable files) is said, each with why.
"""

from __future__ import annotations

import errno
import fnmatch
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from nemo_throughput.errors import ReportError
from nemo_throughput.text import printable

RESULT_GLOB = "result_*.txt"  # result_summarizer's file pattern
GIVE_A_RESULT_FILE = "(give a readable MLPerf Training result file, or the folder that holds them)"
MAX_LISTED = 10  # files left out named one per line; the rest are counted


class NotAResultFile(ReportError):
    """A file named like a result file that holds none (empty: a copy cut short; or other text)."""

    def __init__(self, path: Path, why: str) -> None:
        super().__init__(f"{printable(path)}: {why} {GIVE_A_RESULT_FILE}")
        self.left_out = f"{printable(path)}: {why}"  # as said of a file found in a directory


@dataclass
class FoundResults:
    """The result files to import: each given file, and those found under each given directory; and
    what was left out of the directories (a tree holds links to nowhere, FIFOs, folders named like a
    result file, files that cannot be read), each with why."""

    files: list[Path] = field(default_factory=list)
    named: set[Path] = field(default_factory=set)  # given on the command line: refused, never left out
    links: list[str] = field(default_factory=list)  # links to another file found: the same run, imported once
    left_out: list[str] = field(default_factory=list)  # "<path>: <why>"

    def leave_out(self, path: Path, error: NotAResultFile) -> None:
        """A file found in a directory that holds no result is left out, said; one the user named is refused."""
        if path in self.named:
            raise error
        self.left_out.append(error.left_out)

    def notes(self) -> list[str]:
        """Said once per command: the links imported once, and the files left out (the first
        MAX_LISTED named, the rest counted)."""
        listed = [f"left out {entry}" for entry in self.left_out[:MAX_LISTED]]
        if len(self.left_out) > MAX_LISTED:
            listed.append(f"and {len(self.left_out) - MAX_LISTED} more result file(s) left out")
        return [*self.links, *listed]

    def refuse_if_none(self, imported: int) -> None:
        """Nothing importable remains: refused, naming the first files left out and why."""
        if imported == 0:
            shown = "; ".join(self.left_out[:3]) + ("; ..." if len(self.left_out) > 3 else "")
            raise ReportError(f"no result file could be imported: {len(self.left_out)} left out ({shown}) "
                              "(fix or remove them, or give the result files that can be read)")


def result_files(paths: list[Path]) -> FoundResults:
    """Files as given (one that cannot be read is refused); directories expand to the ``result_*.txt``
    files under them, in name order (a submitter folder, with ``results/`` and ``systems/``: those of
    ``results/<system>/<benchmark>/``), each run once, those that cannot be read left out and said."""
    found = FoundResults()
    for path in paths:
        if path.is_dir():
            _add_directory(found, path)
            continue
        why = unreadable_file(path)
        if why is not None:
            raise ReportError(f"{printable(path)}: {why} {GIVE_A_RESULT_FILE}")
        found.files.append(path)
        found.named.add(path)
    return found


def _add_directory(found: FoundResults, folder: Path) -> None:
    depth = SUBMITTER_DEPTH if _is_submitter(folder) else None
    candidates, left_out = _walk(folder / "results" if depth else folder, depth)
    if not candidates and not left_out:
        raise ReportError(f"{printable(folder)}: no MLPerf result files ({RESULT_GLOB}) under it (give the result "
                          "files or the directory that holds them)")
    found.left_out.extend(left_out)
    files, links = _each_run_once(candidates)
    found.files.extend(files)
    found.links.extend(links)


SUBMITTER_DEPTH = 2  # results/<system>/<benchmark>/result_*.txt, result_summarizer's layout


def _walk(folder: Path, depth: int | None) -> tuple[list[Path], list[str]]:
    """The readable ``result_*.txt`` files under ``folder`` (at ``depth`` folders down, or any), and
    "<path>: <why>" for each entry of that name left out and each folder not walked. Links to folders
    are not followed (a link to ``/`` or a loop of links would walk without end), and nothing but a
    regular file is ever opened (a FIFO would block)."""
    candidates: list[Path] = []
    left_out: list[str] = []
    pending = [(folder, 0)]
    while pending:
        current, level = pending.pop()
        try:
            entries = sorted(os.scandir(current), key=lambda entry: entry.name)
        except OSError as error:
            if level == 0:  # the folder given (or its results/): named by the user, refused
                raise ReportError(f"{printable(current)}: a folder that cannot be read ({_os_reason(error)}) (check "
                                  "its permissions)") from error
            left_out.append(f"{printable(current)}: a folder that cannot be read ({_os_reason(error)}): not walked")
            continue
        for entry in entries:
            path, descend = Path(entry.path), depth is None or level < depth
            if descend and _is_folder(entry):
                pending.append((path, level + 1))
            elif descend and _is_link_to_folder(entry):
                left_out.append(f"{printable(path)}: a link to a folder: not walked (give it on the command line "
                                "to import the result files under it)")
            elif (depth is None or level == depth) and fnmatch.fnmatchcase(entry.name, RESULT_GLOB):
                why = unreadable_file(path)
                (candidates.append(path) if why is None else left_out.append(f"{printable(path)}: {why}"))
    return sorted(candidates), sorted(left_out)


def _each_run_once(files: list[Path]) -> tuple[list[Path], list[str]]:
    """A directory's result files, a link among them to another of them (result_1.txt -> result_2.txt)
    left out, as is a second link to one file: the same run, imported once, and said."""
    kept: dict[Path, Path] = {}
    for file in sorted(files, key=Path.is_symlink):  # the files themselves before the links to them
        kept.setdefault(file.resolve(), file)
    notes = [f"{printable(file)} is a link to {printable(kept[file.resolve()])}: the same run, imported once"
             for file in files if kept[file.resolve()] != file]
    return sorted(kept.values()), notes


def _is_folder(entry: os.DirEntry) -> bool:
    """A real folder (not a link to one) that is not named like a result file."""
    try:
        return entry.is_dir(follow_symlinks=False) and not fnmatch.fnmatchcase(entry.name, RESULT_GLOB)
    except OSError:
        return False


def _is_link_to_folder(entry: os.DirEntry) -> bool:
    try:
        return entry.is_symlink() and entry.is_dir()
    except OSError:  # a loop of links, or one to nowhere
        return False


def unreadable_file(path: Path) -> str | None:
    """Why ``path`` cannot be read as a result file, or None: it must be (or link to) a regular file
    that opens for reading. A FIFO, socket or device is never opened; a link to nowhere or a loop of
    links, a folder, and a file without read permission are each named."""
    try:
        mode = path.stat().st_mode  # follows links
    except OSError as error:
        return _missing(path, error)
    if stat.S_ISDIR(mode):
        return "a folder named like a result file, not a file: not walked" if \
            fnmatch.fnmatchcase(path.name, RESULT_GLOB) else "a folder, not a result file"
    if not stat.S_ISREG(mode):
        return f"a {_file_kind(mode)}, not a regular file: not opened"
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK))  # regular: opening cannot block
    except OSError as error:
        return f"cannot be opened for reading ({_os_reason(error)})"
    return None


def _missing(path: Path, error: OSError) -> str:
    if error.errno == errno.ELOOP:
        return "a loop of links: it links to no file"
    if path.is_symlink():
        return f"a link to {printable(os.readlink(path))}, which does not exist"
    if error.errno == errno.ENOENT:
        return "no such file or directory"
    return f"cannot be read ({_os_reason(error)})"


def _file_kind(mode: int) -> str:
    kinds = ((stat.S_ISFIFO, "FIFO (named pipe)"), (stat.S_ISSOCK, "socket"), (stat.S_ISCHR, "character device"),
             (stat.S_ISBLK, "block device"))
    return next((kind for test, kind in kinds if test(mode)), "special file")


def _os_reason(error: OSError) -> str:
    return printable(error.strerror or error)


def _is_submitter(folder: Path) -> bool:
    """A submitter's folder as result_summarizer recognises one: ``results/`` and ``systems/`` in it."""
    try:
        return (folder / "results").is_dir() and (folder / "systems").is_dir()
    except OSError:  # a folder that cannot be searched: walking it says why
        return False
