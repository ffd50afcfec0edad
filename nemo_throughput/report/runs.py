"""Runs as the report sees them: one summary file each, with an optional window of steps.

Every field the report uses is checked here, so that a summary is either reported right or
rejected with a message naming the file, the field and what it must be."""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import statistics
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nemo_throughput.errors import ReportError
from nemo_throughput.goodput.segments import is_id
from nemo_throughput.report.comparable import RunIdentity, canonical, run_identity
from nemo_throughput.report.fields import (
    Fields,
    is_count,
    is_finite,
    is_index,
    is_non_negative_finite,
    is_positive_finite,
    shortened,
    shown,
)
from nemo_throughput.schemas import SUMMARY_SCHEMA_ID, validate_summary
from nemo_throughput.summary import EXPLAINED, STATUSES, outliers_text, read_summary
from nemo_throughput.text import printable
from nemo_throughput.throughput import CountedStep, Workload
from nemo_throughput.values import stated_name
from nemo_throughput.window import Window
from nemo_throughput.timing import PHASE_TIMES


class IncompleteRun(ReportError):
    """A run that did not complete: left out of the report with a note, not an error."""


# Ended before their last step, yet with a final summary of the steps they finished (run.measurement):
# a resumed run's segment that ended so still counts them (report.segments).
UNFINISHED = ("failed", "interrupted")
PROFILE_FRACTIONS = ("compute", "communication", "exposed_communication", "idle")  # communication.fractions
PHASES = tuple(name.removesuffix("_s") for name in PHASE_TIMES)  # timing.breakdown_s


@dataclass(frozen=True)
class Straggler:
    """The slowest rank, where it ran, and how far it is above the median rank."""

    rank: int
    host: str | None
    gpu_index: int | None
    metric: str  # what it is slowest in: local_time_s (compute before the collectives) or step_time_s
    excess_pct: float


@dataclass
class Explanation:
    """What a summary says about why its step time is what it is; None (or empty): not in it."""

    # The summary has the sections of summary.EXPLAINED, even null: it was written by a version that
    # records them. One without them (an older version) is reported exactly as before.
    explains: bool = False
    network: str | None = None  # network.label: RDMA, IPoIB, TCP, intra-node
    fractions: dict[str, float | None] = field(default_factory=lambda: dict.fromkeys(PROFILE_FRACTIONS))
    phases_s: dict[str, float | None] = field(default_factory=lambda: dict.fromkeys(PHASES))
    memory_peak_allocated_gib: float | None = None  # max over ranks
    memory_peak_reserved_gib: float | None = None  # max over ranks
    sm_clock_mhz: float | None = None  # median over ranks
    power_w: float | None = None  # median over ranks
    joules_per_token: float | None = None
    probe_busbw_gbps: dict[tuple[str, int], float] = field(default_factory=dict)  # (op, bytes) -> busbw
    straggler: Straggler | None = None  # only from summaries that name the host


@dataclass(frozen=True)
class SegmentOf:
    """Which run a summary's process is a segment of (its goodput section): a job restarted from
    its checkpoint writes a summary per segment, each with its own run.id."""

    run_id: str  # goodput.run_id: the run's first segment's run.id
    segment: int  # goodput.segment: 1 for the first


@dataclass(frozen=True)
class Warmup:
    """The steps a run trained before the first one its step time counts, as the summary chose them."""

    steps: int
    shown: str  # how: `warmup_steps 20`, or an imported log's window `window 11:`


