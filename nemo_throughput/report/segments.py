"""A run resumed from its checkpoints is one run, however many summaries its segments wrote.

Each process of a restarted job writes its own summary with its own run.id; goodput.run_id (the
run's first segment's run.id) and goodput.segment join them. Counted as repeats, one run's segments
would pass for several measurements and shrink the spread. Joined, the run's step time is the mean
over all its segments' counted steps (each segment's mean weighted by its counted steps), so its
tokens/s are the tokens of those steps over their total time, exactly as one long segment would
have measured them. Summaries without goodput (ranks other than 0, imported runs) are never joined.

A segment that failed or was interrupted wrote a final summary of the steps it finished (run.measurement:
a step counts once its end is recorded, the one the failure cut is not), counted as a completed
segment counts its own: its steps join its run where a segment of the run completed, with a note.
Under --window the window is the run's: it is applied to all its segments' counted steps in the
order they were trained, so that `-N:` is the run's last N steps, not each segment's."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field, replace

from nemo_throughput.errors import ReportError
from nemo_throughput.report.comparable import (
    RunIdentity,
    differing,
    configuration,
    disagreeing,
    max_of_all,
    mean_of_all,
    mixed_networks,
    slowest_of,
    values_text,
)
from nemo_throughput.report.runs import (
    PHASES,
    PROFILE_FRACTIONS,
    Explanation,
    IncompleteRun,
    Run,
    Warmup,
    windowed,
)
from nemo_throughput.text import printable
from nemo_throughput.throughput import CountedStep


@dataclass
class Joined:
    """The runs to report, each resumed run's segments joined into one; notes for stderr; and the runs
    left out, each with why (IncompleteRun: none of its segments completed; ReportError: its window
    selects none of its steps, or it has no counted step)."""

    runs: list[Run] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    left_out: list[ReportError] = field(default_factory=list)


def join_segments(runs: list[Run]) -> Joined:
    """The runs with each resumed run's segments joined into one, where its first given segment
    stood. Copies must be gone (comparable.distinct_runs): two summaries claiming one segment of a
    run are two branches of it, refused. Every summary with goodput passes here, alone or not."""
    members: dict[str, list[Run]] = {}
    for run in runs:
        if run.resumed is not None:
            members.setdefault(run.resumed.run_id, []).append(run)
    joined = Joined()
    for run in runs:
        if run.resumed is None:
            joined.runs.append(run)
            continue
        segments = members[run.resumed.run_id]
        if run is not segments[0]:
            continue
        segments = sorted(segments, key=lambda segment: segment.resumed.segment)
        _require_one_run(segments)
        try:
            one, notes = _one_run(segments)
        except ReportError as error:
            joined.left_out.append(error)
            continue
        joined.runs.append(one)
        joined.notes += [_joined_note(segments)] * (len(segments) > 1) + notes
    return joined


def _one_run(segments: list[Run]) -> tuple[Run, list[str]]:
    """The run of its segments (in segment order), its window applied, and the window's notes;
    ReportError (IncompleteRun where none of them completed) where it cannot be reported."""
    if all(segment.incomplete for segment in segments):
        raise IncompleteRun(segments[0].incomplete if len(segments) == 1 else _none_completed(segments))
    if not any(segment.steps_counted for segment in segments):
        where = printable(segments[0].path) if len(segments) == 1 else _run_shown(segments)
        raise ReportError(f"{where}: no measured steps (the run was shorter than its warm-up)")
    run = segments[0] if len(segments) == 1 else _joined(segments)
    return (run, []) if run.pending_window is None else _windowed(run, segments)


def _none_completed(segments: list[Run]) -> str:
    listed = ", ".join(f"{s.resumed.segment}: {printable(s.path)} ({s.status})" for s in segments)
    return (f"the segments of run {printable(segments[0].resumed.run_id)} (goodput.run_id) given ({listed}) all "
            "ended before the run did, none completed: only completed runs are reported")


def _run_shown(segments: list[Run]) -> str:
    return f"run {printable(segments[0].resumed.run_id)} (segments {', '.join(printable(s.path) for s in segments)})"


def _windowed(run: Run, segments: list[Run]) -> tuple[Run, list[str]]:
    """The run over the steps --window selects of all its counted steps in the order trained: its
    segments one after the other (a later one may repeat step numbers of an earlier one, resumed
    from an older checkpoint; each execution is a measured step, and `-N:` takes the latest)."""
    if len(segments) == 1:
        where, ranges = printable(run.path), _steps_range(run.steps)
    else:
        where = _run_shown(segments)
        ranges = "; ".join(f"segment {s.resumed.segment}: {_steps_range(s.steps)}" for s in segments)
    selected, notes = windowed(run.pending_window, run.steps, where, ranges)
    return replace(run, step_time_s=statistics.fmean(t for _, t in selected), steps_counted=len(selected),
                   pending_window=None), notes


def _steps_range(steps: list[tuple[int, float]]) -> str:
    return f"steps {steps[0][0]} to {steps[-1][0]}" if steps else "no counted steps"


def _require_one_run(segments: list[Run]) -> None:
    """Segments of one run ran one configuration under one label, one segment per number."""
    run_id = printable(segments[0].resumed.run_id)
    counting = len({_counting(segment) for segment in segments}) > 1
    what = disagreeing(segments) + (["batch counting"] if counting else [])
    if what:
        names = differing([configuration(segment) for segment in segments])
        lines = [f"label {printable(s.label)}, batch counting {_counting(s)}" for s in segments]
        if names:
            lines = [f"{line}; {values}" for line, values in zip(lines, _values(segments, names), strict=True)]
        detail = "\n  ".join(f"{printable(s.path)}: {line}" for s, line in zip(segments, lines, strict=True))
        raise ReportError(f"the summaries of run {run_id} (goodput.run_id) differ in {', '.join(what)}, which its "
                          f"segments cannot (two runs claiming one id?); give the summaries of one run:\n  {detail}")
    by_number: dict[int, Run] = {}
    for segment in segments:
        other = by_number.setdefault(segment.resumed.segment, segment)
        if other is not segment:
            raise ReportError(f"{printable(other.path)} and {printable(segment.path)} both say they are segment "
                              f"{segment.resumed.segment} of run {run_id} (two branches resumed from one "
                              "checkpoint?): keep the summaries of the branch that went on")


def _counting(segment: Run) -> str:
    """How a segment counted its tokens: from the configuration, or from its batches (batch.counted)."""
    return f"from {printable(segment.counted.source)}" if segment.counted else "from the configuration"


def _values(segments: list[Run], names: list[str]) -> list[str]:
    """Each segment's values of `names`, as comparable.differences_by_file lists them."""
    configurations = [configuration(segment) for segment in segments]
    return [values_text(c, names, configurations) for c in configurations]


