"""One MLPerf result file (``:::MLLOG {json}`` lines), read and checked.

The lines are read with mlperf-logging's own parser (it strips ``srun -l`` and timestamp prefixes)
and judged with its compliance checker; the time to train is run_stop minus run_start, as its
result_summarizer scores it. Only the ``:::SYSJSON`` line (system description, newer rounds) is
read here, since the library leaves it to its package checker. The library is loaded on first use:
import's other formats and ``--help`` do without it.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nemo_throughput.errors import ReportError
from nemo_throughput.importers.mlperf.systems import IS_ZERO, MAX_COUNT, platform_nodes, plausible_count
from nemo_throughput.importers.mlperf.tree import GIVE_A_RESULT_FILE, NotAResultFile, unreadable_file
from nemo_throughput.text import printable
from nemo_throughput.values import stated_name

USAGE = "training"
SYSJSON_TAG = ":::SYSJSON "
MLLOG_TAG = ":::MLLOG "
COUNT_KEYS = ("number_of_nodes", "accelerators_per_node")
HASH_CHUNK_BYTES = 1024 * 1024
READ_KEYS = ("run_start", "run_stop", "tracked_stats", "throughput", "eval_accuracy", "epoch_start")  # counted here


def _library() -> Any:
    try:
        from mlperf_logging import benchmark_meta
        from mlperf_logging.compliance_checker import mlp_compliance, mlp_parser
    except ImportError as error:
        raise ReportError("--format mlperf needs mlperf-logging (pip install 'nemo-throughput[mlperf]' or pip "
                          "install mlperf-logging)") from error
    return benchmark_meta, mlp_compliance, mlp_parser


def rulesets() -> list[str]:
    """The training rulesets mlperf-logging checks against, newest first."""
    _, compliance, _ = _library()
    return sorted(compliance.rule_choices(), key=lambda r: tuple(int(p) for p in r.split(".")), reverse=True)


@dataclass
class Compliance:
    ruleset: str
    compliant: bool
    errors: list[str]


@dataclass(frozen=True)
class LoggedRate:
    """One throughput line: the rate, the count it stands at (metadata ``step``: samples, or tokens in
    gpt3's logs; a list in bert's, or None) and when it was logged."""

    rate: float
    step: Any
    time_ms: float


@dataclass
class RunEnds:
    """run_start and run_stop as result_summarizer takes them where a log has several: the last
    run_start before the first run_stop, and that run_stop; how many of each the log has."""

    start_ms: float | None = None
    stop_ms: float | None = None
    status: str | None = None  # the run_stop's metadata status: success or aborted
    starts: int = 0
    stops: int = 0

    def add(self, key: str, time_ms: float, metadata: dict[str, Any]) -> None:
        if key == "run_start":
            self.starts += 1
            if self.stop_ms is None or self.start_ms is None:
                self.start_ms = time_ms
        elif key == "run_stop":
            self.stops += 1
            if self.stop_ms is None:
                self.stop_ms, self.status = time_ms, metadata.get("status")

    def notes(self) -> list[str]:
        """Which of several lines counted: the log does not say which run they were of."""
        notes = []
        if self.starts > 1:
            notes.append(f"the log has {self.starts} run_start lines: the time to train counts from the last one "
                         f"before the first run_stop ({self.start_ms:.0f} ms), as result_summarizer counts it")
        if self.stops > 1:
            notes.append(f"the log has {self.stops} run_stop lines: the first ({self.stop_ms:.0f} ms, status "
                         f"{self.status!r}) ends the time to train, as result_summarizer ends it")
        return notes


@dataclass
class ResultLog:
    """What one MLPerf result file states."""

    path: Path
    values: dict[str, Any]  # first value of each key (submission_*, global_batch_size, ...)
    system: dict[str, Any]  # the :::SYSJSON object, {} without one
    ends: RunEnds
    throughputs: list[LoggedRate]  # of the tracked_stats / throughput lines
    evals: list[dict[str, Any]]  # eval_accuracy: value, epoch_num / samples_count
    epochs: int
    parse_errors: list[str]
    repeated_lines: int = 0  # lines that repeat an earlier one exactly (one event printed by several ranks)
    compliance: Compliance = field(default_factory=lambda: Compliance("", False, []))
    sha256: str = ""  # of the file's bytes: a copy of another result is the same run

    @property
    def benchmark(self) -> str | None:
        return self.values.get("submission_benchmark")

    @property
    def run_start_ms(self) -> float | None:
        return self.ends.start_ms

    @property
    def run_stop_ms(self) -> float | None:
        return self.ends.stop_ms

    @property
    def stop_status(self) -> str | None:
        return self.ends.status

    @property
    def minutes(self) -> float | None:
        """Time to train; None without both ends, or with run_stop before run_start (no time to score)."""
        if self.run_start_ms is None or self.run_stop_ms is None or self.run_stop_ms < self.run_start_ms:
            return None
        return (self.run_stop_ms - self.run_start_ms) / 60 / 1000  # as result_summarizer computes it

    @property
    def converged(self) -> bool:
        """Reached the target, with a time to train to count."""
        return self.stop_status == "success" and self.minutes is not None

    def stated(self, key: str) -> tuple[str, Any]:
        """Where the log states ``key``, and the value: the :::SYSJSON object's, else the first :::MLLOG line's."""
        return (":::SYSJSON", self.system.get(key)) if key in self.system else (":::MLLOG", self.values.get(key))

    def count(self, key: str) -> tuple[int | None, str | None]:
        """The log's count of ``key``; (None, a note naming the line and the key) where the value is no
        plausible count: it is never taken."""
        where, value = self.stated(key)
        if value is None:
            return None, None
        count, problem = plausible_count(value)
        return count, problem and f"{where} {key} {printable(repr(value))} {problem}: not taken"

    @property
    def zero_accelerators(self) -> bool:
        """The log states 0 accelerators per node (a CPU-only run)."""
        return plausible_count(self.stated("accelerators_per_node")[1])[1] == IS_ZERO

    @property
    def num_nodes(self) -> int | None:
        stated, _ = self.count("number_of_nodes")
        return stated if stated is not None else platform_nodes(self.platform)

    @property
    def accelerators_per_node(self) -> int | None:
        return self.count("accelerators_per_node")[0]

    @property
    def num_accelerators(self) -> int | None:
        nodes, per_node = self.num_nodes, self.accelerators_per_node
        return nodes * per_node if nodes and per_node and nodes * per_node <= MAX_COUNT else None

    def count_notes(self) -> list[str]:
        """What the log states as counts that is not taken (never a count)."""
        notes = [note for key in COUNT_KEYS if (note := self.count(key)[1])]
        nodes, per_node = self.num_nodes, self.accelerators_per_node
        if nodes and per_node and nodes * per_node > MAX_COUNT:
            notes.append(f"{nodes} nodes x {per_node} accelerators per node is more than {MAX_COUNT:,} accelerators: "
                         "not a plausible count, not taken")
        return notes

    @property
    def platform(self) -> str | None:
        return stated_name(self.values.get("submission_platform"))

    @property
    def submitter(self) -> str | None:
        return stated_name(self.system.get("submitter")) or stated_name(self.values.get("submission_org"))


def read_result(path: Path, ruleset: str | None = None) -> ResultLog:
    """One result file, parsed and checked; ``ruleset`` None: the newest one it complies with."""
    _, _, parser = _library()
    if ruleset is not None and ruleset not in rulesets():
        raise ReportError(f"--ruleset {ruleset}: mlperf-logging checks {', '.join(rulesets())} (give one of them, "
                          "e.g. 4.0.0 for a v4.0 result)")
    why = unreadable_file(path)
    if why is not None:
        raise ReportError(f"{printable(path)}: {why} {GIVE_A_RESULT_FILE}")
    lines, failed = parser.parse_file(str(path), ruleset=ruleset or rulesets()[0])
    if not lines:
        empty = "empty (0 bytes: a copy cut short?): " if path.stat().st_size == 0 else ""
        raise NotAResultFile(path, f"{empty}no `{MLLOG_TAG.strip()}` lines")
    result = _from_lines(path, lines, [f"{error}: {line[:200]}" for line, error in failed])
    result.compliance = _check(path, result.benchmark, ruleset)
    result.sha256 = _sha256(path)
    return result


def _sha256(path: Path) -> str:
    """Of the file's bytes, read a chunk at a time: memory stays flat whatever the file's size."""
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(HASH_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def _from_lines(path: Path, lines: list[Any], parse_errors: list[str]) -> ResultLog:
    lines, repeats = _each_event_once(lines)
    values: dict[str, Any] = {}
    ends = RunEnds()
    throughputs: list[LoggedRate] = []
    evals: list[dict[str, Any]] = []
    epochs = 0
    for line in lines:
        key, value, metadata = line.key, line.value["value"], line.value["metadata"] or {}
        values.setdefault(key, value)
        if key in ("run_start", "run_stop"):
            ends.add(key, line.timestamp, metadata)
        elif key in ("tracked_stats", "throughput"):
            rate = value.get("throughput") if isinstance(value, dict) else value
            if isinstance(rate, (int, float)) and rate > 0:
                throughputs.append(LoggedRate(float(rate), metadata.get("step"), line.timestamp))
        elif key == "eval_accuracy":
            evals.append({"value": value, **{k: metadata[k] for k in ("epoch_num", "samples_count") if k in metadata}})
        elif key == "epoch_start":
            epochs += 1
    return ResultLog(path, values, _sysjson(path), ends, throughputs, evals, epochs, parse_errors, repeats)


def _each_event_once(lines: list[Any]) -> tuple[list[Any], int]:
    """The lines, each that repeats an earlier one of the keys read here exactly (key, time, value and
    metadata: one event printed by several ranks, as ``srun -l`` shows them) left out, and how many were."""
    seen: set[str] = set()
    kept = []
    for line in lines:
        if line.key in READ_KEYS:
            event = json.dumps([line.key, line.timestamp, line.value], sort_keys=True, default=str)  # value: no time
            if event in seen:
                continue
            seen.add(event)
        kept.append(line)
    return kept, len(lines) - len(kept)


def _sysjson(path: Path) -> dict[str, Any]:
    """The first ``:::SYSJSON`` line that holds a JSON object. Real logs print others before it: the
    shell's xtrace of the command (``+ echo ':::SYSJSON {...}'``), or the tag followed by the
    script's usage text when the script failed; those are passed over."""
    with path.open(encoding="latin-1") as lines:  # the encoding mlperf-logging's parser reads with
        for line in lines:
            _, tag, text = line.partition(SYSJSON_TAG.strip())
            if not tag:
                continue
            try:
                found = json.loads(text)
            except json.JSONDecodeError:
                continue
            if isinstance(found, dict):
                return found
    return {}


