"""From runs to the comparison benchmark studies print: configurations (label or network x model x
node/GPU count) with mean and spread over repeats, scaling against the fewest GPUs on a curve, and
environments against a baseline; and, where the summaries explain their numbers, why:
communication, memory, clocks, power, energy, the slowest rank, where the step time goes, and the
start-up fabric probe. :mod:`~nemo_throughput.report.rendering` prints a :class:`Report`."""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from operator import attrgetter
from typing import Any

from nemo_throughput.report.comparable import (
    ENVIRONMENTS,
    REPEATS,
    SCALED,
    configuration,
    described,
    differences_by_file,
    differing,
    distinct_runs,
    max_of_all,
    mean_of_all,
    mixed_networks,
    network_names,
    slowest_of,
    warmup_note,
)
from nemo_throughput.report.goodput import goodput_records
from nemo_throughput.report.runs import PHASES, PROFILE_FRACTIONS, ReportError, Run
from nemo_throughput.report.segments import join_segments
from nemo_throughput.report.time_to_train import TrainGroup, time_to_train_records
from nemo_throughput.text import printable
from nemo_throughput.throughput import days_to_train
from nemo_throughput.timing import PHASE_TIMES


@dataclass
class Group:
    """The repeats of one configuration: label x model x node/GPU count."""

    label: str
    model: str
    num_nodes: int
    num_gpus: int
    runs: int
    tokens_per_s: float | None  # mean over runs; None for runs rated in samples/s
    tokens_per_s_std: float | None  # sample standard deviation over runs (0 for one run)
    tokens_per_s_per_gpu: float | None
    step_time_s: float
    model_tflops_per_gpu: float | None
    mfu: float | None
    days_to_train: float | None
    global_batch_size: int
    seq_length: int | None
    samples_per_s: float  # mean over runs
    samples_per_s_std: float
    samples_per_s_per_gpu: float
    unit: str = "tokens"  # what the primary rate counts: tokens, or samples (images, ...)
    files: list[str] = field(default_factory=list)
    linear_factor: float | None = None  # rate over the curve's start's (its fewest GPUs), same label and model
    perfect_linear_factor: float | None = None  # GPU count over the curve's start's
    perfect_linear_scale: float | None = None  # the rate if scaling were perfect
    scaling_efficiency: float | None = None  # linear factor / perfect linear factor
    # Why the step time is what it is. None: not in the summaries, or not in every run of the
    # configuration (a value from some repeats only would pass for all of them).
    network: str | None = None  # network.label: RDMA, IPoIB, TCP, intra-node
    compute_share: float | None = None  # of the profiled steps' time, mean over ranks (and runs)
    communication_share: float | None = None  # collectives, overlapped with compute or not
    exposed_communication_share: float | None = None  # collectives while no compute ran
    idle_share: float | None = None
    logging_s: float | None = None  # the step's phases (timing.PHASE_TIMES), mean over ranks (and runs)
    data_s: float | None = None
    forward_s: float | None = None
    backward_s: float | None = None
    optimizer_s: float | None = None
    memory_peak_reserved_gib: float | None = None  # max over ranks and runs
    memory_peak_allocated_gib: float | None = None
    sm_clock_mhz: float | None = None  # median over ranks, mean over runs
    power_w: float | None = None  # median over ranks, mean over runs
    joules_per_token: float | None = None
    probe_all_reduce_busbw_gbps: float | None = None  # at the largest size every run probed
    probe_all_reduce_bytes: int | None = None
    straggler_rank: int | None = None  # the slowest rank of the run where it was slowest
    straggler_host: str | None = None
    straggler_gpu_index: int | None = None
    straggler_metric: str | None = None
    straggler_excess_pct: float | None = None
    probe_busbw_gbps: dict[tuple[str, int], float | None] = field(default_factory=dict)  # the probe table

    @property
    def rate(self) -> float:
        """The primary rate, tokens/s or samples/s (``unit``): what scaling and comparisons use."""
        return self.tokens_per_s if self.unit == "tokens" else self.samples_per_s

    @property
    def rate_std(self) -> float:
        return self.tokens_per_s_std if self.unit == "tokens" else self.samples_per_s_std


