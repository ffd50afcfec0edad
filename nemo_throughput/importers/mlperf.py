"""MLPerf Training result files (``:::MLLOG {json}`` lines) as imported summaries.

The lines are read with mlperf-logging's own parser (it strips ``srun -l`` and timestamp prefixes)
and judged with its compliance checker; the time to train is run_stop minus run_start, as its
result_summarizer scores it. Only the ``:::SYSJSON`` line (system description, newer rounds) is
read here, since the library leaves it to its package checker. Nothing the log does not state is
filled in: a log without throughput lines has no samples/s, and tokens/s is never derived (an
MLPerf benchmark's sample is not a fixed number of tokens).
"""

from __future__ import annotations

import json
import logging
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nemo_throughput.aggregation import RunStats
from nemo_throughput.report.runs import ReportError
from nemo_throughput.summary import USER_FLOPS, RunFacts, build_summary

NAME = "mlperf"
USAGE = "training"
RESULT_GLOB = "result_*.txt"  # result_summarizer's file pattern
SYSJSON_TAG = ":::SYSJSON "
MLLOG_TAG = ":::MLLOG "
log = logging.getLogger(__name__)


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


def result_files(paths: list[Path]) -> list[Path]:
    """Files as given; directories expand to the ``result_*.txt`` files under them, in name order."""
    found: list[Path] = []
    for path in paths:
        if not path.exists():
            raise ReportError(f"{path}: no such file or directory (check the path)")
        if path.is_dir():
            inside = sorted(path.rglob(RESULT_GLOB))
            if not inside:
                raise ReportError(f"{path}: no MLPerf result files ({RESULT_GLOB}) under it (give the result "
                                  "files or the directory that holds them)")
            found.extend(inside)
        else:
            found.append(path)
    return found


@dataclass
class Compliance:
    ruleset: str
    compliant: bool
    errors: list[str]


@dataclass
class ResultLog:
    """What one MLPerf result file states."""

    path: Path
    values: dict[str, Any]  # first value of each key (submission_*, global_batch_size, ...)
    system: dict[str, Any]  # the :::SYSJSON object, {} without one
    run_start_ms: float | None
    run_stop_ms: float | None
    stop_status: str | None  # run_stop's metadata status: success or aborted
    throughputs: list[tuple[int | None, float]]  # (step, samples/s) of tracked_stats / throughput lines
    evals: list[dict[str, Any]]  # eval_accuracy: value, epoch_num / samples_count
    epochs: int
    parse_errors: list[str]
    compliance: Compliance = field(default_factory=lambda: Compliance("", False, []))

    @property
    def benchmark(self) -> str | None:
        return self.values.get("submission_benchmark")

    @property
    def minutes(self) -> float | None:
        if self.run_start_ms is None or self.run_stop_ms is None:
            return None
        return (self.run_stop_ms - self.run_start_ms) / 60 / 1000  # as result_summarizer computes it

    @property
    def num_nodes(self) -> int | None:
        stated = self.system.get("number_of_nodes", self.values.get("number_of_nodes"))
        if stated not in (None, ""):
            return int(stated)
        return _platform_nodes(self.values.get("submission_platform"))

    @property
    def accelerators_per_node(self) -> int | None:
        stated = self.system.get("accelerators_per_node", self.values.get("accelerators_per_node"))
        return int(stated) if stated not in (None, "") else None

    @property
    def num_accelerators(self) -> int | None:
        nodes, per_node = self.num_nodes, self.accelerators_per_node
        return nodes * max(per_node, 1) if nodes is not None and per_node is not None else None

    @property
    def system_name(self) -> str | None:
        return self.system.get("system_name") or self.values.get("submission_platform")


def read_result(path: Path, ruleset: str | None = None) -> ResultLog:
    """One result file, parsed and checked; ``ruleset`` None: the newest one it complies with."""
    _, _, parser = _library()
    if ruleset is not None and ruleset not in rulesets():
        raise ReportError(f"--ruleset {ruleset}: mlperf-logging checks {', '.join(rulesets())} (give one of them, "
                          "e.g. 4.0.0 for a v4.0 result)")
    if not path.is_file():
        raise ReportError(f"{path}: not a file (give an MLPerf result file, e.g. result_0.txt)")
    lines, failed = parser.parse_file(str(path), ruleset=ruleset or rulesets()[0])
    if not lines:
        raise ReportError(f"{path}: no `{MLLOG_TAG.strip()}` lines (give an MLPerf Training result file)")
    result = _from_lines(path, lines, [f"{error}: {line[:200]}" for line, error in failed])
    result.compliance = _check(path, result.benchmark, ruleset)
    return result


