"""Which runs may be averaged, compared or drawn on one scaling curve: the one definition of a
run's configuration and of its identity, for `report` and `compare`.

A number computed across runs is only right where the runs did the same work the same way: a
curve whose larger size also ran fp8, or a longer sequence, counts that change as scaling; a
summary counted twice halves the spread of its repeats."""

from __future__ import annotations

import hashlib
import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

from nemo_throughput.errors import ReportError
from nemo_throughput.run_facts import USER_FLOPS
from nemo_throughput.text import printable

Run = Any  # a report.runs.Run; runs imports this module (a run's identity), so not the other way round
UNKNOWN = "unknown"  # model.name or hardware.gpu_name of a run that does not know it
LAYOUT = "parallel layout"
# What makes two runs the same configuration, in the order differences are listed.
CONFIGURATION = ("model", "model shape", "FLOPs per sample", "FLOPs formula", "global batch", "sequence length",
                 "GPUs", "nodes", "GPU model", "dtype", "peak TFLOPS", LAYOUT)

# What each use lets differ, and why; everything else must agree.
REPEATS: frozenset[str] = frozenset()  # averaged: tokens/s, step time and MFU of one configuration
SIDES = frozenset({LAYOUT})  # compare's two sides: a layout is a setting a candidate may change
ENVIRONMENTS = frozenset({LAYOUT, "peak TFLOPS"})  # report --baseline: diff % of tokens/s, no peak in it
# One scaling curve: its size, and the global batch (weak or strong scaling: efficiency is per token).
SCALED = frozenset({"GPUs", "nodes", "global batch", LAYOUT, "peak TFLOPS"})


def configuration(run: Run) -> dict[str, Any]:
    """The run's value of each name of CONFIGURATION; None where the summary does not know it."""
    return {
        "model": None if run.model == UNKNOWN else run.model,
        "model shape": run.model_spec,
        "FLOPs per sample": run.flops_per_sample,
        "FLOPs formula": run.flops_formula,
        "global batch": run.global_batch_size,
        "sequence length": run.seq_length if run.unit == "tokens" else "none (rated in samples/s)",
        "GPUs": run.num_gpus,
        "nodes": run.num_nodes,
        "GPU model": None if run.gpu_name == UNKNOWN else run.gpu_name,
        "dtype": run.dtype,
        "peak TFLOPS": run.peak_tflops,
        LAYOUT: run.parallel,
    }


def differing(configurations: list[dict[str, Any]], may_differ: frozenset[str] = REPEATS) -> list[str]:
    """The names whose values are not all alike. A value known for one run and not for another
    differs (nothing shows that they are the same), except the parallel layout, which imported logs
    do not state: it is checked between the runs that state one."""
    found = []
    for name in CONFIGURATION:
        if name in may_differ:
            continue
        values = [c[name] for c in configurations if not (name == LAYOUT and c[name] is None)]
        if len({canonical(value) for value in values}) > 1:
            found.append(name)
    return found


def differences_by_file(runs: list[Run], names: list[str]) -> str:
    """A line per run: its file and its value of each name, for a message."""
    configurations = [configuration(run) for run in runs]
    return "\n  ".join(f"{printable(run.path)}: " + values_text(c, names, configurations)
                       for run, c in zip(runs, configurations, strict=True))


def values_text(values: dict[str, Any], names: list[str], among: list[dict[str, Any]]) -> str:
    """`values`' value of each name as printed; of the model shape, the fields that differ `among` them."""
    return ", ".join(f"{name} {described(name, values, among)}" for name in names)


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def describe(value: Any) -> str:
    """A configuration value as printed: unknown, a number, or printable text."""
    if value is None:
        return UNKNOWN
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, dict):
        return printable(canonical(value))
    return printable(value)


def described(name: str, values: dict[str, Any], among: list[dict[str, Any]] = ()) -> str:
    """The value of `name` in a configuration as printed: FLOPs per sample with where they come
    from; the model shape by the fields that differ `among` the configurations compared."""
    if name == "FLOPs per sample":
        return flops_text(values[name], values["FLOPs formula"])
    shapes = [c[name] for c in among if isinstance(c[name], dict)]
    if name == "model shape" and isinstance(values[name], dict) and len(shapes) > 1:
        keys = sorted({key for shape in shapes for key in shape
                       if len({canonical(other.get(key)) for other in shapes}) > 1})
        return "{" + ", ".join(f"{key}: {describe(values[name].get(key))}" for key in keys) + "}"
    return describe(values[name])


def flops_text(flops_per_sample: float | None, formula: str | None) -> str:
    """FLOPs per sample and where they come from, e.g. `3.94e+15 (dgxc)`, `1.5e+12 (given by the user)`."""
    if flops_per_sample is None:
        return UNKNOWN
    source = "given by the user" if formula == USER_FLOPS else printable(formula or UNKNOWN)
    return f"{flops_per_sample:.6g} ({source})"


