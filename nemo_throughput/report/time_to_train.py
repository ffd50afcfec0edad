"""Time to train, the MLPerf way, from summaries imported with ``--format mlperf``: the repeats of
a benchmark on one system scored as MLPerf's result_summarizer scores them (olympic average, in
minutes from run_start to run_stop; each system apart, whatever the label), and the speedup over
the smallest size of the same system family."""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from fractions import Fraction
from operator import attrgetter
from typing import Any, NamedTuple

UNET3D_DROPPED = 4  # result_summarizer drops 4 from each end for unet3d (40 runs), 1 for the others
UNSTATED_SYSTEM = ("the runs state no system (no <system>/<benchmark>/ folder, no system name; or imported by a "
                   "version that did not record it: import them again): the runs of this label, node and GPU count "
                   "are taken as one system")

# An accelerator named as a GPU (its maker, its family or a model such as H100, MI300X, GB200); TPUs, Gaudis, IPUs
# and CPUs are not. Anything else, or no name stated, is counted as "accelerators": always true.
_GPU_NAME = re.compile(r"nvidia|amd|gpu|geforce|rtx|tesla|radeon|instinct|\bmi\d{3}|\b(?:gb|[abhlv])\d{2,3}", re.I)


def accelerators_word(accelerators: Iterable[str | None]) -> str:
    """What to call the accelerators counted: "GPUs" only where every one is named as a GPU."""
    names = list(accelerators)
    return "GPUs" if names and all(name and _GPU_NAME.search(name) for name in names) else "accelerators"


@dataclass
class TrainGroup:
    """The repeats of one benchmark on one system, under one label, at one node and accelerator count."""

    benchmark: str
    label: str
    system: str | None  # the <system> directory of its result files, else the system's name; None: not stated
    num_nodes: int
    num_gpus: int
    time_to_train_minutes: dict[str, Any]  # olympic, mean, two_sigma, runs, converged (and how they were scored)
    submitter: str | None = None
    accelerator: str | None = None
    speedup: float | None = None  # over the smallest size of its system family (_family)
    speedup_of: str | None = None  # "olympic" where both groups have one, else "mean"
    speedup_over: str | None = None  # the group it is compared with: its system, nodes and GPUs
    scaling_efficiency: float | None = None  # speedup / accelerator-count ratio
    files: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def shown(self) -> str:
        return (f"{self.system or '(no system stated)'} ({self.num_nodes} node(s), {self.num_gpus} "
                f"{accelerators_word([self.accelerator])})")


class GroupKey(NamedTuple):
    """What sets a group apart, in the order groups are listed ("" where not stated)."""

    benchmark: str
    label: str
    submitter: str
    accelerator: str
    num_gpus: int
    num_nodes: int
    directory: str  # the <system> directory, as result_summarizer tells systems apart
    name: str  # the system's name, only where no directory says which system it is


def olympic_average(minutes: list[float], dropped: int, max_dropped: int) -> float | None:
    """result_summarizer's olympic average: the counted times sorted, ``max_dropped`` cut from the
    fast end and ``max_dropped - dropped`` from the slow end (dropped runs count as the slowest);
    None when none remain. The same arithmetic in the same order, so the digits agree."""
    scores = sorted(minutes)
    countable = scores[max_dropped:len(scores) - (max_dropped - dropped)]
    if not countable:
        return None
    return sum(countable) * 1.0 / len(countable)


def build_time_to_train(runs: list[Any]) -> list[TrainGroup]:
    """TrainingRuns (report.runs) grouped per system as result_summarizer scores them, then by label,
    node and accelerator count, and scored: two systems are never one set of repeats, whatever their
    label, and neither are 2 nodes of 8 and 4 nodes of 4. A byte copy of a result file is counted once."""
    by_key: dict[GroupKey, list[Any]] = {}
    for run in runs:
        by_key.setdefault(_key(run), []).append(run)
    copies = _copies_across(by_key)
    groups = [_train_group(members, copies.get(key, [])) for key, members in sorted(by_key.items())]
    _add_speedup(groups)
    return groups


def _key(run: Any) -> GroupKey:
    system = run.system
    return GroupKey(run.benchmark, run.label, system.submitter or "", system.accelerator or "", run.num_gpus,
                    run.num_nodes, system.directory or "", "" if system.directory else system.name or "")


def _train_group(members: list[Any], elsewhere: list[str]) -> TrainGroup:
    runs, notes = _distinct(members)
    first = runs[0]
    summary, score_notes = _scored(runs)
    if not (first.system.directory or first.system.name):
        notes.append(UNSTATED_SYSTEM)
    return TrainGroup(first.benchmark, first.label, first.system.directory or first.system.name, first.num_nodes,
                      first.num_gpus, summary, submitter=first.system.submitter, accelerator=first.system.accelerator,
                      files=sorted(run.source for run in runs), notes=notes + elsewhere + score_notes)


def _distinct(members: list[Any]) -> tuple[list[Any], list[str]]:
    """The runs of a group, each once: a result file with the bytes of another is a copy of that run."""
    first_of: dict[str, Any] = {}
    runs, notes = [], []
    for run in sorted(members, key=attrgetter("source")):
        original = first_of.get(run.sha256) if run.sha256 else None
        if original is None:
            runs.append(run)
            if run.sha256:
                first_of[run.sha256] = run
        elif run.source == original.source:
            notes.append(f"{run.source} is imported twice ({original.path}, {run.path}): the same run, counted once")
        else:
            notes.append(f"{run.source} is a byte copy of {original.source}: the same run, counted once")
    return runs, notes