def _from_lines(path: Path, lines: list[Any], parse_errors: list[str]) -> ResultLog:
    values: dict[str, Any] = {}
    start = stop = status = None
    throughputs: list[tuple[int | None, float]] = []
    evals: list[dict[str, Any]] = []
    epochs = 0
    for line in lines:
        key, value, metadata = line.key, line.value["value"], line.value["metadata"] or {}
        values.setdefault(key, value)
        if key == "run_start" and start is None:
            start = line.timestamp
        elif key == "run_stop" and stop is None:
            stop, status = line.timestamp, metadata.get("status")
        elif key in ("tracked_stats", "throughput"):
            rate = value.get("throughput") if isinstance(value, dict) else value
            if isinstance(rate, (int, float)) and rate > 0:
                throughputs.append((metadata.get("step"), float(rate)))
        elif key == "eval_accuracy":
            evals.append({"value": value, **{k: metadata[k] for k in ("epoch_num", "samples_count") if k in metadata}})
        elif key == "epoch_start":
            epochs += 1
    return ResultLog(path, values, _sysjson(path), start, stop, status, throughputs, evals, epochs, parse_errors)


def _sysjson(path: Path) -> dict[str, Any]:
    with path.open(encoding="latin-1") as lines:  # the encoding mlperf-logging's parser reads with
        for line in lines:
            _, tag, text = line.partition(SYSJSON_TAG)
            if tag:
                try:
                    found = json.loads(text)
                except json.JSONDecodeError:
                    log.warning("%s: the %sline is not JSON; system facts come from the MLLOG lines", path, SYSJSON_TAG)
                    return {}
                return found if isinstance(found, dict) else {}
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


def _platform_nodes(platform: Any) -> int | None:
    """Nodes from a submission_platform such as ``8xNVIDIA DGX H100`` (the MLPerf naming rule)."""
    if not isinstance(platform, str):
        return None
    count, sep, _ = platform.partition("x")
    return int(count) if sep and count.isdigit() and int(count) > 0 else None


def time_to_train(result: ResultLog) -> dict[str, Any]:
    """The summary's time_to_train section."""
    minutes = result.minutes
    converged = result.stop_status == "success"
    return {
        "benchmark": result.benchmark,
        "run_start_ms": result.run_start_ms,
        "run_stop_ms": result.run_stop_ms,
        "minutes": minutes,
        "status": result.stop_status,
        "converged": converged,
        "compliant": result.compliance.compliant,
        "compliance_errors": result.compliance.errors,
        "ruleset": result.compliance.ruleset,
        "required_runs": required_runs(result.benchmark),
        "scaling_factor": scaling_factor(result.path.parent),
        "evals": result.evals,
        "epochs": result.epochs,
        "submitter": result.values.get("submission_org"),
        "division": result.values.get("submission_division"),
        "platform": result.values.get("submission_platform"),
    }


def scaling_factor(folder: Path) -> float:
    """The factor of ``scaling.json`` in the folder of the result files, as result_summarizer applies
    it to the olympic average (1.0 without one)."""
    scaling_file = folder / "scaling.json"
    if not scaling_file.is_file():
        return 1.0
    try:
        factor = json.loads(scaling_file.read_text(encoding="utf-8"))["scaling_factor"]
    except (ValueError, KeyError, TypeError) as error:
        raise ReportError(f"{scaling_file}: not a scaling.json of the form {{\"scaling_factor\": 1.03}} "
                          f"({type(error).__name__}: {error}) (fix or remove it)") from error
    if not isinstance(factor, (int, float)) or isinstance(factor, bool) or not factor > 0:
        raise ReportError(f"{scaling_file}: scaling_factor {factor!r} must be a positive number (fix or remove it)")
    return float(factor)


def required_runs(benchmark: str | None) -> int | None:
    """Result files a submission needs for the benchmark (mlperf-logging's table)."""
    meta, _, _ = _library()
    return meta.get_result_file_counts(USAGE).get(benchmark)