@dataclass
class Run:
    path: Path
    label: str
    model: str
    num_nodes: int
    num_gpus: int
    global_batch_size: int
    seq_length: int | None  # None: samples are not token sequences (rated in samples/s)
    flops_per_sample: float | None  # None: unknown, so TFLOPS and MFU are n/a
    flops_formula: str  # a name of flops.FORMULAS, or summary.USER_FLOPS
    gpu_name: str
    dtype: str | None
    peak_tflops: float | None
    step_time_s: float  # mean global step time over the counted steps
    steps_counted: int
    window: str | None
    notes: list[str] = field(default_factory=list)  # what was left out of the input, for the user
    explanation: Explanation = field(default_factory=Explanation)
    unit: str = "tokens"  # what its primary rate counts: "tokens" or "samples" (throughput.primary)
    counted: CountedStep | None = None  # packed or padded batches as counted (batch.counted), with their FLOPs
    model_spec: dict[str, Any] | None = None  # model.spec: the model shape; None: not stated
    parallel: dict[str, Any] | None = None  # the parallel layout (data, tensor, pipeline, ...); None: not stated
    identity: RunIdentity | None = None  # what makes two summaries one run (comparable.run_identity)
    resumed: SegmentOf | None = None  # None: no goodput section (ranks other than 0, imported runs)
    warmup: Warmup | None = None  # None: counted over --window, the same steps for every run
    segments: list[Run] = field(default_factory=list)  # the segments joined into this run (report.segments)
    # A segment of a resumed run that failed or was interrupted (UNFINISHED): why it is no run on its
    # own (IncompleteRun's message), its status, and the steps its summary lacks (end.missing).
    incomplete: str | None = None
    status: str = "completed"
    lacks: str | None = None
    # A resumed run's summary under --window: its counted steps in step order, and the window, applied
    # once its segments are joined (report.segments): the run's window, not each segment's.
    steps: list[tuple[int, float]] | None = None
    pending_window: Window | None = None

    @property
    def paths(self) -> list[Path]:
        """The summaries this run was read from: its segments', or its own."""
        return [segment.path for segment in self.segments] or [self.path]

    @property
    def workload(self) -> Workload:
        return Workload(self.global_batch_size, self.seq_length, self.num_gpus, self.flops_per_sample,
                        self.peak_tflops, self.counted)


@dataclass
class SummaryDocument:
    """One summary file, read and parsed once: its run, its time to train and its goodput are all
    taken from this document, so a command reads each file once, and a file rewritten while the
    command runs can never give a mix of two versions."""

    path: Path
    document: dict[str, Any]
    _schema_problems: list[str] | None = field(default=None, repr=False)

    def schema_problems(self) -> list[str]:
        """What the shipped schema finds wrong with it; checked once, however many tables ask."""
        if self._schema_problems is None:
            self._schema_problems = validate_summary(self.document)
        return self._schema_problems


def read_summary_document(path: Path) -> SummaryDocument:
    """Read one summary; ReportError (naming the file) where it is no readable JSON summary."""
    return SummaryDocument(path, _read(path))


def load_run(path: Path, window: Window | None = None) -> Run:
    """Read one summary; raise ReportError (naming the file) if it cannot be reported on."""
    return run_of(read_summary_document(path), window)


def run_of(summary: SummaryDocument, window: Window | None = None) -> Run:
    """The run a summary read holds; ReportError (naming the file and field) if it cannot be reported on."""
    with _checked_against_the_schema(summary):
        return _run(summary.path, summary.document, window)


def _run(path: Path, summary: dict[str, Any], window: Window | None) -> Run:
    fields = Fields(str(path), summary)
    incomplete = _require_completed(fields, segment=fields.optional("goodput") is not None)
    resumed = _segment_of(fields)
    unit = _unit(fields)
    if resumed is None:
        step_time_s, counted, window_text, notes = _measured_step_time(path, fields, window)
        steps = None
    else:
        step_time_s, counted, window_text, notes, steps = _segment_step_time(path, fields, window)
    num_nodes, num_gpus = node_and_gpu_counts(fields)
    run = Run(path=path, label=fields.text("run.label"), model=fields.text("model.name"),
              num_nodes=num_nodes, num_gpus=num_gpus,
              global_batch_size=fields.count("batch.global_batch_size"),
              seq_length=fields.count("batch.seq_length") if unit == "tokens" else None, unit=unit,
              flops_per_sample=fields.positive("model.flops_per_sample", optional=True),
              flops_formula=fields.text("model.flops_formula"), gpu_name=fields.text("hardware.gpu_name"),
              dtype=fields.text("hardware.dtype", optional=True),
              peak_tflops=fields.positive("hardware.peak_tflops", optional=True),
              step_time_s=step_time_s, steps_counted=counted, window=window_text, notes=notes,
              explanation=read_explanation(fields), counted=_counted(fields), model_spec=_model_spec(fields),
              parallel=fields.optional("parallel") or None,
              identity=run_identity(fields.text("run.id"), summary), resumed=resumed,
              warmup=None if window is not None else _warmup(path, fields),
              incomplete=incomplete, status=fields.value("status"), lacks=fields.optional_text("end.missing"),
              steps=steps, pending_window=window if resumed is not None else None)
    if counted:  # a segment without counted steps has no step time of its own (report.segments)
        _require_finite_metrics(run)
    return run