def _copies_across(by_key: dict[GroupKey, list[Any]]) -> dict[GroupKey, list[str]]:
    """Per group, a note for each other group that holds byte copies of its result files: the same
    runs imported as two systems or sizes, which no scoring can tell apart."""
    homes: dict[str, dict[GroupKey, str]] = {}
    for key, members in by_key.items():
        for run in members:
            if run.sha256:
                homes.setdefault(run.sha256, {}).setdefault(key, run.source)
    shared: dict[GroupKey, dict[GroupKey, list[str]]] = {}
    for found in homes.values():
        for key, source in found.items():
            for other in found:
                if other != key:
                    shared.setdefault(key, {}).setdefault(other, []).append(source)
    return {key: [f"{len(sources)} of its result files (e.g. {sorted(sources)[0]}) have the bytes of result files "
                  f"reported under {other.label} on {other.directory or other.name or '(no system stated)'} "
                  f"({other.num_nodes} node(s), {other.num_gpus} {accelerators_word([other.accelerator])}): the same "
                  "runs, imported as two systems or "
                  "sizes (import them once, with the counts of the system that ran them)"
                  for other, sources in sorted(others.items())] for key, others in shared.items()}


def _scored(members: list[Any]) -> tuple[dict[str, Any], list[str]]:
    first = members[0]
    counted = [run.minutes for run in members if run.counted]
    dropped = len(members) - len(counted)
    max_dropped = UNET3D_DROPPED if first.benchmark == "unet3d" else 1
    required = first.required_runs
    factors = sorted({run.scaling_factor for run in members})
    notes = []
    olympic = None
    if len(factors) > 1:
        notes.append(f"runs hold different scaling.json factors {factors}: olympic average not scored")
    elif required is not None and len(members) < required:
        notes.append(f"{len(members)} of the {required} runs {first.benchmark} needs: olympic average not scored")
    elif dropped > max_dropped:
        notes.append(f"{dropped} runs dropped (not compliant or not converged), more than the {max_dropped} "
                     "allowed: olympic average not scored")
    else:
        score = olympic_average(counted, dropped, max_dropped)
        olympic = score * factors[0] if score is not None else None
    mean = statistics.fmean(counted) if counted else None
    return {
        "olympic": olympic, "mean": mean,
        "two_sigma": 2 * statistics.stdev(counted) if len(counted) > 1 else (0.0 if counted else None),
        "runs": len(members), "converged": sum(run.converged for run in members),
        "compliant": sum(run.compliant for run in members), "dropped": dropped, "required_runs": required,
        "scaling_factor": factors[0] if len(factors) == 1 else None,
    }, notes


def _family(group: TrainGroup) -> tuple[Any, ...] | None:
    """The sizes of one system design: one benchmark and label, one submitter, one accelerator and as
    many GPUs per node; None where the submitter or the accelerator is not stated (no family known)."""
    if group.submitter is None or group.accelerator is None:
        return None
    return group.benchmark, group.label, group.submitter, group.accelerator, Fraction(group.num_gpus, group.num_nodes)


def _family_text(group: TrainGroup) -> str:
    per_node = Fraction(group.num_gpus, group.num_nodes)
    return f"submitter {group.submitter}, {group.accelerator}, {per_node} GPUs per node, label {group.label}"


def _add_speedup(groups: list[TrainGroup]) -> None:
    """Speedup and scaling efficiency of each group over the smallest size of its system family, never
    over another family's: a group of no known family is compared with itself only."""
    families: dict[Any, list[TrainGroup]] = {}
    for group in groups:
        families.setdefault(_family(group) or id(group), []).append(group)
    for members in families.values():
        _pair_sizes(members)
    for group in groups:
        group.notes += _not_compared(group, groups)


def _pair_sizes(members: list[TrainGroup]) -> None:
    """Over the family's fewest nodes (as many GPUs per node: the fewest GPUs too); none where two
    systems of the family are that size, since either could be the baseline."""
    smallest = min(group.num_nodes for group in members)
    bases = [group for group in members if group.num_nodes == smallest]
    if len(bases) > 1:
        for group in members:
            group.notes.append(f"no speedup: {' and '.join(base.shown for base in bases)} are both the smallest size "
                               f"of one system family ({_family_text(group)}), so which is the baseline is not known")
        return
    (base,) = bases
    for group in members:
        basis = "olympic" if base.time_to_train_minutes["olympic"] and group.time_to_train_minutes["olympic"] \
            else "mean"
        before, after = base.time_to_train_minutes[basis], group.time_to_train_minutes[basis]
        if before and after:
            group.speedup, group.speedup_of, group.speedup_over = before / after, basis, base.shown
            group.scaling_efficiency = group.speedup / (group.num_gpus / base.num_gpus)
            if group is not base:
                group.notes.append(f"speedup over {base.shown}: one system family ({_family_text(group)})")


def _not_compared(group: TrainGroup, groups: list[TrainGroup]) -> list[str]:
    """The groups of the same benchmark and label that are not of its family, and why."""
    family = _family(group)
    apart = [other for other in groups if other is not group and (other.benchmark, other.label) ==
             (group.benchmark, group.label) and (family is None or _family(other) != family)]
    return [f"not compared with {other.shown}: {_why_apart(group, other)}" for other in apart]


def _why_apart(group: TrainGroup, other: TrainGroup) -> str:
    if None in (group.submitter, group.accelerator, other.submitter, other.accelerator):
        return "a submitter or an accelerator is not stated, so no system family is known"
    if group.submitter != other.submitter:
        return f"another submitter ({other.submitter})"
    if group.accelerator != other.accelerator:
        return f"another accelerator ({other.accelerator})"
    return f"another number of GPUs per node ({Fraction(other.num_gpus, other.num_nodes)})"


def time_to_train_records(groups: list[TrainGroup]) -> list[dict[str, Any]]:
    return [{name: getattr(g, name) for name in TrainGroup.__dataclass_fields__ if name != "notes"} for g in groups]
