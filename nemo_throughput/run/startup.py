"""The set-up every stack makes, once, in this order, on every rank: gather every rank's node record
(one collective), work out the run's facts with the adapter's ``describe`` (warnings on rank 0
alone), read the prometheus setting (before any other collective: a wrong value stops every rank,
none waits for rank 0), and let rank 0 claim the output directory (every rank learns the outcome).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from nemo_throughput import distributed, environment
from nemo_throughput.config import ThroughputConfig
from nemo_throughput.prometheus import prometheus_setting
from nemo_throughput.run_facts import RunFacts
from nemo_throughput.summary import STEPS_FILE, OutputDirError, claim_output_dir

# Works out the run's facts from every rank's environment.rank_record (the adapter's reading of its config).
DescribeRun = Callable[[list[dict[str, Any]]], RunFacts]


@dataclass(frozen=True)
class Started:
    """What set-up gives a measured run."""

    facts: RunFacts  # with this run's id and, where asked for, its steps.jsonl
    rank_records: list[dict[str, Any]]  # every rank's environment.rank_record, in rank order
    requested_dir: str  # the output directory asked for (setting, variable, or the adapter's default)
    output_dir: str  # this run's own directory under it
    prometheus: dict[str, Any] | None  # the endpoint's setting, where one is asked for


def start_run(config: ThroughputConfig, describe: DescribeRun, rank: int, default_dir: str) -> Started:
    """The set-up sequence. ``default_dir`` is the adapter's output directory, used when no
    output_dir setting or variable is set."""
    records = gather_rank_records()
    with warnings_on_rank_zero(rank):
        facts = describe(records)
    prometheus = prometheus_setting(config.prometheus, os.environ)
    requested = requested_output_dir(config.output_dir, os.environ.get(environment.ENV_OUTPUT_DIR)) or default_dir
    # Checked now, not when the summary is first written at the end of hours of training.
    output_dir, run_id = claim_output_dir_on_rank_zero(rank, requested, facts)
    steps_jsonl = {"path": STEPS_FILE, "complete": True, "error": None} if config.per_step_jsonl else None
    return Started(replace(facts, run_id=run_id, steps_jsonl=steps_jsonl), records, requested, output_dir,
                   prometheus)


def requested_output_dir(setting: str | None, variable: str | None) -> str | None:
    """The output_dir setting, else the variable, with `~` expanded (Hydra and Kubernetes manifests
    pass it on as typed); None where neither is given. Blank: refused, not a directory of spaces.
    (Control characters are a file name's right: the messages show them escaped.)"""
    for name, value in (("output_dir", setting), (environment.ENV_OUTPUT_DIR, variable)):
        if not value:
            continue
        if not value.strip():
            raise ValueError(f"{name} {value!r} is blank: give a directory path")
        return os.path.expanduser(value)
    return None


@contextlib.contextmanager
def warnings_on_rank_zero(rank: int) -> Iterator[None]:
    """Silence set-up warnings (such as an unknown GPU peak) on all ranks but rank 0."""
    package_log = logging.getLogger("nemo_throughput")
    level = package_log.level
    if rank != 0:
        package_log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        package_log.setLevel(level)


def gather_rank_records() -> list[dict[str, Any]]:
    """Every rank's node and communication settings, gathered once at set-up (one small collective)."""
    return distributed.gather_objects(environment.rank_record())


def claim_output_dir_on_rank_zero(rank: int, requested: str, facts: RunFacts) -> tuple[str, str]:
    """Rank 0 makes the output directory this run's own (and probes that it can write there);
    every rank learns the outcome (one small collective), so that all fail together, not rank 0
    alone while the others wait for it. Returns (directory, run id)."""
    outcome: dict[str, Any] = {"directory": requested, "run_id": facts.run_id, "error": None}
    failure = None
    if rank == 0:
        try:
            outcome["directory"] = str(claim_output_dir(requested, facts.name, facts.run_id))
        except OutputDirError as error:
            failure, outcome["error"] = error, str(error)
    outcome = distributed.from_rank_zero(outcome)
    if failure is not None:
        raise failure
    if outcome["error"]:
        raise OutputDirError(f"{outcome['error']} (on rank 0)")
    return outcome["directory"], outcome["run_id"]