def _segment_of(fields: Fields) -> SegmentOf | None:
    """The run this summary is a segment of; None without a goodput section. The segment number and
    the run's id must tell the same story: the first segment is the run (its run.id is the run's)."""
    if fields.optional("goodput") is None:
        return None
    run_id = fields.value("goodput.run_id", None)
    if not is_id(run_id):
        raise fields.error("goodput.run_id", run_id, "it must be the run's id (its first segment's run.id): "
                                                     "printable text of 1 to 256 characters")
    segment, own_id = fields.count("goodput.segment"), fields.text("run.id")
    if (segment == 1) != (run_id == own_id):
        what = "the first segment of another run" if segment == 1 else f"segment {segment} of itself"
        raise ReportError(f"{fields.where}: goodput.segment {segment} and goodput.run_id {shown(run_id)} (run.id "
                          f"{shown(own_id)}) say it is {what}; a run's first segment, and only that, has its run.id")
    return SegmentOf(run_id, segment)


def _warmup(path: Path, fields: Fields) -> Warmup:
    """The steps trained before counting began: the callback's warmup_steps (of its own process, a
    resumed segment's too), or, for an imported log, from its first step to where its window opens."""
    recorded = fields.value("timing.window", None)
    if recorded is None:
        steps = fields.value("timing.warmup_steps")
        if not is_index(steps):
            raise fields.error("timing.warmup_steps", steps, "it must be an integer >= 0")
        return Warmup(steps, f"warmup_steps {steps}")
    if not isinstance(recorded, str):
        raise fields.error("timing.window", recorded, "it must be a step window, e.g. 11:")
    try:
        window = Window.parse(recorded)
    except ReportError:
        raise fields.error("timing.window", recorded, "it must be a step window, e.g. 11:") from None
    if not fields.value("timing.steps", None):
        raise fields.error("timing.steps", fields.value("timing.steps", None),
                           "an imported run's window counts its logged steps: they must be listed")
    logged, _ = _step_series(path, fields)
    counted = window.select(logged)
    if not counted:
        raise fields.error("timing.window", recorded, f"it selects none of its timing.steps ({_step_range(logged)})")
    _require_its_own_steps(path, fields, counted, recorded)
    # Steps, not logged lines: a log that prints every 10th step, or has gaps, warms up as many steps.
    opens = window.start if window.start is not None and window.start >= 0 else counted[0][0]
    return Warmup(max(0, opens - logged[0][0]), f"window {printable(recorded)}")


def _require_its_own_steps(path: Path, fields: Fields, counted: list[tuple[int, float]], window: str) -> None:
    """An imported run's step time is the mean of the steps it lists, in its window: a mean or a list
    edited by hand would make the table (the mean) and a --window (the list) tell two runs apart."""
    mean, measured = fields.positive("timing.step_time_s.mean"), fields.count("timing.steps_measured")
    own = math.fsum(seconds for _, seconds in counted) / len(counted)
    if measured != len(counted) or not math.isclose(mean, own, rel_tol=1e-9):
        raise ReportError(f"{printable(path)}: timing.step_time_s.mean {mean:.6g} s over timing.steps_measured "
                          f"{measured} is not what its timing.steps hold in its window {printable(window)} "
                          f"({own:.6g} s over {len(counted)} steps): edited by hand? import the log again")


def _model_spec(fields: Fields) -> dict[str, Any] | None:
    """model.spec, compared field by field between runs; None: the FLOPs were given without a shape."""
    spec = fields.optional("model.spec")
    if spec is not None and not isinstance(spec, dict):
        raise fields.error("model.spec", spec, "it must be an object (the model shape) or null")
    try:
        canonical(spec)
    except (ValueError, RecursionError):
        raise ReportError(f"{fields.where}: model.spec cannot be compared (nested too deeply)") from None
    return spec