# The fields every report has; the others are shown only where some configuration has a value.
BASE_FIELDS = ("label", "model", "num_nodes", "num_gpus", "runs", "tokens_per_s", "tokens_per_s_std",
               "tokens_per_s_per_gpu", "step_time_s", "model_tflops_per_gpu", "mfu", "days_to_train",
               "global_batch_size", "seq_length", "files", "linear_factor", "perfect_linear_factor",
               "perfect_linear_scale", "scaling_efficiency")
SAMPLE_FIELDS = ("unit", "samples_per_s", "samples_per_s_std", "samples_per_s_per_gpu")  # when some run has no tokens
# Columns of the configuration table, by family: shown (all of a family) when any configuration has one.
COLUMN_FAMILIES = (("network",), ("communication_share",), ("exposed_communication_share",),
                   ("memory_peak_reserved_gib", "memory_peak_allocated_gib"), ("sm_clock_mhz",), ("power_w",),
                   ("joules_per_token",), ("probe_all_reduce_busbw_gbps", "probe_all_reduce_bytes"),
                   ("straggler_rank", "straggler_host", "straggler_gpu_index", "straggler_metric",
                    "straggler_excess_pct"))
SHARES = ("compute_share", "communication_share", "exposed_communication_share", "idle_share")
PHASE_FIELDS = PHASE_TIMES
STEP_TIME_FIELDS = ("label", "model", "num_nodes", "num_gpus", "step_time_s", *SHARES, *PHASE_FIELDS)
PROBE_FIELDS = ("op", "bytes", "label", "model", "num_nodes", "num_gpus", "busbw_gbps")
PROBE_OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "sendrecv")  # the probe's order
GROUP_BY = ("label", "network")
UNKNOWN_NETWORK = "unknown"  # the group of runs whose summaries name no network, under --group-by network


SAMPLE_COMPARISON_FIELDS = ("unit", "baseline_samples_per_s", "other_samples_per_s")


@dataclass
class Comparison:
    model: str
    num_nodes: int
    num_gpus: int
    baseline: str
    other: str
    baseline_runs: int  # the runs each side's mean is over
    other_runs: int
    baseline_tokens_per_s: float | None
    other_tokens_per_s: float | None
    diff_pct: float  # 100 * (baseline - other) / baseline: positive when `other` is slower
    unit: str = "tokens"  # samples: the rates below, and diff_pct, are samples/s
    baseline_samples_per_s: float | None = None
    other_samples_per_s: float | None = None

    def record(self, with_samples: bool) -> dict[str, Any]:
        record = asdict(self)
        if not with_samples:
            for name in SAMPLE_COMPARISON_FIELDS:
                del record[name]
        return record


@dataclass
class Report:
    groups: list[Group]
    comparisons: list[Comparison]
    tokens: float  # the token budget of days_to_train
    baseline: str | None
    group_by: str = "label"  # one of GROUP_BY
    shown: tuple[str, ...] = ()  # the fields of COLUMN_FAMILIES some configuration has, in their order
    step_time: bool = False  # whether the summaries say where the step time goes
    notes: list[str] = field(default_factory=list)  # for stderr, e.g. repeats that differ in network
    time_to_train: list[TrainGroup] = field(default_factory=list)  # MLPerf-style runs (imported result logs)
    goodput: list[dict[str, Any]] = field(default_factory=list)  # each run's goodput section (report.goodput)
    # Runs left out once their segments were joined (report.segments.Joined), each with why
    left_out: list[ReportError] = field(default_factory=list)

    @property
    def has_samples(self) -> bool:
        """Some configuration is rated in samples/s: its fields are added (older reports stay as they were)."""
        return any(g.unit == "samples" for g in self.groups)

    @property
    def group_fields(self) -> tuple[str, ...]:
        return (*BASE_FIELDS, *(SAMPLE_FIELDS if self.has_samples else ()), *self.shown)

    @property
    def probe_rows(self) -> list[tuple[str, int]]:
        """(collective, bytes) of the probe table: those some configuration has; empty: no probe."""
        keys = {key for g in self.groups for key, value in g.probe_busbw_gbps.items() if value is not None}
        rank = {op: i for i, op in enumerate(PROBE_OPS)}
        return sorted(keys, key=lambda key: (rank.get(key[0], len(PROBE_OPS)), key[0], key[1]))

    @property
    def probe_groups(self) -> list[Group]:
        """The configurations with probe results (the probe table's columns)."""
        return [g for g in self.groups if g.probe_busbw_gbps]

    def to_json(self) -> dict[str, Any]:
        """Today's keys, plus the explaining ones only where some run has them."""
        fields = self.group_fields
        data: dict[str, Any] = {"tokens": self.tokens, "baseline": self.baseline}
        if self.group_by != "label":
            data["group_by"] = self.group_by
        data["groups"] = [{name: getattr(g, name) for name in fields} for g in self.groups]
        data["comparisons"] = [c.record(self.has_samples) for c in self.comparisons]
        if self.step_time:
            data["step_time"] = step_time_records(self)
        if self.probe_rows:
            data["probe"] = probe_records(self)
        if self.time_to_train:
            data["time_to_train"] = time_to_train_records(self.time_to_train)
        if self.goodput:
            data["goodput"] = goodput_records(self.goodput)
        return data


