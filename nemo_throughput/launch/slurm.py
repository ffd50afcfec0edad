"""Slurm: an sbatch script from launchers/slurm/benchmark.sbatch with the job's options filled in."""

from __future__ import annotations

import datetime as dt
import posixpath
import re
import shlex
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from nemo_throughput.launch import (
    TEMPLATES,
    LaunchError,
    refuse_a_password,
    require_command,
    require_count,
    require_layout,
    require_no_control_characters,
    require_port,
)

TEMPLATE = TEMPLATES / "slurm" / "benchmark.sbatch"
BODY_MARKER = "# ---- job body ----"
# sbatch reads #SBATCH lines with its own tokenizer, not a shell: whitespace splits, quotes group,
# '\' escapes, an unquoted '#' starts a comment and a new line ends the directive (the next line,
# not a comment, is where the script starts). Names are therefore kept to characters that mean
# nothing to it; a path is quoted for it (_directive_value).
_SLURM_NAME = r"[A-Za-z0-9_][A-Za-z0-9._+-]*"
_NAME = re.compile(_SLURM_NAME)
_PARTITIONS = re.compile(rf"{_SLURM_NAME}(,{_SLURM_NAME})*")  # sbatch takes a list of partitions
# sbatch --time: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S, or no limit
_TIME = re.compile(r"\d+(:\d{1,2}){0,2}|\d+-\d{1,2}(:\d{1,2}){0,2}|UNLIMITED|INFINITE", re.IGNORECASE)
# Pyxis: [USER@][REGISTRY#]IMAGE[:TAG][@DIGEST] or the path of a squashfs file
_IMAGE = re.compile(r"[A-Za-z0-9._/][A-Za-z0-9._:/@#+~-]*")
_MOUNT_FLAGS = re.compile(r"[A-Za-z0-9._=-]+(\+[A-Za-z0-9._=-]+)*")  # Pyxis joins enroot's flags with '+'
_NAME_RULE = "letters, digits and . _ + - (starting with a letter, a digit or _)"
MAX_JOB_NAME = 1024  # slurmctld refuses a longer name at submission ("parameter too long")
# The longest --time Slurm keeps as given (its seconds fit an int32): 35791394 minutes became
# 2957761-01:03:00, 2**31 - 1 minutes UNLIMITED (Slurm 22.05)
MAX_TIME_MINUTES = 35_791_393


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
    prometheus_port: int | None = None  # rank 0 serves live metrics on this port of the first node

    def __post_init__(self) -> None:
        self.command = require_command(self.command)
        require_count("--nodes", self.nodes)
        require_count("--gpus-per-node", self.gpus_per_node)
        require_count("--repeat", self.repeat)
        require_layout(self.command, self.nodes, self.gpus_per_node)
        require_port("--prometheus-port", self.prometheus_port)
        self._check_text_fields()
        self._check_names()
        if self.mounts and not self.image:
            raise LaunchError("--mounts applies to a container: give --image too (or drop --mounts to run on "
                              "the hosts)")
        for mount in self.mounts:
            _check_mount(mount)
        destinations = [posixpath.normpath(mount.split(":")[1]) for mount in self.mounts]
        if len(set(destinations)) < len(destinations):
            twice = next(d for d in destinations if destinations.count(d) > 1)
            raise LaunchError(f"--mounts mounts two sources at {twice}: the later one hides the earlier; mount one")
        self._check_results_dir()

    def _check_results_dir(self) -> None:
        if self.image:
            if not PurePosixPath(self.results_dir).is_absolute():
                raise LaunchError("with --image the summaries are written inside the container: give an absolute "
                                  "--results-dir on a mounted file system")
            mount = self._mount_of(self.results_dir)
            if mount is None:
                raise LaunchError(f"--results-dir {self.results_dir} is not under any --mounts destination: the "
                                  "summaries would stay in the container; mount it (e.g. --mounts /lustre:/lustre)")
            if mount[0] in ("tmpfs", "umount"):
                raise LaunchError(f"--results-dir {self.results_dir} is under a {mount[0]} mount: the summaries "
                                  "would go with the container; mount a host directory there")
            if "ro" in mount[2]:
                raise LaunchError(f"--results-dir {self.results_dir} is under a read-only mount: the summaries "
                                  "could not be written; mount it without ro")
        if "\\" in self.host_results_dir:  # Slurm: a '\' in --output turns off its %j replacement
            raise LaunchError(f"--results-dir {self.host_results_dir!r} contains '\\', which Slurm's --output does "
                              "not take literally: choose a directory without it")

    def _check_text_fields(self) -> None:
        """No field may hold a control character: a new line would end its #SBATCH line or shell word."""
        for flag, value in (("--job-name", self.job_name), ("--partition", self.partition),
                            ("--account", self.account), ("--time", self.time), ("--image", self.image),
                            ("--workdir", self.workdir), ("--label", self.label),
                            ("--results-dir", self.results_dir)):
            if value is not None:
                require_no_control_characters(flag, value)

    def _check_names(self) -> None:
        if not _NAME.fullmatch(self.job_name):
            raise LaunchError(f"--job-name {self.job_name!r} is not a job name this launcher writes: use {_NAME_RULE}")
        if len(self.job_name) > MAX_JOB_NAME:
            raise LaunchError(f"--job-name has {len(self.job_name)} characters; Slurm takes at most {MAX_JOB_NAME}")
        if self.partition is not None and not _PARTITIONS.fullmatch(self.partition):
            raise LaunchError(f"--partition {self.partition!r} is not a Slurm partition name: use {_NAME_RULE}; "
                              "several partitions are separated by commas")
        if self.account is not None and not _NAME.fullmatch(self.account):
            raise LaunchError(f"--account {self.account!r} is not a Slurm account name: use {_NAME_RULE}")
        if self.time is not None and not _TIME.fullmatch(self.time):
            raise LaunchError(f"--time {self.time!r} is not a Slurm time (minutes, MM:SS, HH:MM:SS, "
                              "D-HH[:MM[:SS]] or UNLIMITED)")
        if self.time is not None and _minutes(self.time) > MAX_TIME_MINUTES:
            raise LaunchError(f"--time {self.time!r} is over {MAX_TIME_MINUTES:,} minutes (about 68 years), which "
                              "Slurm keeps as another limit or none: give UNLIMITED for no limit")
        if self.image is not None:
            refuse_a_password("--image", self.image)
            if not _IMAGE.fullmatch(self.image):
                raise LaunchError(f"--image {self.image!r} is not a container image Pyxis takes: "
                                  "[USER@][REGISTRY#]IMAGE[:TAG] or the path of a squashfs file, without spaces or "
                                  "shell characters")

    def _mount_of(self, path: str) -> tuple[str, PurePosixPath, list[str]] | None:
        """(source, destination, flags) of the innermost mount that holds `path` in the container, or None."""
        # normalised first: /lustre/../etc is not under /lustre
        path = PurePosixPath(posixpath.normpath(path))
        mounts = [(parts[0], PurePosixPath(posixpath.normpath(parts[1])), parts[2].split("+") if len(parts) > 2 else [])
                  for parts in (m.split(":") for m in self.mounts)]
        holding = [mount for mount in mounts if path.is_relative_to(mount[1])]
        return max(holding, key=lambda mount: len(mount[1].parts), default=None)

    @property
    def host_results_dir(self) -> str:
        """--results-dir as the hosts see it: Slurm writes the job's log there, outside any container."""
        if not self.image:
            return self.results_dir
        source, destination, _ = self._mount_of(self.results_dir)
        inside = PurePosixPath(posixpath.normpath(self.results_dir)).relative_to(destination)
        return posixpath.normpath(posixpath.join(source, inside))

    def sbatch_options(self) -> list[str]:
        options = [
            f"--job-name={self.job_name}",
            f"--nodes={self.nodes}",
            f"--ntasks-per-node={self.gpus_per_node}",  # one task per GPU
            f"--gpus-per-node={self.gpus_per_node}",
            "--exclusive",
            "--mem=0",
            # '%' is Slurm's file name pattern character: %% keeps one from the directory literally
            f"--output={_directive_value(self.host_results_dir.replace('%', '%%') + '/slurm-%j.out')}",
            "--open-mode=append",  # a requeued job appends to its log: the first attempt's stays
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
            "PROMETHEUS_PORT": "" if self.prometheus_port is None else str(self.prometheus_port),
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


def _minutes(time: str) -> int:
    """Minutes of a --time that _TIME matched (0 for UNLIMITED/INFINITE), as Slurm counts them."""
    if not time[0].isdigit():
        return 0
    days, _, clock = time.rpartition("-")
    parts = [int(part) for part in clock.split(":")]
    if days:  # D-H, D-H:M, D-H:M:S
        hours, minutes = (*parts, 0)[:2]
        return int(days) * 1440 + hours * 60 + minutes
    if len(parts) == 3:  # H:M:S
        return parts[0] * 60 + parts[1]
    return parts[0]  # M, M:S


def _shell_value(value: str) -> str:
    # $PWD stays an expansion; everything else is quoted literally.
    return '"$PWD"' if value == "$PWD" else shlex.quote(value)


def _check_mount(mount: str) -> None:
    """One --mounts entry as Pyxis parses it: SRC:DST[:FLAGS], entries separated by commas."""
    require_no_control_characters("--mounts entry", mount)
    if re.search(r"\s", mount):
        raise LaunchError(f"--mounts entry {mount!r} holds whitespace: Pyxis hands mounts to enroot as fstab "
                          "lines, where whitespace separates fields; mount a path without it")
    parts = mount.split(":")
    if "," in mount or len(parts) not in (2, 3) or not all(parts[:2]):
        raise LaunchError(f"--mounts entry {mount!r} is not src:dst[:flags] (entries are separated by commas)")
    source, destination = parts[:2]
    if not (source.startswith(("/", ".")) or source in ("tmpfs", "umount")):
        raise LaunchError(f"--mounts entry {mount!r}: the source must be an absolute or relative path "
                          "('/...' or './...'), tmpfs or umount (Pyxis' rule)")
    if not destination.startswith(("/", ".")):
        raise LaunchError(f"--mounts entry {mount!r}: the destination must be an absolute or relative path "
                          "('/...' or './...')")
    if len(parts) == 3 and not _MOUNT_FLAGS.fullmatch(parts[2]):
        raise LaunchError(f"--mounts entry {mount!r}: the flags must be mount options joined with '+', "
                          "e.g. ro or ro+rprivate")


def _directive_value(value: str) -> str:
    """`value` as sbatch's #SBATCH reader gives it back verbatim: double-quoted, with '\\' and '"'
    escaped, when it holds whitespace, quotes, '\\' or '#' (the reader's special characters)."""
    if not re.search(r"[\s\"'\\#]", value):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