def import_result(path: Path, *, label: str | None = None, name: str | None = None, num_gpus: int | None = None,
                  gpus_per_node: int | None = None, ruleset: str | None = None, orchestrator: str | None = None,
                  gpu_name: str | None = None) -> tuple[dict[str, Any], list[str]]:
    """A schema-v1 summary of one MLPerf result file and the notes for the user. ``num_gpus`` is used
    only where the log does not state its accelerators (a differing one is noted, the log's kept)."""
    result = read_result(path, ruleset)
    if result.benchmark is None:
        raise ReportError(f"{path}: no submission_benchmark line (give an MLPerf Training result file)")
    accelerators, notes = _accelerators(path, result, num_gpus)
    nodes = result.num_nodes or (-(-accelerators // gpus_per_node) if gpus_per_node else 1)
    batch = result.values.get("global_batch_size")
    facts = RunFacts(
        name=name or path.stem, label=label or result.system_name or "unknown",
        global_batch_size=int(batch) if isinstance(batch, (int, float)) and batch >= 1 else 1,
        micro_batch_size=None, seq_length=None, rate="samples", model_name=result.benchmark, model_spec=None,
        flops_formula=USER_FLOPS, flops_per_sample=None,
        gpu_name=gpu_name or result.system.get("accelerator_model_name") or "unknown", num_gpus=accelerators,
        num_nodes=nodes, dtype=None, peak_tflops=None, peak_source=None, source=f"import:{NAME}",
        environment={"orchestrator": orchestrator or "unknown", "imported_from": str(path),
                     "system": result.system or None, "framework": result.system.get("framework")},
    )
    status, error = _status(result)
    summary = build_summary(facts, RunStats(world_size=1, warmup_steps=0), status, error)
    summary["batch"]["global_batch_size"] = batch if facts.global_batch_size == batch else None
    summary["model"]["flops_formula"] = summary["model"]["mfu_convention"]["formula"] = None  # not in the log
    summary["throughput"]["samples_per_s"] = _samples_per_s(result)
    summary["throughput"]["rate_source"] = "log:tracked_stats.throughput" if result.throughputs else None
    summary["time_to_train"] = {**time_to_train(result), "ruleset_given": ruleset is not None}
    if ruleset is None:  # a guess, said as one: the round decides which checks apply
        notes.append(f"the log does not name its MLPerf round: checked against ruleset {result.compliance.ruleset} "
                     "(the newest whose rules allow the benchmark and that it passes); give --ruleset with the "
                     "round it was submitted to (e.g. --ruleset 4.0.0) to check it as that round")
    return summary, notes + _notes(result)


def _accelerators(path: Path, result: ResultLog, given: int | None) -> tuple[int, list[str]]:
    """The log's accelerator count; ``given`` only for a log that does not state it."""
    stated = result.num_accelerators
    if stated is None and given is None:
        raise ReportError(f"{path}: the log does not state its accelerators (no :::SYSJSON number_of_nodes / "
                          "accelerators_per_node) (give --num-gpus)")
    if stated is None:
        return given, [f"{given} GPUs as given (the log does not state its accelerators)"]  # type: ignore[list-item]
    if given is not None and given != stated:
        return stated, [f"the log states {result.num_nodes} node(s) x {result.accelerators_per_node} accelerators "
                        f"= {stated}; --num-gpus {given} applies only to logs that do not say"]
    return stated, []


def _status(result: ResultLog) -> tuple[str, str | None]:
    if result.run_stop_ms is None:
        return "interrupted", "no run_stop line: the run did not finish"
    if result.stop_status != "success":
        return "failed", f"run_stop status {result.stop_status!r}: the target quality was not reached"
    return "completed", None


def _samples_per_s(result: ResultLog) -> float | None:
    """The mean of the log's own throughput lines (samples/s as the benchmark reports it); None without."""
    return statistics.fmean(rate for _, rate in result.throughputs) if result.throughputs else None


def _notes(result: ResultLog) -> list[str]:
    notes = []
    if not result.compliance.compliant:
        shown = "; ".join(e.splitlines()[0] for e in result.compliance.errors[:3])
        notes.append(f"warning: fails mlperf-logging's compliance check ({result.compliance.ruleset}): {shown}; "
                     "report counts it as a dropped run")
    if result.parse_errors:
        notes.append(f"warning: {len(result.parse_errors)} :::MLLOG line(s) could not be parsed")
    return notes


# Options of the other formats that an MLPerf log answers itself, or that have no meaning for it.
INAPPLICABLE = ("model", "model_spec", "flops_per_sample", "model_name", "global_batch_size", "seq_length", "rank",
                "window", "dtype", "peak_tflops")


def refuse_inapplicable(args: Any) -> None:
    given = [f"--{name.replace('_', '-')}" for name in INAPPLICABLE if getattr(args, name, None) is not None]
    if given:
        raise ReportError(f"{', '.join(given)} do(es) not apply to --format mlperf: the result file states the "
                          "benchmark, batch and timing (leave them out)")


# What import says of a file mlperf-logging's parser stops on (e.g. an :::MLLOG line without time_ms).
UNREADABLE = ("could not read it as an MLPerf result file",
              "(check the file; check it with python -m mlperf_logging.compliance_checker too)")


def say_imported(target: Path, summary: dict[str, Any], notes: list[str]) -> None:
    for note in notes:
        print(f"nemo-throughput import: {target.parent.name}: {note}", file=sys.stderr)
    ttt = summary["time_to_train"]
    minutes = f"{ttt['minutes']:.2f} min" if ttt["minutes"] is not None else "no run_stop"
    rate = summary["throughput"]["samples_per_s"]
    print(f"{target}: {ttt['benchmark']} on {summary['run']['label']} ({summary['hardware']['num_gpus']} GPUs), "
          f"{minutes}, {ttt['status'] or 'no status'}, {'compliant' if ttt['compliant'] else 'NOT compliant'} "
          f"({ttt['ruleset']})" + (f", {rate:,.4g} samples/s" if rate is not None else ""))
