"""The two sides of a comparison: each a summary, or a directory of summaries that are repeats of
one configuration. Summaries are read as `report` reads them (report.runs.run_of: every field
checked, the schema after), each file once; this module adds what a comparison needs on top:
only regular files of a sane size are opened, a run is never counted twice, the repeats are of
one configuration, and a single run's counted steps are found for its noise."""

from __future__ import annotations

import itertools
import math
import os
import stat
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nemo_throughput.compare.stats import BATCHES_NEEDED, MIN_BATCH_STEPS
from nemo_throughput.errors import ReportError
from nemo_throughput.report.comparable import (
    CONFIGURATION,
    REPEATS,
    SIDES,
    RunIdentity,
    canonical,
    configuration,
    differences_by_file,
    differing,
)
from nemo_throughput.report.fields import is_count, is_positive_finite, shown
from nemo_throughput.report.runs import (
    IncompleteRun,
    Run,
    find_summaries,
    is_time_to_train,
    read_steps_jsonl,
    read_summary_document,
    run_of,
)
from nemo_throughput.report.segments import join_segments
from nemo_throughput.summary import MAX_SUMMARY_BYTES, STEPS_FILE
from nemo_throughput.text import printable
from nemo_throughput.window import Window

MAX_STEPS_BYTES = 256 * 1024 ** 2  # steps.jsonl: every rank's phases per step
MAX_RUNS = 1000  # summaries on one side: repeats, not a file system


@dataclass
class Side:
    """One side: its completed runs (a resumed run's segments joined into one), one configuration;
    `step_times`: its single run's counted steps in step order (None: several runs, or not known,
    `steps_note` says why)."""

    given: str  # the path as the user gave it
    runs: list[Run]
    configuration: dict[str, Any]  # comparable.CONFIGURATION -> value (None: not known)
    step_times: list[float] | None = None
    steps_note: str | None = None
    notes: list[str] = field(default_factory=list)  # for stderr: runs left out, outliers

    @property
    def labels(self) -> list[str]:
        return sorted({run.label for run in self.runs})


def load_side(given: str) -> Side:
    """The completed runs under `given` (a summary file or a directory of them); ReportError naming
    the file when any is unusable, when none completed, or when they are not one configuration."""
    paths = summary_paths(given)
    runs, documents, notes = [], {}, []
    for path in paths:
        try:
            run, document = _load(path)
        except IncompleteRun as note:
            notes.append(f"left out: {note}")
            continue
        notes += run.notes
        runs.append(run)
        documents[path] = document
    _require_distinct_runs(runs)
    joined = join_segments(runs)
    for error in joined.left_out:  # a run that did not complete is left out; any other is no repeat to compare
        if not isinstance(error, IncompleteRun):
            raise error
        notes.append(f"left out: {error}")
    runs = joined.runs
    if not runs:
        raise ReportError(f"{given}: no completed run to compare (runs that did not complete are left out)")
    side = Side(given, runs, _one_configuration(given, runs), notes=notes + joined.notes)
    if len(runs) == 1:
        side.step_times, side.steps_note = _segments_steps(runs[0], documents)
        if side.step_times is not None and len(side.step_times) < BATCHES_NEEDED * MIN_BATCH_STEPS:
            side.steps_note = (f"its {len(side.step_times)} counted step(s) are too few to estimate its noise (batch "
                               f"means need {BATCHES_NEEDED * MIN_BATCH_STEPS})")
    return side


def summary_paths(given: str) -> list[Path]:
    """The summary files `given` names: itself, or every summary.json under a directory; each a
    regular file (never a FIFO, which would block, or a device) of at most MAX_SUMMARY_BYTES."""
    path = Path(given)
    try:
        os.stat(path)
    except OSError as error:
        raise ReportError(f"{printable(given)}: cannot read it ({error.strerror or error})") from None
    paths, problems = find_summaries([given])
    if problems:
        raise problems[0]
    if len(paths) > MAX_RUNS:
        raise ReportError(f"{printable(given)}: {len(paths)} summaries; a side holds the repeats of one "
                          f"configuration, at most {MAX_RUNS}")
    for found in paths:
        require_regular_file(found, MAX_SUMMARY_BYTES, "summary")
    return paths


def require_regular_file(path: Path, limit: int, what: str) -> None:
    """ReportError unless `path` (its link followed) is a regular file of at most `limit` bytes."""
    try:
        status = os.stat(path)
    except OSError as error:
        raise ReportError(f"{printable(path)}: cannot read it ({error.strerror or error})") from None
    if stat.S_ISDIR(status.st_mode):
        raise ReportError(f"{printable(path)}: a directory, not a {what} file")
    if not stat.S_ISREG(status.st_mode):
        raise ReportError(f"{printable(path)}: not a regular file (a FIFO, socket or device?); give the {what} file")
    if status.st_size > limit:
        raise ReportError(f"{printable(path)}: {status.st_size:,} bytes, more than a {what} holds "
                          f"({limit // 1024 ** 2} MiB at most)")


def _load(path: Path) -> tuple[Run, dict[str, Any]]:
    """The run as report reads it, and its summary's JSON (for what the run does not keep): both from
    one read of the file, so a summary rewritten while it is compared cannot give a mix of two versions."""
    summary = read_summary_document(path)
    if is_time_to_train(summary):
        raise ReportError(f"{printable(path)}: a time-to-train result (MLPerf); compare compares throughput runs "
                          "(nemo-throughput report shows time to train)")
    return run_of(summary), summary.document


def _require_distinct_runs(runs: list[Run]) -> None:
    """Each summary once: a copy of a summary (or a log imported twice) counted as a repeat would make
    the noise look smaller."""
    seen: dict[RunIdentity, Path] = {}
    for run in runs:
        if run.identity in seen:
            raise ReportError(f"{printable(seen[run.identity])} and {printable(run.path)} are the same run "
                              f"({run.identity.shown}): a copy counted as a repeat would understate the noise; keep one")
        seen[run.identity] = run.path