def _joined(segments: list[Run]) -> Run:
    """One run of the segments: their counted steps together, every per-step mean weighted by steps
    (a segment without counted steps has no means, and weighs nothing)."""
    first, measured = segments[0], [segment for segment in segments if segment.steps_counted]
    steps = [segment.steps_counted for segment in measured]
    windowed_steps = [step for s in segments for step in s.steps] if first.pending_window is not None else None
    return replace(
        first, step_time_s=mean_of_all([s.step_time_s for s in measured], steps), steps_counted=sum(steps),
        notes=[note for segment in segments for note in segment.notes],
        explanation=_joined_explanation([s.explanation for s in measured], steps),
        counted=_joined_counted([s.counted for s in measured], steps),
        identity=RunIdentity(f"segments:{first.resumed.run_id}",
                             f"the segments of run {printable(first.resumed.run_id)}"),
        warmup=_joined_warmup(segments), segments=segments, steps=windowed_steps, incomplete=None,
        status="completed", lacks=None)


def _joined_counted(counted: list[CountedStep | None], steps: list[int]) -> CountedStep | None:
    """Packed or padded batches as counted: per-step means weighted by steps (their totals over all steps)."""
    if counted[0] is None:
        return None
    return CountedStep(tokens=mean_of_all([c.tokens for c in counted], steps),
                       slots=mean_of_all([c.slots for c in counted], steps),
                       seqlen_sq=mean_of_all([c.seqlen_sq for c in counted], steps),
                       flops=mean_of_all([c.flops for c in counted], steps), source=counted[0].source)