def node_and_gpu_counts(fields: Fields) -> tuple[int, int]:
    """hardware.num_nodes and num_gpus; more nodes than GPUs is no run's count (a node without a GPU)."""
    nodes, gpus = fields.count("hardware.num_nodes"), fields.count("hardware.num_gpus")
    if nodes > gpus:
        raise ReportError(f"{fields.where}: hardware.num_nodes {nodes} is more than hardware.num_gpus {gpus}: no "
                          "run has a node without a GPU (fix the counts, or import the run again with the right ones)")
    return nodes, gpus


def _counted(fields: Fields) -> CountedStep | None:
    """What packed or padded batches held (batch.counted), and the FLOPs their lengths computed where
    the summary counted them (model.flops_count batch): the rates are those of the summary."""
    if fields.optional("batch.counted") is None:
        return None
    flops = fields.positive("model.flops_per_step") if fields.optional("model.flops_count") == "batch" else None
    return CountedStep(tokens=fields.optional_number("batch.counted.tokens_per_step"),
                       slots=fields.positive("batch.counted.slots_per_step"),
                       seqlen_sq=fields.positive("batch.counted.seqlen_sq_per_step"), flops=flops,
                       source=fields.text("batch.counted.source"))


def goodput_of(summary: SummaryDocument) -> dict[str, Any] | None:
    """A summary's goodput section (any status: a killed segment's counts too), None without one;
    ReportError, naming the file and the field, when the summary breaks the schema."""
    with _checked_against_the_schema(summary):
        return summary.document.get("goodput")


def _unit(fields: Fields) -> str:
    """What the run's primary rate counts: tokens, or samples where tokens make no sense (images)."""
    primary = fields.value("throughput.primary", "tokens_per_s")  # older summaries: tokens
    if primary not in PRIMARY_UNITS:
        raise fields.error("throughput.primary", primary, f"it must be one of {list(PRIMARY_UNITS)}")
    return PRIMARY_UNITS[primary]


PRIMARY_UNITS = {"tokens_per_s": "tokens", "samples_per_s": "samples"}


def read_explanation(fields: Fields) -> Explanation:
    """The summary's telemetry, network, communication, probe and straggler values the report
    shows, each checked; a section that is missing or null gives None, never 0."""
    summary = fields.document
    return Explanation(
        explains=any(name in summary for name in EXPLAINED),
        network=fields.optional_text("network.label"),
        fractions={name: fields.optional_number(f"communication.fractions.{name}") for name in PROFILE_FRACTIONS},
        phases_s={name: fields.optional_number(f"timing.breakdown_s.{name}") for name in PHASES},
        memory_peak_allocated_gib=fields.optional_number("telemetry.memory.peak_allocated_gib.max"),
        memory_peak_reserved_gib=fields.optional_number("telemetry.memory.peak_reserved_gib.max"),
        sm_clock_mhz=fields.optional_number("telemetry.device.sm_clock_mhz.median"),
        power_w=fields.optional_number("telemetry.device.power_w.median"),
        joules_per_token=fields.optional_number("telemetry.energy.joules_per_token"),
        probe_busbw_gbps=_probe_busbw(fields),
        straggler=_straggler(fields),
    )


def _probe_busbw(fields: Fields) -> dict[tuple[str, int], float]:
    collectives = fields.optional("probe.collectives")
    if collectives is None:
        return {}
    if not isinstance(collectives, list):
        raise fields.error("probe.collectives", collectives, "it must be a list of {op, bytes, busbw_gbps} or null")
    busbw: dict[tuple[str, int], float] = {}
    for index, entry in enumerate(collectives):
        where = f"probe.collectives[{index}]"
        if not isinstance(entry, dict):
            raise fields.error(where, entry, "it must be an object {op, bytes, busbw_gbps, ...}")
        op, size, value = entry.get("op"), entry.get("bytes"), entry.get("busbw_gbps")
        if not isinstance(op, str) or not op:
            raise fields.error(f"{where}.op", op, "it must be the collective's name, e.g. 'all_reduce'")
        if not is_count(size):
            raise fields.error(f"{where}.bytes", size, "it must be an integer >= 1")
        if not is_non_negative_finite(value):
            raise fields.error(f"{where}.busbw_gbps", value, "it must be a finite number >= 0")
        if (op, size) in busbw:
            raise fields.error(where, entry, f"{op} at {size} bytes is listed twice; keep one")
        busbw[(op, size)] = float(value)
    return busbw