def shared_runs(baseline: Side, candidate: Side) -> int:
    """How many runs are on both sides: the same summary, or segments of one resumed run."""
    def keys(side: Side) -> set[str]:
        return {run.resumed.run_id if run.resumed else run.identity.key for run in side.runs}
    return len(keys(baseline) & keys(candidate))


def _segments_steps(run: Run, documents: dict[Path, dict[str, Any]]) -> tuple[list[float] | None, str | None]:
    """counted_steps of a run, of each of its segments in turn for a resumed run."""
    times: list[float] = []
    for segment in run.segments or [run]:
        if not segment.steps_counted:  # ended in its warm-up: no step of it counts
            continue
        steps, why = counted_steps(segment, documents[segment.path])
        if steps is None:
            return None, why if not run.segments else f"segment {segment.resumed.segment}: {why}"
        times += steps
    return times, None


def _one_configuration(given: str, runs: list[Run]) -> dict[str, Any]:
    """The side's configuration; ReportError naming each file's values when its runs differ."""
    names = differing([configuration(run) for run in runs], REPEATS)
    if names:
        raise ReportError(f"{printable(given)}: its runs are not repeats of one configuration (they differ in "
                          f"{', '.join(names)}); give each configuration its own directory:\n  "
                          f"{differences_by_file(runs, names)}")
    return configuration(runs[0])


def differences(baseline: Side, candidate: Side) -> tuple[list[dict[str, Any]], list[str]]:
    """(each configuration value that differs, or is known on one side only; the names known on
    neither side, which nothing can check). The parallel layout may differ (comparable.SIDES)."""
    found, unknown = [], []
    for name in CONFIGURATION:
        base, cand = baseline.configuration[name], candidate.configuration[name]
        if name in SIDES:
            continue
        if base is None and cand is None:
            unknown.append(name)
        elif isinstance(base, dict) and isinstance(cand, dict):  # the model shape: each field that differs
            found += [{"field": f"{name}: {key}", "baseline": base.get(key), "candidate": cand.get(key)}
                      for key in sorted({*base, *cand}) if canonical(base.get(key)) != canonical(cand.get(key))]
        elif canonical(base) != canonical(cand):
            found.append({"field": name, "baseline": base, "candidate": cand})
    return found, unknown


def counted_steps(run: Run, document: dict[str, Any]) -> tuple[list[float] | None, str | None]:
    """The global time of each step the run's mean counts, in step order, from an imported log's
    timing.steps or the callback's steps.jsonl; (None, why) where the summary holds none or they do
    not give the summary's own mean and count (another run's file, a file cut short)."""
    timing = document["timing"]
    if timing.get("steps"):
        steps, source = _window_steps(run.path, timing), "timing.steps"
    elif _has_complete_jsonl(document):
        steps, source = _jsonl_steps(run), STEPS_FILE
        if steps is None:
            return None, f"its {STEPS_FILE} is missing"
    else:
        return None, "the summary holds no per-step times (the callback writes them with per_step_jsonl=true)"
    times = [seconds for _, seconds in steps]
    if len(times) != run.steps_counted or not math.isclose(statistics.fmean(times), run.step_time_s, rel_tol=1e-6):
        return None, (f"its {source} ({len(times)} steps) do not give its mean step time over its "
                      f"{run.steps_counted} counted steps (a file of another run, or cut short?)")
    return times, None


def _window_steps(path: Path, timing: dict[str, Any]) -> list[tuple[int, float]]:
    """An imported summary's steps inside its own window (timing.window)."""
    rows = timing["steps"]
    if not isinstance(rows, list):
        raise ReportError(f"{printable(path)}: timing.steps is {shown(rows)}; it must be a list of [step, seconds]")
    for index, row in enumerate(rows):
        if not (isinstance(row, list) and len(row) == 2 and is_count(row[0]) and is_positive_finite(row[1])):
            raise ReportError(f"{printable(path)}: timing.steps[{index}] is {shown(row)}; it must be "
                              "[step >= 1, positive finite step time in s]")
    window = timing.get("window")
    try:
        selected = Window.parse(window).select(_in_order(path, rows)) if isinstance(window, str) else None
    except ReportError:
        selected = None
    if selected is None:
        raise ReportError(f"{printable(path)}: timing.window is {shown(window)}; it must be a step window, e.g. 11:")
    return selected


def _has_complete_jsonl(document: dict[str, Any]) -> bool:
    record = (document.get("files") or {}).get("steps_jsonl")
    return isinstance(record, dict) and record.get("complete") is True


def _jsonl_steps(run: Run) -> list[tuple[int, float]] | None:
    """The last steps_counted steps of steps.jsonl beside the summary (read_steps_jsonl leaves out
    warm-up, profiled and skipped ones, as the statistics leave them out)."""
    jsonl = run.path.parent / STEPS_FILE
    if not os.path.lexists(jsonl):
        return None
    require_regular_file(jsonl, MAX_STEPS_BYTES, STEPS_FILE)
    steps, _ = read_steps_jsonl(jsonl)
    return _in_order(jsonl, steps)[-run.steps_counted:]


def _in_order(where: Path, steps: list) -> list[tuple[int, float]]:
    """Sorted by step; a step twice (two runs in one file) is refused."""
    ordered = sorted((step, float(seconds)) for step, seconds in steps)
    for (before, _), (after, _) in itertools.pairwise(ordered):
        if before == after:
            raise ReportError(f"{printable(where)}: step {after} appears more than once (two runs in one file?)")
    return ordered