def step_time_fields(report: Report) -> list[str]:
    """STEP_TIME_FIELDS, with the network after the label where runs are grouped by label and name one."""
    if report.group_by == "label" and "network" in report.shown:
        return ["label", "network", *STEP_TIME_FIELDS[1:]]
    return list(STEP_TIME_FIELDS)


def step_time_records(report: Report) -> list[dict[str, Any]]:
    fields = step_time_fields(report)
    return [{name: getattr(g, name) for name in fields} for g in report.groups]


def probe_records(report: Report) -> list[dict[str, Any]]:
    """One record per collective, size and configuration (busbw_gbps None: not probed by every run)."""
    return [{"op": op, "bytes": size, "label": g.label, "model": g.model, "num_nodes": g.num_nodes,
             "num_gpus": g.num_gpus, "busbw_gbps": g.probe_busbw_gbps.get((op, size))}
            for op, size in report.probe_rows for g in report.probe_groups]


def build_report(runs: list[Run], tokens: float = 1e12, baseline: str | None = None,
                 group_by: str = "label") -> Report:
    """Runs grouped by configuration: `group_by` label (run.label, as given at launch) or network
    (the network label the summaries record: RDMA, IPoIB, TCP, ...), model and node/GPU count."""
    if group_by not in GROUP_BY:
        raise ReportError(f"group by {group_by!r}: use one of {GROUP_BY}")
    _require_distinct_when_printed(runs)
    runs, notes = distinct_runs(runs)
    joined = join_segments(runs)
    runs, notes = joined.runs, notes + joined.notes
    try:
        groups = [_group(members, tokens, group_by, notes) for members in _by_configuration(runs, group_by).values()]
        groups.sort(key=lambda g: (g.model, g.label, g.num_gpus))
        _add_scaling(groups, runs, group_by, notes)
        labels = sorted({g.label for g in groups})
        if baseline is not None and baseline not in labels:
            what = "network label" if group_by == "network" else "label"
            raise ReportError(f"--baseline {baseline!r} is not a {what} of these runs; their {what}s are {labels}")
        comparisons = _compare(groups, runs, baseline, group_by, notes) if baseline else []
    except OverflowError as error:
        raise ReportError(f"the numbers of these runs overflow when combined ({error}); check --tokens and the "
                          "summaries' step times and batch sizes") from error
    report = Report(groups, comparisons, tokens, baseline, group_by=group_by, shown=_shown_fields(groups, group_by),
                    step_time=_says_where_time_goes(groups, runs), notes=notes, left_out=joined.left_out)
    _require_finite(report)
    return report


def _shown_fields(groups: list[Group], group_by: str) -> tuple[str, ...]:
    shown = [family for family in COLUMN_FAMILIES
             if any(getattr(g, name) is not None for g in groups for name in family)]
    if group_by == "network" and ("network",) not in shown:
        shown.insert(0, ("network",))
    return tuple(name for family in shown for name in family)