def _straggler(fields: Fields) -> Straggler | None:
    """The slowest rank, from summaries that name its host; older ones (rank only) give None."""
    straggler = fields.optional("timing.straggler")
    if not isinstance(straggler, dict) or "host" not in straggler:
        return None
    rank = fields.value("timing.straggler.rank")
    if not is_index(rank):
        raise fields.error("timing.straggler.rank", rank, "it must be an integer >= 0")
    gpu_index = fields.value("timing.straggler.gpu_index", None)
    if gpu_index is not None and not is_index(gpu_index):
        raise fields.error("timing.straggler.gpu_index", gpu_index, "it must be an integer >= 0 or null")
    excess = fields.value("timing.straggler.excess_pct")
    if not is_finite(excess):
        raise fields.error("timing.straggler.excess_pct", excess, "it must be a finite number")
    return Straggler(rank=rank, host=fields.text("timing.straggler.host", optional=True), gpu_index=gpu_index,
                     metric=fields.text("timing.straggler.metric"), excess_pct=float(excess))


def _read(path: Path) -> dict[str, Any]:
    try:
        return read_summary(path)
    except UnicodeDecodeError as error:
        raise ReportError(f"{path}: not a readable JSON summary (not UTF-8 text: {error.reason} at byte "
                          f"{error.start})") from error
    except RecursionError as error:
        raise ReportError(f"{path}: not a readable JSON summary (nested too deeply)") from error
    except ValueError as error:  # read_summary's own name the file; json's (e.g. a 5000-digit number) do not
        message = str(error)
        raise ReportError(message if message.startswith(f"{path}:") else
                          f"{path}: not a readable JSON summary ({message})") from error


@contextlib.contextmanager
def _checked_against_the_schema(summary: SummaryDocument) -> Iterator[None]:
    """The report's own checks first: they name the field the report stumbles on and what it must
    be. Then the shipped schema, for the fields they do not check and for what they do not foresee:
    a summary that breaks it is left out, the message a line per problem."""
    try:
        yield
    except ReportError:
        raise
    except (LookupError, TypeError, AttributeError, ValueError, ArithmeticError) as error:
        problems = summary.schema_problems()
        if not problems:
            raise
        raise ReportError(schema_problems_message(summary.path, problems)) from error
    problems = summary.schema_problems()
    if problems:
        raise ReportError(schema_problems_message(summary.path, problems))


def schema_problems_message(path: Path | str, problems: list[str]) -> str:
    """One line naming the file, then one per problem (field path: what was expected)."""
    return "\n".join([f"{path}: not a valid {SUMMARY_SCHEMA_ID} summary:", *(f"  {p}" for p in problems)])


def _require_completed(fields: Fields, segment: bool) -> str | None:
    """None for a completed run. A failed or interrupted segment of a resumed run: why it is no run
    on its own (its run, joined, counts its finished steps: report.segments). Else IncompleteRun."""
    status = fields.value("status")
    if not isinstance(status, str) or status not in STATUSES:
        raise ReportError(f"{fields.where}: status {shown(status)} is not one of {STATUSES}")
    if status == "completed":
        return None
    error = fields.value("error", None)
    reason = f" ({shortened(printable(error), 300)})" if error else ""
    message = f"{fields.where}: status {status!r}{reason}: only completed runs are reported"
    if segment and status in UNFINISHED:
        return message
    raise IncompleteRun(message)


def _measured_step_time(path: Path, fields: Fields, window: Window | None
                        ) -> tuple[float, int, str | None, list[str]]:
    """(mean step time, steps counted, window, notes): the summary's own, or recomputed over `window`."""
    if window is None:
        if fields.value("timing.step_time_s") is None or fields.value("timing.steps_measured") == 0:
            raise ReportError(f"{path}: no measured steps (the run was shorter than its warm-up)")
        window_text = fields.text("timing.window") if fields.value("timing.window", None) is not None else None
        return (fields.positive("timing.step_time_s.mean"), fields.count("timing.steps_measured"), window_text,
                _outlier_notes(path, fields))
    steps, notes = _step_series(path, fields)
    selected, told = windowed(window, steps, str(path), _step_range(steps))
    return statistics.fmean(t for _, t in selected), len(selected), window.text, notes + told