@dataclass(frozen=True)
class RunIdentity:
    """What makes two summaries one run: equal keys. `shown` says it in a message."""

    key: str
    shown: str = field(compare=False)


# An imported log whose first this many steps print the same times as another's is the same run: a copy
# under another name, or a copy taken while the job still ran (its steps a beginning of the other's).
# Fewer printed steps could coincide between two runs; such a log is the same run only at the same path.
STEPS_THAT_IDENTIFY = 10


def run_identity(run_id: str, summary: dict[str, Any]) -> RunIdentity:
    """A run's identity: its run.id, which a copy of its summary keeps. An imported log gets a new
    run.id at each import, so an imported run is its first printed steps and their times
    (STEPS_THAT_IDENTIFY), or, in a shorter log, its path and its steps (a log overwritten by a later
    job at the same path gives other steps, so another run)."""
    timing, environment = summary.get("timing") or {}, summary.get("environment") or {}
    source, steps = environment.get("imported_from"), timing.get("steps")
    if not isinstance(source, str) or not isinstance(steps, list) or not steps:
        return RunIdentity(f"run:{run_id}", f"run.id {printable(run_id)}")
    if len(steps) >= STEPS_THAT_IDENTIFY:
        first = steps[:STEPS_THAT_IDENTIFY]
        digest = hashlib.sha256(canonical(first).encode()).hexdigest()
        return RunIdentity(f"steps:{digest}", f"imported, its first {STEPS_THAT_IDENTIFY} steps printed with the "
                                              "same times: one log, copied or renamed")
    digest = hashlib.sha256(canonical([source, steps]).encode()).hexdigest()
    return RunIdentity(f"log:{digest}", f"imported from {printable(source)}, the same steps")


def distinct_runs(runs: list[Run]) -> tuple[list[Run], list[str]]:
    """Each run once, the first of its summaries kept, with a note for each other: a copy counted as
    a repeat would look like a second measurement. Copies that disagree on the label or the
    configuration are refused: nothing says which of them is right."""
    first: dict[RunIdentity, Run] = {}
    kept, notes = [], []
    for run in runs:
        original = first.setdefault(run.identity, run)
        if original is run:
            kept.append(run)
            continue
        what = disagreeing([original, run])
        if what:
            raise ReportError(f"{printable(original.path)} and {printable(run.path)} are the same run "
                              f"({run.identity.shown}) but differ in {', '.join(what)}; keep the one whose facts "
                              "are right")
        if run.steps_counted > original.steps_counted:  # a log copied later in the run: the longer is kept
            kept[kept.index(original)] = first[run.identity] = run
            original, run = run, original
        notes.append(f"{printable(run.path)} is the same run as {printable(original.path)} ({run.identity.shown}): "
                     f"counted once, as {printable(original.path)}")
    return kept, notes


def disagreeing(runs: list[Run]) -> list[str]:
    """What summaries of one run differ in, of the label and the configuration (nothing may)."""
    label = ["label"] if len({run.label for run in runs}) > 1 else []
    return label + differing([configuration(run) for run in runs])


def warmup_note(runs: list[Run], what: str) -> str | None:
    """A note where runs averaged or compared left out different warm-ups before their counted steps
    (an imported log from step 11, a run after 20 warm-up steps): legitimate choices, but a shorter
    warm-up may count slow early steps, so each run's is named; None where they agree."""
    known = [run for run in runs if run.warmup is not None]
    if len({run.warmup.steps for run in known}) < 2:
        return None
    each = "; ".join(f"{printable(run.path)}: {run.warmup.steps} ({run.warmup.shown})" for run in known)
    return (f"{what}: the runs left out different numbers of warm-up steps before the steps they count ({each}); "
            "they are used as they are: a short warm-up may count slow early steps (give each the same warm-up, "
            "or the same --window)")


# A value of a configuration made of several runs (or one run of several segments): only when every
# run has it, never that of some runs passed off as all of theirs.
def mean_of_all(values: Sequence[float | None], weights: Sequence[float] | None = None) -> float | None:
    return None if None in values else statistics.fmean(values, weights)


def max_of_all(values: Sequence[float | None]) -> float | None:
    return None if None in values else max(values)


def network_names(networks: set[str | None]) -> list[str]:
    """Network labels in order, unknown for a run that names none."""
    return sorted(network or UNKNOWN for network in networks)


def mixed_networks(networks: set[str | None]) -> str:
    """Runs (or segments) over several networks: `mixed (RDMA, TCP)`."""
    return f"mixed ({', '.join(network_names(networks))})"


def slowest_of(stragglers: Sequence[Any]) -> Any:
    """The straggler furthest above its run's median rank; None unless every run names one."""
    return None if None in stragglers or not stragglers else max(stragglers, key=attrgetter("excess_pct"))