def _says_where_time_goes(groups: list[Group], runs: list[Run]) -> bool:
    """A profiled window anywhere, or phases from summaries of a version that explains its step
    time (older summaries carry the phases too, but their report stays as it was)."""
    profiled = any(getattr(g, name) is not None for g in groups for name in SHARES)
    phased = any(getattr(g, name) is not None for g in groups for name in PHASE_FIELDS)
    return profiled or (phased and any(run.explanation.explains for run in runs))


def _require_finite(report: Report) -> None:
    """Each run's numbers are finite (runs.load_run checks); combined with --tokens they may not be."""
    for row in (*report.groups, *report.comparisons):
        for name, value in asdict(row).items():
            if isinstance(value, float) and not math.isfinite(value):
                raise ReportError(f"{name} is {value} for {printable(row.model)} at {row.num_nodes} nodes; "
                                  "check --tokens and the summaries' step times")


def _require_distinct_when_printed(runs: list[Run]) -> None:
    """Two labels (or models) that print the same, e.g. `k8s` and `k8s` wrapped in colour codes,
    would be two rows no reader can tell apart: refuse rather than show them."""
    named = [("labels", attrgetter("label")), ("models", attrgetter("model")),
             ("network labels", lambda run: run.explanation.network or UNKNOWN_NETWORK)]
    for what, name_of in named:
        printed: dict[str, list[str]] = {}
        for name in sorted({name_of(run) for run in runs}):
            printed.setdefault(printable(name), []).append(name)
        for shown_as, originals in printed.items():
            if len(originals) > 1:
                files = ", ".join(str(run.path) for run in runs if name_of(run) in originals)
                raise ReportError(f"{what} {', '.join(map(repr, originals))} all print as {shown_as!r} once control "
                                  f"characters are removed; correct them in {files}")


def grouping_label(run: Run, group_by: str) -> str:
    if group_by == "network":
        return run.explanation.network or UNKNOWN_NETWORK
    return run.label


def _by_configuration(runs: list[Run], group_by: str = "label") -> dict[tuple, list[Run]]:
    configurations: dict[tuple, list[Run]] = {}
    for run in runs:
        key = (grouping_label(run, group_by), run.model, run.num_nodes, run.num_gpus)
        configurations.setdefault(key, []).append(run)
    return configurations


def _group(runs: list[Run], tokens: float, group_by: str, notes: list[str]) -> Group:
    first = runs[0]
    label = grouping_label(first, group_by)
    what = f"{printable(label)} / {printable(first.model)} / {first.num_nodes} nodes"
    _require_same_setup(runs, what)
    _note_warmups(runs, what, notes)
    per_run = [run.workload.metrics(run.step_time_s) for run in runs]
    mfus = [m["mfu"] for m in per_run]
    tflops = [m["model_tflops_per_gpu"] for m in per_run]
    samples = _rate([m["samples_per_s"] for m in per_run], first.num_gpus)
    token_rates = _rate([m["tokens_per_s"] for m in per_run], first.num_gpus) if first.unit == "tokens" else None
    return Group(
        label=label, model=first.model, num_nodes=first.num_nodes, num_gpus=first.num_gpus, runs=len(runs),
        tokens_per_s=token_rates and token_rates[0], tokens_per_s_std=token_rates and token_rates[1],
        tokens_per_s_per_gpu=token_rates and token_rates[2],
        step_time_s=statistics.fmean(run.step_time_s for run in runs),
        model_tflops_per_gpu=statistics.fmean(tflops) if None not in tflops else None,
        mfu=statistics.fmean(mfus) if None not in mfus else None,
        days_to_train=days_to_train(tokens, token_rates[0]) if token_rates else None,
        global_batch_size=first.global_batch_size, seq_length=first.seq_length,
        samples_per_s=samples[0], samples_per_s_std=samples[1], samples_per_s_per_gpu=samples[2], unit=first.unit,
        files=[str(path) for run in runs for path in run.paths],
        **explained_values(runs, what, notes),
    )