def _segment_step_time(path: Path, fields: Fields, window: Window | None
                       ) -> tuple[float, int, str | None, list[str], list[tuple[int, float]] | None]:
    """A resumed run's summary: as _measured_step_time, but no counted steps is no error (a segment
    that ended in its warm-up adds none to its run), and a window is only read here: its steps are
    chosen from the whole run's (report.segments). NaN: no step time."""
    if window is not None:
        steps, notes = _step_series(path, fields)
        mean = statistics.fmean(t for _, t in steps) if steps else math.nan
        return mean, len(steps), window.text, notes, steps
    if fields.value("timing.step_time_s") is None or fields.value("timing.steps_measured") == 0:
        return math.nan, 0, None, [], None
    return (*_measured_step_time(path, fields, None), None)


def windowed(window: Window, steps: list[tuple[int, float]], where: str, ranges: str
             ) -> tuple[list[tuple[int, float]], list[str]]:
    """The counted steps `window` selects of a run's `steps` (in the order trained), and a note where
    `-N:` asks for more steps than the run has; ReportError where it selects none."""
    selected = window.select(steps)
    if not selected:
        raise ReportError(f"{where}: --window {window.text} selects none of its steps ({ranges})")
    notes = []
    if window.counts_from_the_end and -window.start > len(steps):
        notes.append(f"{where}: --window {window.text} asks for its last {-window.start} counted steps; it has "
                     f"{len(steps)}: all of them are counted")
    return selected, notes


def _outlier_notes(path: Path, fields: Fields) -> list[str]:
    """A note where the summary names outlier steps (timing.outlier_steps), since the mean step
    time the report uses counts them."""
    text = outliers_text(fields.document["timing"])
    return [f"{printable(path)}: outlier steps: {text}"] if text else []


def _step_series(path: Path, fields: Fields) -> tuple[list[tuple[int, float]], list[str]]:
    """(step, global step time) of every step, in step order, and notes: from an imported summary,
    or from steps.jsonl beside it. Raises ReportError on any step it cannot trust."""
    embedded = fields.value("timing.steps", None)
    if embedded is not None and not isinstance(embedded, list):
        raise fields.error("timing.steps", embedded, "it must be a list of [step, step time in s]")
    if embedded:
        steps = [_embedded_step(fields, i, row) for i, row in enumerate(embedded)]
        return _in_step_order(steps, f"{path}: timing.steps"), []
    jsonl = path.parent / "steps.jsonl"
    if not jsonl.exists():
        raise ReportError(f"{path}: --window needs per-step times, and this run has none (record them with "
                          "per_step_jsonl=true or +callbacks=throughput_debug)")
    if fields.optional("files.steps_jsonl.complete") is False:  # a window over the steps written would pass
        # for one over the run's: `-N:` would count other steps, `A:` fewer
        raise ReportError(f"{path}: --window needs every counted step, and its steps.jsonl stopped before the "
                          f"run ended (files.steps_jsonl.error: "
                          f"{shortened(printable(str(fields.optional('files.steps_jsonl.error'))), 200)})")
    run_id = fields.value("run.id", None)
    steps, notes = read_steps_jsonl(jsonl, run_id if isinstance(run_id, str) else None)
    return _in_step_order(steps, str(jsonl)), notes


def _embedded_step(fields: Fields, index: int, row: Any) -> tuple[int, float]:
    if not (isinstance(row, list) and len(row) == 2 and is_count(row[0]) and is_positive_finite(row[1])):
        raise fields.error(f"timing.steps[{index}]", row, "it must be [step >= 1, positive finite step time in s]")
    return row[0], float(row[1])