def _check(path: Path, benchmark: str | None, ruleset: str | None) -> Compliance:
    """mlperf-logging's compliance check; without a ruleset, the newest that allows the benchmark and
    passes (the log does not name its round), else the newest that allows it, with its errors."""
    meta, _, _ = _library()
    candidates = [ruleset] if ruleset else [r for r in rulesets() if _allows(meta, r, benchmark)] or rulesets()[:1]
    first: Compliance | None = None
    for candidate in candidates:
        outcome = _check_one(path, candidate)
        if outcome.compliant:
            return outcome
        first = first or outcome
    assert first is not None
    return first


def _allows(meta: Any, ruleset: str, benchmark: str | None) -> bool:
    try:
        return benchmark in meta.get_allowed_benchmarks(USAGE, ruleset)
    except (ValueError, KeyError):
        return False


def _check_one(path: Path, ruleset: str) -> Compliance:
    _, compliance, _ = _library()
    checker = compliance.make_checker(usage=USAGE, ruleset=ruleset, quiet=True, werror=False)
    before = logging.root.manager.disable
    logging.disable(logging.WARNING)  # the checker logs its findings on the root logger; they are returned here
    try:
        valid, _, _, _ = compliance.main(str(path), f"{USAGE}_{ruleset}/common.yaml", checker)
    except Exception as error:  # noqa: BLE001 - a config the library lacks for this benchmark fails the check
        return Compliance(ruleset, False, [f"compliance checker {ruleset} could not check it: "
                                           f"{type(error).__name__}: {error}"])
    finally:
        logging.disable(before)
    errors = [*checker.overwritable.values(), *checker.not_overwritable]
    return Compliance(ruleset, bool(valid), [str(e).strip() for e in errors])


def required_runs(benchmark: str | None) -> int | None:
    """Result files a submission needs for the benchmark (mlperf-logging's table)."""
    meta, _, _ = _library()
    return meta.get_result_file_counts(USAGE).get(benchmark)
