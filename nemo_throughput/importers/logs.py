"""Summaries for runs made without the plugin, from what they left behind.

Each log format is a small module behind the registry below: ``nemo`` (NeMo 1.x progress bar and
NeMo 2 progress printer), ``megatron`` (Megatron-LM and Megatron-Bridge iteration lines) and
``tensorboard`` (event files with NeMo's ``train_step_timing in s`` scalar or Megatron's
``iteration-time``). Text logs go through :mod:`~nemo_throughput.importers.lines`, which strips
launcher prefixes and tells ranks apart; one rank is read (the lowest that prints step lines, or
the one asked for).

Steps are numbered from 1 as in the callback's summaries (NeMo's 0-based global step + 1,
Megatron's iteration). A value a log prints as the mean of a logging interval counts as one
sample at its step. Step times that are not positive finite numbers, or longer than any step
(MAX_STEP_SECONDS: a corrupt value, 1e30), are left out and counted.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from nemo_throughput import environment
from nemo_throughput.errors import ReportError
from nemo_throughput.explain import network
from nemo_throughput.flops import ModelSpec, flops_unlike_the_shape, model_flops_per_sample
from nemo_throughput.hardware import resolve_peak
from nemo_throughput.importers import crosscheck, crosscheck_megatron, crosscheck_nemo, megatron, nemo, segments, tensorboard
from nemo_throughput.importers.lines import Line, check_text, cut_reason, read_lines, read_once
from nemo_throughput.importers.segments import ChosenSegment
from nemo_throughput.importers.steps import Step
from nemo_throughput.run_facts import USER_FLOPS, RunFacts, mfu_above_peak_warning
from nemo_throughput.run_stats import RunStats, rank_rows
from nemo_throughput.summary import LogTiming, build_summary
from nemo_throughput.timing import StepTimes
from nemo_throughput.values import whole_number
from nemo_throughput.window import Window

TEXT_FORMATS: dict[str, ModuleType] = {nemo.NAME: nemo, megatron.NAME: megatron}
FORMATS = (*TEXT_FORMATS, tensorboard.NAME, "mlperf")  # mlperf: importers.mlperf, its own command path
NEMO_TAG = nemo.TAG
MAX_LISTED = 20  # steps named in messages and in timing.excluded_step_times
MAX_STEP_SECONDS = 86_400.0  # a step of over a day is no run's (a collective times out in minutes): a corrupt value
UNUSABLE_TIMES = "zero, negative, NaN, infinite or over a day"
STATS_INTERVAL = 10_000  # steps added to the statistics at a time


@dataclass
class ReadLog:
    """The steps one rank of a log holds, and where they came from."""

    fmt: str
    segment: ChosenSegment  # the steps read: the log's only segment, or the one chosen
    rank: str | None = None  # the prefix label of the rank read; None: lines without a rank prefix
    ranks: list[str | None] = field(default_factory=list)  # every rank with step lines
    styles: set[str] = field(default_factory=set)
    cut_line: tuple[int, str] | None = None  # the last step line and why it looks cut: not read
    no_value_lines: list[int] = field(default_factory=list)  # step lines without a value of their own (Primus)
    interval_means: bool = False  # each time is the mean of the log interval up to its step (Megatron's)
    batch_origin: str = ""  # where the log states the batch, for messages
    rate_field: str | None = None  # the field or scalar stating NeMo's or Megatron's own TFLOP/s per GPU, if any

    @property
    def steps(self) -> list[Step]:
        return self.segment.steps

    @property
    def segment_note(self) -> str | None:
        """What to tell the user about the segment read, or None when the log has one."""
        if self.segment.of == 1:
            return None
        return f"read {self.segment.where}: the job restarted into this log (--segment picks another)"

    @property
    def rank_note(self) -> str | None:
        """What to tell the user about the rank read, or None when the log has no rank prefixes."""
        if self.rank is None:
            return None
        others = [r for r in self.ranks if r != self.rank]
        if not others:
            return f"rank {self.rank} (the only rank that prints step lines)"
        listed = ", ".join(str(r) for r in self.ranks[:MAX_LISTED]) + (" ..." if len(self.ranks) > MAX_LISTED else "")
        return f"rank {self.rank} of {len(self.ranks)} that print step lines ({listed}; --rank picks another)"


@dataclass
class Imported:
    summary: dict[str, Any]
    notes: list[str]  # what the user should see: the rank read, steps left out


def detect_format(path: Path) -> str | None:
    """"tensorboard" for event files and directories; None: a text log, format decided by its lines."""
    if path.is_dir() or "tfevents" in path.name or tensorboard.is_event_file(path):
        return tensorboard.NAME
    return None


def read_log(path: Path, fmt: str | None = None, rank: str | None = None,
             global_batch_size: int | None = None, segment: int | str | None = None) -> ReadLog:
    """One rank's steps of a log: ``fmt`` None detects it; ``rank`` None takes the lowest rank;
    ``segment`` (a number from 1 or "last") where the job restarted into the log."""
    if not path.exists():
        raise ReportError(f"{path}: no such file or directory (check the path)")
    fmt = fmt or detect_format(path)
    if fmt == tensorboard.NAME:
        if rank is not None:
            raise ReportError(f"{path}: --rank applies to text logs; TensorBoard event files hold one rank's values")
        events = tensorboard.read_steps(path)
        return ReadLog(fmt, segments.choose(events.log, segment), styles={events.writer.style},
                       interval_means=events.writer.interval_means, batch_origin=events.writer.batch_origin,
                       rate_field=events.rate_tag)
    if path.is_dir():
        raise ReportError(f"{path}: a directory without TensorBoard event files (give the log file itself)")
    check_text(path)
    formats = [fmt] if fmt else list(TEXT_FORMATS)
    ranks, bridge = _ranks_with_steps(path, formats)
    if not ranks:
        raise ReportError(_bridge_step_time_only_message(path) if bridge else _no_steps_message(path, fmt))
    found = {name for name, _ in ranks}
    if len(found) > 1:
        raise ReportError(f"{path}: both NeMo (`{nemo.TAG}`) and Megatron-LM (`{megatron.TAG}`) step lines "
                          "(give --format nemo or --format megatron)")
    fmt = found.pop()
    labels = sorted({label for _, label in ranks}, key=_rank_order)
    chosen = _choose_rank(path, labels, rank)
    module = TEXT_FORMATS[fmt]
    reader = module.Reader(path, global_batch_size)
    before, last = _feed_all_but_the_last(path, module, reader, chosen)
    cut = cut_reason(last, before, module.is_whole) if last is not None else None
    if cut is None and last is not None:
        reader.feed(last)
    no_steps = not any(segment.steps for segment in reader.log.segments)  # .steps joins every segment's: a copy
    if no_steps and cut is not None:
        raise ReportError(f"{path}: its only step line, line {last.number} (the last), looks cut ({cut}): its numbers "
                          "may be cut short, so it is not read (import again once the log holds a whole step line)")
    if no_steps:
        raise ReportError(_no_steps_message(path, fmt))
    styles = reader.styles | ({megatron.BRIDGE_STYLE} if bridge and fmt == megatron.NAME else set())
    cut_line = (last.number, cut) if cut is not None else None
    return ReadLog(fmt, segments.choose(reader.log, segment), chosen, labels, styles, cut_line,
                   getattr(reader, "no_value_lines", []), interval_means=fmt == megatron.NAME,
                   batch_origin=module.BATCH_ORIGIN, rate_field=getattr(reader, "rate_field", None))


def _feed_all_but_the_last(path: Path, module: ModuleType, reader: Any,
                           rank: str | None) -> tuple[Line | None, Line | None]:
    """Feed ``rank``'s step lines but the last, which is read once the file ends, as it may be cut (5444.9
    printed as 54): (the step line before it, it). A process start (banner) between two step lines opens a
    segment at the second; where one line holds both, the step was printed first (a killed process's last
    progress bar, the next process's first line glued to it)."""
    before = last = None
    banner: str | None = None  # where the latest process start since the last step line is, and what it is
    for line in read_lines(path):
        if line.rank == rank and module.matches(line.text):
            if last is not None:
                reader.feed(last)
            if banner is not None:  # after the steps printed before it, before the ones after it
                reader.log.restarted(banner)
                banner = None
            before, last = last, line
        if module.starts_process(line.text) and _banner_counts(module, line, rank):
            banner = f"a process starts at line {line.number} ({module.PROCESS_START})"
    return before, last


def _banner_counts(module: ModuleType, line: Line, rank: str | None) -> bool:
    """Megatron's rank 0 prints its banner and its last rank the steps: any rank's counts. NeMo's banner
    comes from the process that prints the steps: another rank's, late in an interleaved log, is not a
    restart of the one read."""
    return line.rank == rank or not module.BANNER_ON_STEP_RANK


def import_run(path: Path, *, fmt: str | None = None, global_batch_size: int | None, seq_length: int,
               spec: ModelSpec | None, model_name: str, num_gpus: int, num_nodes: int, label: str,
               name: str | None = None, rank: str | None = None, window: Window | None = None,
               warmup_steps: int = 10, gpu_name: str | None = None, dtype: str | None = None,
               peak: float | None = None, flops_formula: str = "megatron", flops_per_sample: float | None = None,
               orchestrator: str | None = None, segment: int | str | None = None) -> Imported:
    """A schema-v1 summary of a run from its log; the facts a log lacks come as arguments. A named
    pipe or `<(command)` is read once."""
    if fmt is not None and fmt not in FORMATS:
        raise ReportError(f"unknown log format {fmt!r}; choose one of {list(FORMATS)}")
    if spec is None and flops_per_sample is None:
        raise ReportError("give the model (--model or --model-spec) or --flops-per-sample")
    with read_once(path):
        read = read_log(path, fmt, rank, global_batch_size, segment)
        network_section = _network(path, read, num_nodes)
        step_times = crosscheck_megatron.read_step_times(path) if megatron.BRIDGE_STYLE in read.styles else []
    valid, bad = _split_bad_times(read.steps)
    where = f"{path}: {read.segment.where}" if read.segment.of > 1 else str(path)  # what the messages name
    if not valid:
        raise ReportError(f"{where}: no step has a usable time: all {len(bad)} are {UNUSABLE_TIMES} "
                          "(check the log)")
    start_step = valid[0].step - 1  # the warm-up is the log's first steps, wherever it starts
    stats = RunStats(world_size=1, warmup_steps=0 if window else warmup_steps, start_step=start_step)
    measured = _measured(where, valid, window, stats, warmup_steps)
    batch = _global_batch_size(path, read, measured, global_batch_size)
    tokens_checked = _check_stated_tokens(path, valid, seq_length, batch, num_gpus)
    # In intervals, as the callback adds them: all at once, a million steps' rows of every column were
    # held together (some 500 MB).
    for start in range(0, len(measured), STATS_INTERVAL):
        stats.add(rank_rows([[StepTimes(s.step, s.seconds) for s in measured[start:start + STATS_INTERVAL]]]))

    spec, flops_per_sample, flops_given = _model_flops(spec, seq_length, flops_per_sample, flops_formula)
    peak_tflops, peak_source = resolve_peak(peak, gpu_name, dtype)
    facts = RunFacts(
        name=name or (path.stem if path.is_file() else path.name), label=label, global_batch_size=batch,
        micro_batch_size=None, seq_length=seq_length, model_name=model_name, model_spec=spec,
        flops_formula=USER_FLOPS if flops_given else flops_formula, flops_per_sample=flops_per_sample,
        gpu_name=gpu_name or "unknown", num_gpus=num_gpus, num_nodes=num_nodes, dtype=dtype,
        peak_tflops=peak_tflops, peak_source=peak_source, source=f"import:{read.fmt}",
        environment={"orchestrator": orchestrator or "unknown", "imported_from": str(path.absolute()),
                     "imported_rank": read.rank, "imported_segment": read.segment.record(),
                     "log_styles": sorted(read.styles),
                     # what imported it; the run's own libraries are not in its log
                     "imported_with": {"nemo-throughput": environment.package_version()}},
    )
    log_timing = LogTiming(
        window=window.text if window else f"{start_step + warmup_steps + 1}:",
        steps=[[s.step, s.seconds] for s in valid],
        excluded_step_times={"count": len(bad), "steps": [[s.step, repr(s.seconds)] for s in bad[:MAX_LISTED]]})
    summary = build_summary(facts, stats, "completed", explained={"network": network_section}, log_timing=log_timing)
    checks = _flops_crosscheck(read, measured, step_times, facts, None if flops_given else spec)
    summary["model"]["flops_crosscheck"] = [c.record() for c in checks] or None
    notes = (_notes(read, bad) + _window_notes(read, valid, measured, window) + _spacing_notes(read, measured)
             + _above_peak_notes(facts, summary) + _half_a_peak_notes(gpu_name, dtype, peak)
             + _flops_notes(facts))
    if tokens_checked:
        notes.append(f"the log's own tokens/s per GPU agree with --seq-length {seq_length} and --num-gpus {num_gpus} "
                     f"({tokens_checked} line(s) checked)")
    return Imported(summary, notes + [c.note for c in checks])


def _model_flops(spec: ModelSpec | None, seq_length: int, given: float | None,
                 formula: str) -> tuple[ModelSpec | None, float, bool]:
    """The model's shape at the log's sequence length, its FLOPs per sample, and whether they were given."""
    if spec is not None:
        spec = ModelSpec.from_dict({**spec.to_dict(), "seq_length": seq_length})
    return (spec, model_flops_per_sample(spec, formula), False) if given is None else (spec, given, True)


def _flops_crosscheck(read: ReadLog, measured: list[Step], step_times: list[tuple[int, float, float]],
                      facts: RunFacts, spec: ModelSpec | None) -> list[crosscheck.Result]:
    """The model TFLOP/s per GPU a Megatron or NeMo 2 log (or event file) states against ours from the facts
    given (crosscheck)."""
    given = crosscheck.Facts(
        model=f"the model given ({facts.model_name})" if spec is not None else "--flops-per-sample",
        seq_length=facts.seq_length, batch=facts.global_batch_size,
        batch_stated=any(s.global_batch_size is not None for s in measured), num_gpus=facts.num_gpus,
        num_nodes=facts.num_nodes, peak_tflops=facts.peak_tflops, formula=facts.flops_formula)
    flops = None if spec else facts.flops_per_sample
    if read.fmt == megatron.NAME:
        return crosscheck_megatron.check_import(read.steps, step_times, spec, flops, given)
    if read.rate_field is None:
        return []
    if read.fmt == tensorboard.NAME and read.interval_means:
        return crosscheck_megatron.check_events(read.steps, spec, flops, given)
    if read.fmt == tensorboard.NAME:
        return crosscheck_nemo.check_import(read.steps, crosscheck_nemo.event_field(read.rate_field),
                                            crosscheck.float32_unit, spec, flops, given)
    return crosscheck_nemo.check_import(read.steps, crosscheck_nemo.printer_field(read.rate_field),
                                        crosscheck_nemo.printed_unit, spec, flops, given)


def _network(path: Path, read: ReadLog, num_nodes: int) -> dict[str, Any] | None:
    """The network section from the log's NCCL_DEBUG=INFO lines, all ranks' (None without any)."""
    if read.fmt == tensorboard.NAME:
        return None
    return network.section_from_log((line.text for line in read_lines(path)), str(path), num_nodes)


def _measured(where: str, valid: list[Step], window: Window | None, stats: RunStats, warmup_steps: int) -> list[Step]:
    """The steps that count: the window's, or all after the warm-up."""
    counted = window.select([(s.step, s) for s in valid]) if window else [(s.step, s) for s in valid]
    measured = [s for n, s in counted if not stats.is_warmup(n)]
    if not measured:
        printed = ", ".join(str(s.step) for s in valid[:MAX_LISTED]) + (" ..." if len(valid) > MAX_LISTED else "")
        raise ReportError(f"{where}: no step left to measure: it has steps {valid[0].step} to {valid[-1].step}, "
                          + (f"--window {window.text} selects none (the log prints steps {printed}; a window A:B "
                             "holds A to B-1)" if window else
                             f"the first {warmup_steps} are warm-up (give --warmup or --window)"))
    return measured


def _notes(read: ReadLog, bad: list[Step]) -> list[str]:
    notes = [f"read {read.rank_note}"] if read.rank_note else []
    notes += [read.segment_note] if read.segment_note else []
    if read.cut_line is not None:
        number, why = read.cut_line
        notes.append(f"warning: line {number}, the last step line, looks cut ({why}): not read, its numbers may be "
                     "cut short (was the job killed, or the log still being written?)")
    if read.no_value_lines:
        listed = ", ".join(map(str, read.no_value_lines[:MAX_LISTED])) + (" ..." if len(read.no_value_lines) > MAX_LISTED
                                                                           else "")
        notes.append(f"warning: {len(read.no_value_lines)} step line(s) print no `{megatron.TAG}` of their own, only "
                     f"Primus' running average after a `/` (line {listed}): left out, the average is never read")
    if read.interval_means and read.fmt == tensorboard.NAME:
        notes.append(f"step times from Megatron's `{tensorboard.MEGATRON.time_tag}` scalar: each the mean of the "
                     f"{_log_interval(read.steps)} iterations of its log interval up to its step, counted as one "
                     "sample (as the text log's `elapsed time per iteration (ms)`)")
    if megatron.BRIDGE_STYLE in read.styles:
        notes.append("Megatron-Bridge log: step times from its iteration lines; its `Step Time : ... TFLOP/s/GPU` "
                     "lines (rank 0, the same time rounded to 10 ms, TFLOP/s by Bridge's own FLOPs) are not read as "
                     "steps, only to cross-check the facts given")
    if bad:
        listed = ", ".join(f"{s.step} ({s.seconds:g} s)" for s in bad[:MAX_LISTED])
        notes.append(f"warning: {len(bad)} step time(s) left out, {UNUSABLE_TIMES}: {listed}"
                     + (" ..." if len(bad) > MAX_LISTED else ""))
    return notes


def _above_peak_notes(facts: RunFacts, summary: dict[str, Any]) -> list[str]:
    """The callback's warning for an MFU above 100 % (reported as null), as an import note."""
    above_peak = summary["throughput"].get("mfu_above_peak")
    if above_peak is None:
        return []
    return ["warning: " + mfu_above_peak_warning(facts, above_peak).removeprefix("nemo-throughput: ")]


def _flops_notes(facts: RunFacts) -> list[str]:
    """--flops-per-sample far from what the --model's shape counts: likely another unit (flops.flops_unlike_the_shape)."""
    if facts.flops_formula != USER_FLOPS or facts.model_spec is None:
        return []
    unlike = flops_unlike_the_shape(facts.flops_per_sample, facts.model_spec, facts.global_batch_size)
    return [f"warning: {unlike}"] if unlike else []


def _half_a_peak_notes(gpu_name: str | None, dtype: str | None, peak: float | None) -> list[str]:
    """--gpu-name or --dtype, given for MFU, without the other: the table has no peak to look up, and an
    MFU left null without a word looks like a GPU the table lacks."""
    if peak is not None or bool(gpu_name) == bool(dtype):
        return []
    given, missing = ("--gpu-name", "--dtype (bf16, fp8, ...)") if gpu_name else ("--dtype", "--gpu-name")
    return [f"warning: no MFU: {given} without {missing} names no peak to divide by (give both, or --peak-tflops)"]


def _window_notes(read: ReadLog, valid: list[Step], measured: list[Step], window: Window | None) -> list[str]:
    """Megatron prints each time as the mean of the `log_interval` iterations up to it: a window
    cannot measure anything finer than those intervals."""
    interval = _log_interval(valid)
    if window is None or not read.interval_means or interval <= 1:
        return []
    covered = f"iterations {max(1, measured[0].step - interval + 1)}-{measured[-1].step}"
    if window.start is not None and window.start < 0:  # -N: and last select printed values, not steps
        return [f"--window {window.text} counts printed values, each the mean of {interval} iterations (the log "
                f"interval): {len(measured)} value(s), {covered}"]
    stop = window.stop if window.stop is not None else valid[-1].step + 1
    span = stop - (window.start or 0)
    if span >= interval and len(measured) == 1:
        return [f"--window {window.text} holds one printed value, the mean of the {interval} iterations up to it "
                f"(the log interval): it measures {covered}, {interval} steps, as one sample"]
    if span >= interval:
        return []
    return [f"warning: --window {window.text} spans {span} step(s), fewer than the log interval of {interval}: each "
            f"printed time is the mean of the {interval} iterations up to it, so this measures {covered}, nothing "
            "finer (give a window of whole intervals)"]


def _spacing_notes(read: ReadLog, measured: list[Step]) -> list[str]:
    """Megatron prints every log interval: counted iterations printed unevenly apart mean lines are
    missing (a trimmed or filtered log), and each printed time still counts as one sample."""
    if not read.interval_means:
        return []
    printed = [s.step for s in read.steps if measured[0].step <= s.step <= measured[-1].step]
    gaps = sorted({b - a for a, b in zip(printed, printed[1:], strict=False)})
    if len(gaps) <= 1:
        return []
    return [f"warning: the counted iterations are printed unevenly, {', '.join(map(str, gaps))} apart (lines missing "
            "from the log?): each printed time counts as one sample, whatever number of iterations it stands for"]


def _log_interval(steps: list[Step]) -> int:
    """The most common distance between printed step numbers (1 when there is one step)."""
    gaps = Counter(b.step - a.step for a, b in zip(steps, steps[1:], strict=False))
    return gaps.most_common(1)[0][0] if gaps else 1


ROUNDED = 0.05  # Primus prints milliseconds and tokens/s to 0.1: half of it either way


def _check_stated_tokens(path: Path, steps: list[Step], seq_length: int, batch: int, num_gpus: int) -> int:
    """The tokens/s per GPU a Primus log states must be ours, from the facts given, up to its rounding:
    otherwise --seq-length or --num-gpus is not the run's. Returns how many lines were checked."""
    stated = [s for s in steps if s.tokens_per_s_per_gpu is not None]
    for s in stated:
        samples = s.global_batch_size or batch
        ours = seq_length * samples / s.seconds / num_gpus
        allowed = 1.5 * (ours * ROUNDED / (s.seconds * 1e3) + ROUNDED)
        if abs(ours - s.tokens_per_s_per_gpu) > allowed:
            raise ReportError(
                f"{path}: line {s.line}: the log states {s.tokens_per_s_per_gpu:,.1f} tokens/s per GPU at iteration "
                f"{s.step}, but --seq-length {seq_length} x global batch {samples} / {s.seconds * 1e3:.1f} ms / "
                f"--num-gpus {num_gpus} is {ours:,.1f} (correct --seq-length or --num-gpus to the run's)")
    return len(stated)


def _ranks_with_steps(path: Path, formats: Iterable[str]) -> tuple[set[tuple[str, str | None]], bool]:
    """(format, rank label) of every rank whose lines look like step lines, and whether the log has
    Megatron-Bridge's rank-0 `Step Time :` lines (found in the same pass over the file)."""
    found, bridge = set(), False
    for line in read_lines(path):
        for name in formats:
            if TEXT_FORMATS[name].matches(line.text):
                found.add((name, line.rank))
        bridge = bridge or megatron.is_bridge_step_time(line.text)
    return found, bridge


def _rank_order(label: str | None) -> tuple[int, list[int], str]:
    if label is None:
        return 0, [], ""
    numbers = [number for part in label.replace("pid ", "").split("/") if (number := whole_number(part)) is not None]
    return 1, numbers, label


def _choose_rank(path: Path, labels: list[str | None], wanted: str | None) -> str | None:
    if wanted is None:
        if None in labels and len(labels) > 1:
            raise ReportError(f"{path}: step lines both with and without a rank prefix (ranks "
                              f"{', '.join(str(r) for r in labels if r is not None)}) (give --rank, or a log "
                              "written by one launcher)")
        return labels[0]
    if wanted in labels:
        return wanted
    if labels == [None]:
        raise ReportError(f"{path}: --rank {wanted}: the log's lines have no rank prefix (leave out --rank)")
    by_last = [label for label in labels if label is not None and label.split("/")[-1] == wanted]
    if len(by_last) == 1:
        return by_last[0]
    printed = ", ".join(str(r) for r in labels[:MAX_LISTED])
    raise ReportError(f"{path}: --rank {wanted}: " + ("ambiguous" if by_last else "no step lines from it")
                      + f" (ranks that print step lines: {printed})")


def _split_bad_times(steps: list[Step]) -> tuple[list[Step], list[Step]]:
    """(usable, left out): a usable time is a positive number of seconds up to MAX_STEP_SECONDS."""
    valid: list[Step] = []
    bad: list[Step] = []
    for step in steps:
        (valid if 0 < step.seconds <= MAX_STEP_SECONDS else bad).append(step)  # NaN compares false: bad
    return valid, bad


def _global_batch_size(path: Path, read: ReadLog, measured: list[Step], given: int | None) -> int:
    """The batch of the counted steps: the one the log states (constant), checked against the given one."""
    stated = [s for s in measured if s.global_batch_size is not None]
    values = sorted({s.global_batch_size for s in stated})
    if len(values) > 1:
        first = next(s for s in stated if s.global_batch_size != stated[0].global_batch_size)
        final = next(s for s in stated if s.global_batch_size == stated[-1].global_batch_size)
        raise ReportError(
            f"{path}: the global batch size changes within the counted steps ({stated[0].global_batch_size} at step "
            f"{stated[0].step}, {first.global_batch_size} at step {first.step}): a batch-size ramp; count only "
            f"steps after it (e.g. --window {final.step}:)")
    if values and given is not None and values[0] != given:
        where = f"step {stated[0].step}" if read.fmt == tensorboard.NAME else f"line {stated[0].line}"
        raise ReportError(f"{path}: --global-batch-size {given} but the log says {values[0]} ({where}, from "
                          f"{read.batch_origin}) (leave out --global-batch-size or correct it)")
    if values:
        return values[0]
    if given is None:
        raise ReportError(f"{path}: the log does not state the global batch size (give --global-batch-size)")
    return given


def _bridge_step_time_only_message(path: Path) -> str:
    return (f"{path}: only Megatron-Bridge `Step Time : ...` lines, which carry no iteration number; the step "
            f"lines are its `{megatron.TAG}` iteration lines, printed by the last rank (give the whole log of the "
            "job, all ranks, not lines filtered with grep)")


# Progress lines that name a step but carry no step time: what they are, why, and what to do.
_NO_TIMING_CALLBACK = (f"a run without NeMo's TimingCallback logs no `{nemo.TAG}`",
                       "import a run that had the callback")
_UNTIMED_PROGRESS = (
    ("NeMo 2 progress lines", re.compile(r"Training epoch \d+, iteration \d+/\d+"), *_NO_TIMING_CALLBACK),
    ("NeMo 1.x progress bar updates", re.compile(r"\bglobal_step=\S"), *_NO_TIMING_CALLBACK),
    ("Megatron iteration lines", re.compile(r"\biteration\s+\d+/\s*\d+\s*\|"),
     "none prints `elapsed time per iteration (ms)` or `(s)`", "give the log as the job wrote it"),
)


def _untimed_progress_message(path: Path) -> str | None:
    """Why a log of progress lines without a step time holds no step, or None: such a log is the
    training log, and asking for the training log would mislead."""
    for line in read_lines(path):
        for what, pattern, why, to_do in _UNTIMED_PROGRESS:
            if pattern.search(line.text):
                return f"{path}: {what} (line {line.number}) but no step time: {why} ({to_do})"
    return None


def _no_steps_message(path: Path, fmt: str | None) -> str:
    untimed = _untimed_progress_message(path)
    if untimed is not None:
        return untimed
    if fmt is None:
        return (f"{path}: no step lines: neither NeMo's `{nemo.TAG}` nor Megatron-LM's `{megatron.TAG}` appears "
                "in it (give the training log, e.g. the Slurm .out file of the job)")
    what = {nemo.NAME: f"`{nemo.TAG}` progress lines", megatron.NAME: f"`{megatron.TAG}` iteration lines"}[fmt]
    return f"{path}: no {what} with a step number found (give the training log, or another --format)"