def _rate(per_run: list[float], num_gpus: int) -> tuple[float, float, float]:
    """Mean over runs, sample standard deviation (0 for one run), mean per GPU."""
    mean = statistics.fmean(per_run)
    return mean, statistics.stdev(per_run) if len(per_run) > 1 else 0.0, mean / num_gpus


def explained_values(runs: list[Run], what: str, notes: list[str]) -> dict[str, Any]:
    """A configuration's explaining values from its runs: each only when every run has it."""
    explanations = [run.explanation for run in runs]
    values: dict[str, Any] = {"network": _network(runs, what, notes)}
    for name in PROFILE_FRACTIONS:
        values[f"{name}_share"] = mean_of_all([e.fractions[name] for e in explanations])
    for name in PHASES:
        values[f"{name}_s"] = mean_of_all([e.phases_s[name] for e in explanations])
    for name in ("memory_peak_reserved_gib", "memory_peak_allocated_gib"):
        values[name] = max_of_all([getattr(e, name) for e in explanations])
    for name in ("sm_clock_mhz", "power_w", "joules_per_token"):
        values[name] = mean_of_all([getattr(e, name) for e in explanations])
    values["probe_busbw_gbps"] = _probe_means(explanations)
    values.update(_largest_all_reduce(values["probe_busbw_gbps"]))
    values.update(_slowest(explanations))
    return values


def _network(runs: list[Run], what: str, notes: list[str]) -> str | None:
    """The network label of a configuration's runs; repeats that differ are named, with a note."""
    labels = {run.explanation.network for run in runs}
    if len(labels) == 1:
        return labels.pop()
    notes.append(f"runs of {what} differ in network ({', '.join(map(printable, network_names(labels)))}); their "
                 "tokens/s are averaged as one configuration: give them different labels, or use --group-by network")
    return mixed_networks(labels)


def _probe_means(explanations: list[Any]) -> dict[tuple[str, int], float | None]:
    """Mean busbw per (collective, bytes) over the runs; None where some run lacks it."""
    keys = {key for e in explanations for key in e.probe_busbw_gbps}
    return {key: mean_of_all([e.probe_busbw_gbps.get(key) for e in explanations]) for key in keys}


def _largest_all_reduce(busbw: dict[tuple[str, int], float | None]) -> dict[str, Any]:
    sizes = [size for (op, size), value in busbw.items() if op == "all_reduce" and value is not None]
    if not sizes:
        return {"probe_all_reduce_busbw_gbps": None, "probe_all_reduce_bytes": None}
    return {"probe_all_reduce_busbw_gbps": busbw[("all_reduce", max(sizes))], "probe_all_reduce_bytes": max(sizes)}


def _slowest(explanations: list[Any]) -> dict[str, Any]:
    """The slowest rank of the run in which it was furthest above the median (every run must name one)."""
    worst = slowest_of([e.straggler for e in explanations])
    if worst is None:
        return {}
    return {"straggler_rank": worst.rank, "straggler_host": worst.host, "straggler_gpu_index": worst.gpu_index,
            "straggler_metric": worst.metric, "straggler_excess_pct": worst.excess_pct}


def _require_same_setup(runs: list[Run], what: str, may_differ: frozenset[str] = REPEATS,
                        use: str = "averaged") -> None:
    names = differing([configuration(run) for run in runs], may_differ)
    if names:
        raise ReportError(f"runs of {what} differ in their set-up and cannot be {use}:\n  "
                          f"{differences_by_file(runs, names)}")


