"""Slurm: an sbatch script from launchers/slurm/benchmark.sbatch with the job's options filled in."""

from __future__ import annotations

import datetime as dt
import re
import shlex
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from nemo_throughput.launch import TEMPLATES, LaunchError, require_command, require_positive

TEMPLATE = TEMPLATES / "slurm" / "benchmark.sbatch"
BODY_MARKER = "# ---- job body ----"
_TIME = re.compile(r"^(\d+-)?\d{1,2}(:\d{2}){0,2}$|^\d+$")  # minutes, [D-]HH[:MM[:SS]]


@dataclass
class SlurmJob:
    command: list[str]
    nodes: int = 1
    gpus_per_node: int = 8
    image: str | None = None  # Pyxis container image; None: run on the hosts
    mounts: list[str] = field(default_factory=list)  # src:dst
    workdir: str | None = None
    partition: str | None = None
    account: str | None = None
    time: str | None = None
    job_name: str = "nemo-throughput"
    repeat: int = 1
    label: str | None = None
    results_dir: str = "nemo_throughput_runs"

    def __post_init__(self) -> None:
        self.command = require_command(self.command)
        require_positive("--nodes", self.nodes)
        require_positive("--gpus-per-node", self.gpus_per_node)
        require_positive("--repeat", self.repeat)
        if self.mounts and not self.image:
            raise LaunchError("--mounts applies to a container: give --image too (or drop --mounts to run on "
                              "the hosts)")
        for mount in self.mounts:
            if len(mount.split(":")) not in (2, 3) or not all(mount.split(":")[:2]):
                raise LaunchError(f"--mounts entry {mount!r} is not src:dst[:flags]")
        if self.time is not None and not _TIME.match(self.time):
            raise LaunchError(f"--time {self.time!r} is not a Slurm time (minutes, HH:MM:SS or D-HH:MM:SS)")
        if self.image and not PurePosixPath(self.results_dir).is_absolute():
            raise LaunchError("with --image the summaries are written inside the container: give an absolute "
                              "--results-dir on a mounted file system")
        if self.image and not self._mounted(self.results_dir):
            raise LaunchError(f"--results-dir {self.results_dir} is not under any --mounts destination: the "
                              "summaries would stay in the container; mount it (e.g. --mounts /lustre:/lustre)")

    def _mounted(self, path: str) -> bool:
        destinations = [PurePosixPath(m.split(":")[1]) for m in self.mounts]
        return any(PurePosixPath(path).is_relative_to(d) for d in destinations)

    def sbatch_options(self) -> list[str]:
        options = [
            f"--job-name={self.job_name}",
            f"--nodes={self.nodes}",
            f"--ntasks-per-node={self.gpus_per_node}",  # one task per GPU
            f"--gpus-per-node={self.gpus_per_node}",
            "--exclusive",
            "--mem=0",
            f"--output={self.results_dir}/slurm-%j.out",
        ]
        options += [f"--{name}={value}" for name, value in
                    (("time", self.time), ("partition", self.partition), ("account", self.account)) if value]
        return options

    def settings(self) -> dict[str, str]:
        return {
            "IMAGE": self.image or "",
            "MOUNTS": ",".join(self.mounts),
            "WORKDIR": self.workdir or "$PWD",
            "REPEAT": str(self.repeat),
            "LABEL": self.label or "",
            "RESULTS": self.results_dir,
        }


def render_sbatch(job: SlurmJob, now: dt.datetime | None = None) -> str:
    """The template's body under a header with this job's #SBATCH options, settings and command."""
    template = TEMPLATE.read_text()
    if BODY_MARKER not in template:
        raise RuntimeError(f"{TEMPLATE} lost its `{BODY_MARKER}` line")
    body = template[template.index(BODY_MARKER):]
    stamp = (now or dt.datetime.now(dt.timezone.utc)).strftime("%Y-%m-%d %H:%M UTC")
    header = [
        "#!/bin/bash",
        f"# Written by `nemo-throughput launch slurm` on {stamp}; the body is {TEMPLATE.name}.",
        *(f"#SBATCH {option}" for option in job.sbatch_options()),
        "",
        *(f"{name}={_shell_value(value)}" for name, value in job.settings().items()),
        f"set -- {shlex.join(job.command)}",
        "",
    ]
    return "\n".join(header) + body


def _shell_value(value: str) -> str:
    # $PWD stays an expansion; everything else is quoted literally.
    return '"$PWD"' if value == "$PWD" else shlex.quote(value)
