"""The summary of one MLPerf result: its time to train, its nodes and accelerators, its samples/s and
the notes for the user.

Nothing the files do not state is filled in: a log without throughput lines has no samples/s, and
tokens/s is never derived (an MLPerf benchmark's sample is not a fixed number of tokens). A log whose
throughput lines count tokens (gpt3's) has its samples/s divided by its own ``max_sequence_length``,
once the run's count over its time agrees with the rate.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nemo_throughput.environment import package_version
from nemo_throughput.errors import ReportError
from nemo_throughput.importers import DEFAULT_GPUS_PER_NODE
from nemo_throughput.importers.mlperf.result_log import READ_KEYS, ResultLog, read_result, required_runs
from nemo_throughput.importers.mlperf.systems import (
    SystemFile,
    platform_nodes,
    plausible_count,
    system_file_of,
    system_file_path,
)
from nemo_throughput.run_facts import RunFacts
from nemo_throughput.run_stats import RunStats
from nemo_throughput.summary import ResultRate, build_summary
from nemo_throughput.text import printable
from nemo_throughput.values import is_int, is_number, stated_name

NAME = "mlperf"
RATE_SOURCE = "log:tracked_stats.throughput"
TOKEN_RATE_SOURCE = f"{RATE_SOURCE} / max_sequence_length"
# A rate and the run's count over its time agree within this factor (the latter includes evaluation, which the
# rates of real logs leave out: llama2_70b_lora's 112 samples/s over a run's 79); tokens for samples is 2048x.
RATE_AGREEMENT = 2.0


def time_to_train(result: ResultLog, folder: Path) -> dict[str, Any]:
    """The summary's time_to_train section; ``folder``: the one that holds the result file (resolved)."""
    return {
        "benchmark": result.benchmark,
        "run_start_ms": result.run_start_ms,
        "run_stop_ms": result.run_stop_ms,
        "minutes": result.minutes,
        "status": result.stop_status,
        "converged": result.converged,
        "compliant": result.compliance.compliant,
        "compliance_errors": result.compliance.errors,
        "ruleset": result.compliance.ruleset,
        "required_runs": required_runs(result.benchmark),
        "scaling_factor": scaling_factor(folder),
        "evals": result.evals,
        "epochs": result.epochs,
        "submitter": stated_name(result.values.get("submission_org")),
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
        raise ReportError(f"{printable(scaling_file)}: not a scaling.json of the form {{\"scaling_factor\": 1.03}} "
                          f"({type(error).__name__}: {error}) (fix or remove it)") from error
    if not isinstance(factor, (int, float)) or isinstance(factor, bool) or not factor > 0:
        raise ReportError(f"{printable(scaling_file)}: scaling_factor {factor!r} must be a positive number (fix or "
                          "remove it)")
    return float(factor)


def import_result(path: Path, *, label: str | None = None, name: str | None = None, num_gpus: int | None = None,
                  gpus_per_node: int | None = None, ruleset: str | None = None, orchestrator: str | None = None,
                  gpu_name: str | None = None) -> tuple[dict[str, Any], list[str]]:
    """A schema-v1 summary of one MLPerf result file and the warnings for the user. The counts come
    from the submission's systems/<system>.json, else the log; ``num_gpus`` only for a log that
    states none (on the nodes its platform names), and one that contradicts them is refused. A link
    is read in the folder of the file it links to: system, counts and scaling.json all from there."""
    result = read_result(path, ruleset)
    if result.benchmark is None:
        raise ReportError(f"{printable(path)}: no submission_benchmark line (give an MLPerf Training result file)")
    real = path.resolve()  # a link's system, counts and scaling.json are those of the folder of the file it links to
    system, notes = system_file_of(real)
    if path.is_symlink():
        notes.append(f"a link to {printable(real)}: the systems file and scaling.json are those of its folder")
    scale, scale_notes = _scale(path, result, system, num_gpus, gpus_per_node)
    notes += scale_notes
    batch = result.values.get("global_batch_size")
    record = system_record(real, result, system)
    facts = RunFacts(
        name=name or path.stem, global_batch_size=_stated_batch(batch), micro_batch_size=None, seq_length=None,
        label=label or record["name"] or result.platform or record["directory"] or "unknown", rate="samples",
        model_name=result.benchmark, model_spec=None, flops_formula=None, flops_per_sample=None,  # not in the log
        gpu_name=gpu_name or record["accelerator"] or "unknown", num_gpus=scale.num_accelerators,
        num_nodes=scale.num_nodes, dtype=None, peak_tflops=None, peak_source=None, source=f"import:{NAME}",
        environment={"orchestrator": orchestrator or "unknown", "imported_from": str(path.absolute()),
                     "imported_with": {"nemo-throughput": package_version()},
                     "system": result.system or None, "framework": result.system.get("framework")},
    )
    status, error = _status(result)
    notes += _notes(result, error)
    rate, rate_notes = _rate(result)
    notes += rate_notes
    summary = build_summary(
        facts, RunStats(world_size=1, warmup_steps=0), status, error, result_rate=rate,
        time_to_train={**time_to_train(result, real.parent), "ruleset_given": ruleset is not None,
                       "system_file": str(system.path) if system else None, "counts_from": scale.source,
                       "system": record, "sha256": result.sha256, "notes": notes})
    return summary, notes


def system_record(path: Path, result: ResultLog, system: SystemFile | None) -> dict[str, str | None]:
    """Which system ran it, as result_summarizer names one: the ``<system>`` directory of
    ``results/<system>/<benchmark>/result_*.txt`` (``path``: the resolved result file), or of
    ``<system>/<benchmark>/`` where the folder is named after the log's benchmark (else None), and the
    systems file's name, accelerator and submitter, else the log's."""
    folder = path.parent
    in_layout = folder.name == result.benchmark or system_file_path(path) is not None
    return {
        "directory": (folder.parent.name or None) if in_layout else None,
        "name": (system and system.name) or stated_name(result.system.get("system_name")),
        "accelerator": (system and system.accelerator) or stated_name(result.system.get("accelerator_model_name")),
        "submitter": (system and system.submitter) or result.submitter,
    }


def note_byte_copies(summaries: list[dict[str, Any]]) -> None:
    """A result file with the bytes of one imported before it is a copy of the same run: said in its
    notes (the report counts it once)."""
    first: dict[str, str] = {}
    for summary in summaries:
        ttt, source = summary["time_to_train"], summary["environment"]["imported_from"]
        if ttt["sha256"] in first:
            ttt["notes"].append(f"a byte copy of {printable(first[ttt['sha256']])}: the same run, which the report "
                                "counts once")
        first.setdefault(ttt["sha256"], source)


def _stated_batch(batch: Any) -> int | None:
    """The log's global_batch_size when it is a whole number >= 1, else None (not stated, or not usable)."""
    if not is_number(batch) or not batch >= 1:
        return None
    if isinstance(batch, float) and not batch.is_integer():  # 2.5, inf
        return None
    return int(batch)


def unnamed_round_note(summaries: list[dict[str, Any]]) -> str:
    """Said once per command: without --ruleset, which round each log was checked as is a guess."""
    checked: dict[str, int] = {}
    for summary in summaries:
        ruleset = summary["time_to_train"]["ruleset"]
        checked[ruleset] = checked.get(ruleset, 0) + 1
    counts = ", ".join(f"{ruleset} for {count} file(s)" for ruleset, count in sorted(checked.items()))
    return (f"the logs do not name their MLPerf round: each was checked against the newest ruleset whose rules "
            f"allow its benchmark and that it passes ({counts}); give --ruleset with the round they were "
            "submitted to (e.g. --ruleset 4.0.0) to check them as that round")


@dataclass
class Scale:
    """A run's nodes and accelerators, and which source stated them."""

    num_nodes: int
    num_accelerators: int
    source: str  # systems/<system>.json, log, --num-gpus


def _scale(path: Path, result: ResultLog, system: SystemFile | None, given: int | None,
           gpus_per_node: int | None) -> tuple[Scale, list[str]]:
    """The systems file's counts, else the log's; ``given`` (on the platform's nodes) only where neither
    states them. A count the log states that is no plausible count is never taken, and said."""
    notes = result.count_notes()
    if system is not None:
        stated = Scale(system.num_nodes, system.num_accelerators, system.shown)
        notes += _disagreement(result, system)
    elif result.zero_accelerators:
        raise ReportError(f"{printable(path)}: the log states accelerators_per_node 0: no accelerator count to "
                          "compare runs by (a CPU-only run is not imported)")
    elif result.num_accelerators is not None:
        stated = Scale(result.num_nodes or 1, result.num_accelerators, "log")
    elif given is None:
        raise ReportError(f"{printable(path)}: the log does not state its accelerators (no :::SYSJSON "
                          "number_of_nodes / accelerators_per_node, no systems/<system>.json beside results/"
                          f"{''.join(f'; {note}' for note in notes)}) (give --num-gpus)")
    else:
        scale, note = _given_scale(path, result, given, gpus_per_node)
        return scale, [*notes, note]
    if (given is not None and given != stated.num_accelerators) or \
            (gpus_per_node is not None and gpus_per_node * stated.num_nodes != stated.num_accelerators):
        raise ReportError(f"{printable(path)}: {_given_contradict(given, gpus_per_node)} {stated.source}: "
                          f"{stated.num_nodes} node(s), {stated.num_accelerators} accelerators (leave them out: "
                          "they are only for logs that do not state their accelerators)")
    return stated, notes


def _given_scale(path: Path, result: ResultLog, given: int, gpus_per_node: int | None) -> tuple[Scale, str]:
    """--num-gpus on the nodes the log's submission_platform names (``18xNVIDIA GB200``: 18), where it
    names them, and a count that does not fit them refused; else on nodes of --gpus-per-node."""
    nodes = platform_nodes(result.platform)
    if nodes is None:
        per_node = gpus_per_node or DEFAULT_GPUS_PER_NODE
        nodes = -(-given // per_node)
        return Scale(nodes, given, "--num-gpus"), (f"{given} accelerators as given, on {nodes} node(s) of {per_node} "
                                                   "(the log does not state its accelerators or nodes)")
    platform = f"submission_platform {printable(repr(result.platform))}"
    if given % nodes or (gpus_per_node is not None and gpus_per_node * nodes != given):
        raise ReportError(f"{printable(path)}: {_given_contradict(given, gpus_per_node)} the log's "
                          f"{platform}: {nodes} node(s) (give a --num-gpus that is {nodes} x the accelerators per "
                          "node)")
    return Scale(nodes, given, "--num-gpus"), (f"{given} accelerators as given, on the {nodes} node(s) of the log's "
                                               f"{platform} ({given // nodes} per node)")


def _given_contradict(given: int | None, gpus_per_node: int | None) -> str:
    """The counts the user gave, as given on the command line, and the verb: ``--num-gpus 8 contradicts``."""
    shown = [f"--{option} {value}" for option, value in (("num-gpus", given), ("gpus-per-node", gpus_per_node))
             if value is not None]
    return f"{' and '.join(shown)} {'contradicts' if len(shown) == 1 else 'contradict'}"


def _disagreement(result: ResultLog, system: SystemFile) -> list[str]:
    """A note where the log states other counts than the systems file (which is what gets scored)."""
    nodes, per_node = result.num_nodes, result.accelerators_per_node
    if (nodes is None or nodes == system.num_nodes) and (per_node is None or per_node == system.accelerators_per_node):
        return []
    return [f"the log states {_or_unstated(nodes)} node(s) x {_or_unstated(per_node)} accelerators, {system.shown} "
            f"{system.num_nodes} x {system.accelerators_per_node}: the systems file counts (result_summarizer's rule)"]


def _or_unstated(count: int | None) -> str:
    return "?" if count is None else str(count)


def _status(result: ResultLog) -> tuple[str, str | None]:
    if result.run_start_ms is None:
        return "failed", "no run_start line: no time to train to count"
    if result.run_stop_ms is None:
        return "interrupted", "no run_stop line: the run did not finish"
    if result.minutes is None:
        return "failed", (f"run_stop ({result.run_stop_ms:.0f} ms) is before run_start ({result.run_start_ms:.0f} "
                          "ms): no time to train to count")
    if result.stop_status is None:
        return "failed", "run_stop states no status: whether the target quality was reached is not known"
    if result.stop_status != "success":
        return "failed", f"run_stop status {result.stop_status!r}: the target quality was not reached"
    return "completed", None


def _rate(result: ResultLog) -> tuple[ResultRate, list[str]]:
    """samples/s: the mean of the log's own throughput lines (as the benchmark reports it), divided by
    max_sequence_length where their step counts tokens (NVIDIA's gpt3 callback logs tokens/s); None
    without lines, or where a token rate cannot be checked against the run's count over its time."""
    if not result.throughputs:
        return ResultRate(None, None), []
    mean = statistics.fmean(logged.rate for logged in result.throughputs)
    batch = _token_batch(result)
    if batch is None:
        return ResultRate(mean, RATE_SOURCE), []
    return _from_token_rate(result, mean, batch)


@dataclass(frozen=True)
class TokenBatch:
    """A step of a log that counts tokens: global_batch_size sequences of max_sequence_length tokens."""

    samples: int
    seq_length: int

    @property
    def tokens(self) -> int:
        return self.samples * self.seq_length


def _token_batch(result: ResultLog) -> TokenBatch | None:
    """The log's batch where every throughput line's step is a whole number of batches of tokens
    (gpt3's logs count tokens, as its eval_accuracy epoch_num does); None where a step counts samples
    (llama31_8b: 172,032 is no multiple of 32 x 8192) or the log does not say."""
    seq_length = plausible_count(result.values.get("max_sequence_length"))[0]
    samples = _stated_batch(result.values.get("global_batch_size"))
    steps = [logged.step for logged in result.throughputs if is_int(logged.step)]
    if seq_length is None or seq_length == 1 or samples is None or not steps:
        return None
    batch = TokenBatch(samples, seq_length)
    return batch if all(step > 0 and step % batch.tokens == 0 for step in steps) else None


def _from_token_rate(result: ResultLog, mean: float, batch: TokenBatch) -> tuple[ResultRate, list[str]]:
    """A rate in tokens/s as samples/s, checked first against the tokens its last line counts since run_start."""
    last = max((logged for logged in result.throughputs if is_int(logged.step)), key=lambda logged: logged.time_ms)
    counted = (f"its step counts tokens: {last.step:,} = {last.step // batch.tokens:,} x global_batch_size "
               f"{batch.samples} x max_sequence_length {batch.seq_length}")
    seconds = (last.time_ms - result.run_start_ms) / 1000 if result.run_start_ms is not None else 0.0
    if seconds <= 0:
        return ResultRate(None, None), [f"the log's throughput is tokens/s ({counted}), but no run_start before it "
                                        "dates that count: samples/s not given"]
    over_run = last.step / seconds
    if not 1 / RATE_AGREEMENT <= mean / over_run <= RATE_AGREEMENT:
        return ResultRate(None, None), [f"the log's throughput {mean:,.0f}/s looks like tokens/s ({counted}), but "
                                        f"that is {over_run:,.0f} tokens/s over the {seconds:,.0f} s since run_start: "
                                        "its unit is not known, samples/s not given"]
    return ResultRate(mean / batch.seq_length, TOKEN_RATE_SOURCE), [
        f"the log's throughput {mean:,.0f}/s is tokens/s ({counted}, {over_run:,.0f} tokens/s over the {seconds:,.0f} "
        f"s since run_start): samples/s is it divided by max_sequence_length, {mean / batch.seq_length:,.2f}"]


def _notes(result: ResultLog, error: str | None) -> list[str]:
    notes = [*result.ends.notes(), *([f"{error}; not counted as a converged run"] if error else [])]
    if result.stop_status not in (None, "success") and result.minutes is not None and result.compliance.compliant:
        notes.append(f"result_summarizer would count it ({result.minutes:.2f} min): it does not read run_stop's "
                     "status, and the compliance check passes it (its evaluations reach the target)")
    if not result.compliance.compliant:
        shown = "; ".join(e.splitlines()[0] for e in result.compliance.errors[:3])
        notes.append(f"fails mlperf-logging's compliance check ({result.compliance.ruleset}): {shown}; "
                     "report counts it as a dropped run")
    if result.parse_errors:
        notes.append(f"{len(result.parse_errors)} :::MLLOG line(s) could not be parsed")
    if result.repeated_lines:
        notes.append(f"{result.repeated_lines} :::MLLOG line(s) of {', '.join(READ_KEYS)} repeat an earlier line "
                     "exactly (one event printed by several ranks, as srun -l shows them): each event counted once")
    return notes