def _joined_explanation(explained: list[Explanation], steps: list[int]) -> Explanation:
    """Per-step values weighted by steps, peaks the highest, the probe's mean, the worst straggler;
    each only where every segment has it."""
    keys = {key for e in explained for key in e.probe_busbw_gbps}
    probe = {key: mean_of_all([e.probe_busbw_gbps.get(key) for e in explained]) for key in keys}
    networks = {e.network for e in explained}
    return Explanation(
        explains=any(e.explains for e in explained),
        network=networks.pop() if len(networks) == 1 else mixed_networks(networks),
        fractions={name: mean_of_all([e.fractions[name] for e in explained], steps) for name in PROFILE_FRACTIONS},
        phases_s={name: mean_of_all([e.phases_s[name] for e in explained], steps) for name in PHASES},
        memory_peak_allocated_gib=max_of_all([e.memory_peak_allocated_gib for e in explained]),
        memory_peak_reserved_gib=max_of_all([e.memory_peak_reserved_gib for e in explained]),
        sm_clock_mhz=mean_of_all([e.sm_clock_mhz for e in explained], steps),
        power_w=mean_of_all([e.power_w for e in explained], steps),
        joules_per_token=mean_of_all([e.joules_per_token for e in explained], steps),
        probe_busbw_gbps={key: value for key, value in probe.items() if value is not None},
        straggler=slowest_of([e.straggler for e in explained]))


def _joined_warmup(segments: list[Run]) -> Warmup | None:
    """The segments' warm-up where they agree; None where they do not (the join's note names them)."""
    warmups = {segment.warmup for segment in segments}
    return warmups.pop() if len(warmups) == 1 else None


def _joined_note(segments: list[Run]) -> str:
    first = segments[0]
    listed = ", ".join(f"{segment.resumed.segment}: {printable(segment.path)} ({segment.steps_counted} steps)"
                       for segment in segments)
    note = (f"{len(segments)} summaries are segments of one resumed run {printable(first.resumed.run_id)} "
            f"(goodput.run_id): counted as one run, its step time over all {sum(s.steps_counted for s in segments)} "
            f"counted steps (segment {listed})")
    numbers = [segment.resumed.segment for segment in segments]
    missing = sorted(set(range(1, max(numbers) + 1)) - set(numbers))
    if missing:
        note += (f"; segment(s) {', '.join(map(str, missing))} not among them (not given, or left out: a summary "
                 "still `running` or `stalled` is of a segment that trains on or of one killed before its final "
                 "summary, and nothing in it says which)")
    note += "".join(f"; {_unfinished_text(s)}" for s in segments if s.incomplete)
    if first.pending_window is not None:
        note += _repeated_steps_text(segments)
    if len({segment.warmup for segment in segments}) > 1:
        warmups = ", ".join(f"{s.resumed.segment}: {s.warmup.shown}" if s.warmup else f"{s.resumed.segment}: none"
                            for s in segments)
        note += f"; its segments left out different warm-ups ({warmups})"
    networks = {segment.explanation.network for segment in segments}
    if len(networks) > 1:
        note += f"; its segments ran over different networks: {printable(mixed_networks(networks))}"
    return note


def _unfinished_text(segment: Run) -> str:
    """What a joined segment that failed or was interrupted adds to its run."""
    text = (f"segment {segment.resumed.segment} ended with status {segment.status}: its "
            f"{segment.steps_counted} counted steps, each finished before it ended, are counted")
    if segment.lacks:
        text += f" (its summary lacks {printable(segment.lacks)}: not counted)"
    return text


def _repeated_steps_text(segments: list[Run]) -> str:
    """Where a segment trained step numbers an earlier one had (resumed from a checkpoint older than
    where that one stopped): both executions were measured, and both count."""
    texts, reached = [], 0
    for segment in segments:
        repeated = [step for step, _ in segment.steps if step <= reached]
        if repeated:
            texts.append(f"segment {segment.resumed.segment} repeats counted steps {repeated[0]}-{repeated[-1]} of an "
                         "earlier segment (resumed from an older checkpoint): each execution is counted, `-N:` "
                         "counting back from the latest")
        reached = max([reached, *(step for step, _ in segment.steps)])
    return "".join(f"; {text}" for text in texts)
