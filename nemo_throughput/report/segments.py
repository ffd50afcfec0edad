"""A run resumed from its checkpoints is one run, however many summaries its segments wrote.

Each process of a restarted job writes its own summary with its own run.id; goodput.run_id (the
run's first segment's run.id) and goodput.segment join them. Counted as repeats, one run's segments
would pass for several measurements and shrink the spread. Joined, the run's step time is the mean
over all its segments' counted steps (each segment's mean weighted by its counted steps), so its
tokens/s are the tokens of those steps over their total time, exactly as one long segment would
have measured them. Summaries without goodput (ranks other than 0, imported runs) are never joined."""

from __future__ import annotations

from dataclasses import replace

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
from nemo_throughput.report.runs import PHASES, PROFILE_FRACTIONS, Explanation, Run, Warmup
from nemo_throughput.text import printable
from nemo_throughput.throughput import CountedStep


def join_segments(runs: list[Run]) -> tuple[list[Run], list[str]]:
    """The runs with each resumed run's segments joined into one, where its first segment was
    given, and a note naming each joined run's segments. Copies must be gone (comparable.distinct_runs):
    two summaries claiming one segment of a run are two branches of it, refused."""
    members: dict[str, list[Run]] = {}
    for run in runs:
        if run.resumed is not None:
            members.setdefault(run.resumed.run_id, []).append(run)
    joined, notes = [], []
    for run in runs:
        segments = members.get(run.resumed.run_id, []) if run.resumed is not None else []
        if len(segments) < 2:
            joined.append(run)
        elif run is segments[0]:
            segments = sorted(segments, key=lambda segment: segment.resumed.segment)
            _require_one_run(segments)
            joined.append(_joined(segments))
            notes.append(_joined_note(segments))
    return joined, notes


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
    """One run of the segments: their counted steps together, every per-step mean weighted by steps."""
    first, steps = segments[0], [segment.steps_counted for segment in segments]
    return replace(
        first, step_time_s=mean_of_all([s.step_time_s for s in segments], steps), steps_counted=sum(steps),
        notes=[note for segment in segments for note in segment.notes],
        explanation=_joined_explanation([s.explanation for s in segments], steps),
        counted=_joined_counted([s.counted for s in segments], steps),
        identity=RunIdentity(f"segments:{first.resumed.run_id}",
                             f"the segments of run {printable(first.resumed.run_id)}"),
        warmup=_joined_warmup(segments), segments=segments)


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
        note += f"; segment(s) {', '.join(map(str, missing))} not among them (not given, or did not complete)"
    if len({segment.warmup for segment in segments}) > 1:
        warmups = ", ".join(f"{s.resumed.segment}: {s.warmup.shown}" if s.warmup else f"{s.resumed.segment}: none"
                            for s in segments)
        note += f"; its segments left out different warm-ups ({warmups})"
    networks = {segment.explanation.network for segment in segments}
    if len(networks) > 1:
        note += f"; its segments ran over different networks: {printable(mixed_networks(networks))}"
    return note