def read_steps_jsonl(jsonl: Path, run_id: str | None = None) -> tuple[list[tuple[int, float]], list[str]]:
    """(step, step time) of each measured line of a steps.jsonl, and notes on what was left out.

    The writer ends every line with a newline and flushes each interval, so a run that stopped
    while writing leaves at most its last line cut: that line is left out with a note. Any other
    bad line is an error: an average over it would be silently wrong; so is a line of another run
    than ``run_id`` (the summary's). Warm-up steps (``"warmup": true``), steps of a profile window
    (``"profiled": true``, run under the profiler) and skipped iterations (``"skipped": true``, no
    optimizer update) are left out, with a note, as the summary's statistics leave them out.
    """
    rows, notes = [], []
    try:
        # Line by line: a long run's file is hundreds of MB, and its text and lines need not be kept.
        with jsonl.open(encoding="utf-8", newline="\n") as f:  # only \n ends a line, as the writer ends them
            for number, line in enumerate(f, 1):
                if line.endswith("\n"):
                    if line.strip():
                        rows.append(_jsonl_step(jsonl, number, line[:-1], run_id))
                elif line.strip():  # what follows the last newline
                    notes += _last_line(jsonl, number, line, run_id, rows)
    except (OSError, UnicodeDecodeError) as error:
        raise ReportError(f"{jsonl}: cannot read it ({error})") from error
    warmup = [step for step, _, flags in rows if "warmup" in flags]
    if warmup:
        notes.append(f"{jsonl}: steps {warmup[0]}-{warmup[-1]} are the run's warm-up (warmup_steps); left out")
    profiled = [step for step, _, flags in rows if "profiled" in flags]
    if profiled:
        notes.append(f"{jsonl}: steps {profiled[0]}-{profiled[-1]} ran under the profiler (profile_steps); "
                     "left out")
    skipped = [step for step, _, flags in rows if "skipped" in flags]
    if skipped:
        shown_steps = ", ".join(map(str, skipped[:8])) + (", ..." if len(skipped) > 8 else "")
        notes.append(f"{jsonl}: {len(skipped)} skipped iteration(s) (no optimizer update: {shown_steps}); left out")
    return [(step, time_s) for step, time_s, flags in rows if not flags], notes


_FLAGS = ("warmup", "profiled", "skipped")


def _jsonl_step(jsonl: Path, number: int, line: str, run_id: str | None) -> tuple[int, float, tuple[str, ...]]:
    """(step, global step time, which of "warmup" / "profiled" / "skipped" the line says it was)."""
    where = f"{jsonl}: line {number}"
    try:
        row = json.loads(line)
    except (ValueError, RecursionError):
        raise ReportError(f"{where}: not JSON: {shown(line)}") from None
    if not isinstance(row, dict):
        raise ReportError(f"{where}: not a JSON object: {shown(line)}")
    fields = Fields(where, row)
    if run_id is not None and row.get("run_id", run_id) != run_id:
        raise ReportError(f"{where}: a step of run {shown(row.get('run_id'))}, not of the summary's run "
                          f"{shown(run_id)} (another run's steps.jsonl beside it?)")
    for flag in _FLAGS:
        value = row.get(flag, False)
        if not isinstance(value, bool):
            raise fields.error(flag, value, "it must be true or false")
    flags = tuple(flag for flag in _FLAGS if row.get(flag))  # () for most: one shared object, not a set a row
    return fields.count("step"), fields.positive("step_time_s"), flags


def _last_line(jsonl: Path, number: int, line: str, run_id: str | None,
               rows: list[tuple[int, float, tuple[str, ...]]]) -> list[str]:
    """A last line without its newline: read where it is whole JSON, else left out with a note (cut
    off while being written)."""
    try:
        json.loads(line)
    except (ValueError, RecursionError):
        return [f"{jsonl}: its last line is incomplete (cut off while being written?); left out, "
                f"{len(rows)} steps read"]
    rows.append(_jsonl_step(jsonl, number, line, run_id))
    return []


def _in_step_order(steps: list[tuple[int, float]], where: str) -> list[tuple[int, float]]:
    """Sorted by step (`-N:` means the last N by number); a step twice is ambiguous (two runs in
    one directory?) and refused."""
    steps = sorted(steps)
    for (before, _), (after, _) in itertools.pairwise(steps):
        if before == after:
            raise ReportError(f"{where}: step {after} appears more than once (two runs written to one place?); "
                              "keep one run's steps")
    return steps


def _require_finite_metrics(run: Run) -> None:
    """Values each in range can still overflow together; refuse rather than print inf."""
    try:
        metrics = run.workload.metrics(run.step_time_s)
    except OverflowError:
        metrics = {"tokens_per_s": math.inf}
    if not all(v is None or math.isfinite(v) for v in metrics.values()):
        raise ReportError(f"{run.path}: its numbers give no finite throughput (global batch "
                          f"{shown(run.global_batch_size)}, sequence length {shown(run.seq_length)}, step time "
                          f"{run.step_time_s!r} s, FLOPs per sample {run.flops_per_sample!r}); check them")