def _add_scaling(groups: list[Group], runs: list[Run], group_by: str, notes: list[str]) -> None:
    """Each configuration against the smallest of its curve (label and model; the fewest GPUs, then
    nodes). A configuration whose set-up differs from the smallest's beyond what SCALED allows has
    no scaling figures, with a note: its change would be counted as scaling."""
    runs_by_key = _by_configuration(runs, group_by)
    series: dict[tuple[str, str], list[Group]] = {}
    for group in groups:
        series.setdefault((group.label, group.model), []).append(group)
    for members in series.values():
        smallest = min(members, key=lambda g: (g.num_gpus, g.num_nodes))
        reference = runs_by_key[_key(smallest)][0]
        on_the_curve = []
        for group in members:
            off_the_curve = _off_the_curve(group, runs_by_key[_key(group)][0], smallest, reference)
            if off_the_curve:
                notes.append(off_the_curve)
                continue
            on_the_curve.append(group)
            group.linear_factor = group.rate / smallest.rate
            group.perfect_linear_factor = group.num_gpus / smallest.num_gpus
            group.perfect_linear_scale = group.perfect_linear_factor * smallest.rate
            group.scaling_efficiency = group.linear_factor / group.perfect_linear_factor
        if len(on_the_curve) > 1:
            gpus = ", ".join(str(g.num_gpus) for g in on_the_curve)
            what = f"the scaling curve of {printable(smallest.label)} / {printable(smallest.model)} ({gpus} GPUs)"
            _note_warmups_across([runs_by_key[_key(g)] for g in on_the_curve], what, notes)


def _key(group: Group) -> tuple[str, str, int, int]:
    return group.label, group.model, group.num_nodes, group.num_gpus


def _off_the_curve(group: Group, run: Run, smallest: Group, reference: Run) -> str | None:
    """Why `group` is not on the curve that starts at `smallest` (a note), or None when it is."""
    ours, theirs = configuration(run), configuration(reference)
    names = differing([theirs, ours], SCALED)
    if not names:
        return None
    values = "; ".join(f"{name} {described(name, ours, [ours, theirs])} against "
                       f"{described(name, theirs, [ours, theirs])}" for name in names)
    return (f"{printable(group.label)} / {printable(group.model)} at {group.num_gpus} GPUs ({group.num_nodes} nodes) "
            f"has no scaling figures (n/a): its runs differ from those at {smallest.num_gpus} GPUs "
            f"({smallest.num_nodes} nodes), where its curve starts, in {values}; scaling efficiency would count "
            "that change as scaling (give each set-up its own label)")


def _note_warmups(runs: list[Run], what: str, notes: list[str]) -> None:
    note = warmup_note(runs, what)
    if note is not None:
        notes.append(note)


def _note_warmups_across(configurations: list[list[Run]], what: str, notes: list[str]) -> None:
    """Runs of several configurations used together (compared against a baseline, or on one scaling
    curve): their warm-ups named where they differ, unless every configuration's own note already
    names its runs' (then nothing is new)."""
    if not all(warmup_note(runs, what) for runs in configurations):
        _note_warmups([run for runs in configurations for run in runs], what, notes)


def _compare(groups: list[Group], runs: list[Run], baseline: str, group_by: str, notes: list[str]
             ) -> list[Comparison]:
    by_key = {(g.label, g.model, g.num_nodes, g.num_gpus): g for g in groups}
    runs_by_key = _by_configuration(runs, group_by)
    comparisons = []
    for (label, model, nodes, gpus), other in by_key.items():
        base = by_key.get((baseline, model, nodes, gpus))
        if label == baseline or base is None:
            continue
        sides = runs_by_key[(baseline, model, nodes, gpus)], runs_by_key[(label, model, nodes, gpus)]
        what = f"{printable(model)} at {nodes} nodes under {baseline!r} and {label!r}"
        _require_same_setup([*sides[0], *sides[1]], what, ENVIRONMENTS, "compared")
        _note_warmups_across(list(sides), what, notes)
        samples = base.unit == "samples"  # the same model and set-up: the same unit
        comparisons.append(Comparison(
            model=model, num_nodes=nodes, num_gpus=gpus, baseline=baseline, other=label, baseline_runs=base.runs,
            other_runs=other.runs,
            baseline_tokens_per_s=base.tokens_per_s, other_tokens_per_s=other.tokens_per_s,
            diff_pct=100.0 * (base.rate - other.rate) / base.rate, unit=base.unit,
            baseline_samples_per_s=base.samples_per_s if samples else None,
            other_samples_per_s=other.samples_per_s if samples else None,
        ))
    comparisons.sort(key=lambda c: (c.model, c.other, c.num_gpus))
    return comparisons