def find_summaries(paths: list[str]) -> tuple[list[Path], list[ReportError]]:
    """Files as given; directories are searched for summary.json files. Each file once, however
    often it is named; a path that is not there, or a directory without summaries, is an error
    of its own, so that the other inputs can still be reported."""
    found: dict[Path, Path] = {}
    problems = []
    for given in paths:
        path = Path(given)
        if path.is_dir():
            inside = sorted(path.rglob("summary.json"))
            if not inside:
                problems.append(ReportError(f"{given}: no summary.json under it"))
            candidates = inside
        elif path.exists():
            candidates = [path]
        else:
            what = "a link to nothing, or a loop of links" if os.path.lexists(path) else "no such file or directory"
            problems.append(ReportError(f"{given}: {what}"))
            candidates = []
        for candidate in candidates:
            found.setdefault(candidate.resolve(), candidate)
    return list(found.values()), problems


def _step_range(steps: list[tuple[int, float]]) -> str:
    return f"it has steps {steps[0][0]} to {steps[-1][0]}" if steps else "it has no steps"


@dataclass(frozen=True)
class TrainingSystem:
    """The system a time-to-train run ran on; None: not stated."""

    directory: str | None  # <system> of <system>/<benchmark>/result_*.txt
    name: str | None  # system_name
    accelerator: str | None  # hardware.gpu_name
    submitter: str | None


@dataclass
class TrainingRun:
    """One MLPerf-style run: time to train from run_start to run_stop (summaries with a time_to_train section)."""

    path: Path
    benchmark: str
    label: str
    num_gpus: int
    num_nodes: int
    minutes: float | None  # None: no run_start / run_stop
    converged: bool  # run_stop status success
    compliant: bool  # passed mlperf-logging's compliance check
    required_runs: int | None  # result files a submission needs for the benchmark
    scaling_factor: float  # from scaling.json beside the result file, 1.0 without one
    source: str  # the result file it was imported from
    system: TrainingSystem
    sha256: str | None  # of the result file's bytes; None from summaries that do not record it

    @property
    def counted(self) -> bool:
        """Scored as result_summarizer scores it: compliant, with both ends; and converged."""
        return self.compliant and self.converged and self.minutes is not None


def is_time_to_train(summary: SummaryDocument) -> bool:
    """An imported MLPerf result: a time-to-train run, not a throughput run."""
    return isinstance(summary.document.get("time_to_train"), dict)


def training_run_of(summary: SummaryDocument) -> TrainingRun | None:
    """The summary's time-to-train run, or None when it has no time_to_train section."""
    if not is_time_to_train(summary):
        return None
    with _checked_against_the_schema(summary):
        return _training_run(summary.path, summary.document)


def _training_run(path: Path, summary: dict[str, Any]) -> TrainingRun:
    fields = Fields(str(path), summary)
    minutes = fields.optional_number("time_to_train.minutes")
    required = fields.optional("time_to_train.required_runs")
    factor = fields.optional_number("time_to_train.scaling_factor")
    num_nodes, num_gpus = node_and_gpu_counts(fields)
    return TrainingRun(
        path=path, benchmark=fields.text("time_to_train.benchmark"), label=fields.text("run.label"),
        num_gpus=num_gpus, num_nodes=num_nodes,
        minutes=minutes, converged=fields.optional("time_to_train.converged") is True,
        compliant=fields.optional("time_to_train.compliant") is True,
        required_runs=required if is_count(required) else None,
        scaling_factor=factor if factor is not None else 1.0,
        source=fields.optional_text("environment.imported_from") or str(path),
        system=_training_system(fields), sha256=fields.optional_text("time_to_train.sha256"))


def _training_system(fields: Fields) -> TrainingSystem:
    """time_to_train.system; the GPU as hardware.gpu_name says; the log's submission_org where the
    summary records no submitter. A template's placeholder (UNKNOWN_MLPERF_SUBMITTER, which older
    imports kept) names no one: every submitter that logs it would be one."""
    return TrainingSystem(
        directory=fields.optional_text("time_to_train.system.directory"),
        name=stated_name(fields.optional_text("time_to_train.system.name")),
        accelerator=stated_name(fields.text("hardware.gpu_name")),
        submitter=stated_name(fields.optional_text("time_to_train.system.submitter"))
        or stated_name(fields.optional("time_to_train.submitter")))
