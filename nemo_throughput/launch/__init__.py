"""Launcher shims: render (and optionally submit) one benchmark job for Slurm or Kubernetes.

The templates are the files in the repository's `launchers/` (shipped as nemo_throughput/launchers):
a user can read them and use them by hand; `nemo-throughput launch` fills them in.
"""

from __future__ import annotations

import posixpath
import re
import shlex
import shutil
import subprocess
from pathlib import Path

from nemo_throughput.errors import NemoThroughputError

TEMPLATES = Path(__file__).resolve().parent.parent / "launchers"


class LaunchError(NemoThroughputError, ValueError):
    """A launch request that cannot work, with what to change."""


# sbatch parses its counts as C ints and Kubernetes' replicas is an int32: a larger count would be
# refused at submission (or wrap around), after the file was written.
MAX_COUNT = 2**31 - 1


def require_count(name: str, value: int) -> None:
    if value < 1:
        raise LaunchError(f"{name} must be at least 1, got {value}")
    if value > MAX_COUNT:
        raise LaunchError(f"{name} {value} is more than Slurm and Kubernetes take (at most {MAX_COUNT})")


def require_port(name: str, value: int | None) -> None:
    """None, or a TCP port a server can listen on (1-65535)."""
    if value is not None and not 1 <= value <= 65535:
        raise LaunchError(f"{name} must be a TCP port (1-65535), got {value}")


PYTHON = re.compile(r"(.*/)?python(3(\.\d+)?)?")
# Programs (and python modules) that start one process per GPU themselves: under srun's one task
# per GPU, or the pods' torchrun, each would start that many more, in worlds of their own.
_LAUNCHERS = frozenset({"torchrun", "deepspeed", "accelerate", "mpirun", "mpiexec", "srun", "horovodrun"})
_LAUNCHER_MODULES = frozenset({"torch.distributed.run", "torch.distributed.launch", "deepspeed",
                               "deepspeed.launcher.runner", "accelerate.commands.launch", "accelerate"})
# Hydra overrides of the trainer's layout, `trainer.num_nodes=2` (with +, ++ or ~ in front)
_LAYOUT_OVERRIDE = re.compile(r"[+~]*trainer\.(num_nodes|devices)=(.*)", re.DOTALL)


def require_command(command: list[str]) -> list[str]:
    """The training command from what follows the launcher's own options.

    Anything before the first `--` is an option the launcher did not recognise (a misspelt
    `--partitoin batch` must not quietly become the start of the training command).
    """
    if "--" in command:
        unrecognised, command = command[:command.index("--")], command[command.index("--") + 1:]
        if unrecognised:
            raise LaunchError(f"unrecognized arguments before `--`: {shlex.join(unrecognised)} "
                              "(see --help for the launcher's options)")
    elif command and command[0].startswith("-"):
        raise LaunchError(f"unrecognized option {command[0]!r}; put the training command after `--`")
    if not command:
        raise LaunchError("no training command: put it after `--`, e.g. "
                          "`-- python train.py +callbacks=throughput`")
    if command[0].startswith("-"):  # srun (or torchrun) would take it as one of its own options
        raise LaunchError(f"the training command starts with {command[0]!r}, an option, not a program: "
                          "start it with the program, e.g. `-- python train.py ...`")
    if not command[0].strip():
        raise LaunchError("the training command's program is empty: start it with the program, e.g. "
                          "`-- python train.py ...`")
    for arg in command:
        require_no_control_characters("the training command", arg, allowed="\t\n")
    _refuse_a_launcher(command)
    return command


def _refuse_a_launcher(command: list[str]) -> None:
    """A training command that starts its own processes per GPU (torchrun, `python -m
    torch.distributed.run`, deepspeed, accelerate, mpirun) would multiply them: 2 nodes of 2 GPUs
    ran 8 processes in 4 worlds of 2, each with a rank 0. A wrapper script cannot be seen into."""
    program = posixpath.basename(command[0])
    module = python_module(command) if PYTHON.fullmatch(command[0]) else None
    launcher = program if program in _LAUNCHERS else module if module in _LAUNCHER_MODULES else None
    if launcher is not None:
        raise LaunchError(f"the training command starts its own processes ({launcher}), and the launcher already "
                          "starts one per GPU (srun's tasks, torchrun in each pod): give the training script "
                          "itself, e.g. `-- python train.py ...`")


def python_module(command: list[str]) -> str | None:
    """The module of `python [options] -m module ...`, or None."""
    for index, arg in enumerate(command[1:], start=1):
        if arg == "-m":
            return command[index + 1] if index + 1 < len(command) else None
        if arg.startswith("-m"):
            return arg[2:]
        if not arg.startswith("-"):
            return None
    return None


def require_layout(command: list[str], nodes: int, gpus_per_node: int) -> None:
    """`trainer.num_nodes=` and `trainer.devices=` in the command (Hydra overrides) against the job's
    nodes and GPUs per node: a trainer told 1 node on a 2-node job trains twice, apart, and each
    summary says 1 node."""
    for arg in command:
        override = _LAYOUT_OVERRIDE.fullmatch(arg)
        if override is None:
            continue
        name, value = override.groups()
        wanted = nodes if name == "num_nodes" else gpus_per_node
        flag = "--nodes" if name == "num_nodes" else "--gpus-per-node"
        if value.strip().isdigit() and int(value) != wanted:
            raise LaunchError(f"the training command sets trainer.{name}={value.strip()}, the job {flag} {wanted}: "
                              "make them the same")


def refuse_a_password(flag: str, image: str) -> None:
    """An image written with its login (`user:password@registry...`): the password would be written into
    the job's files, which others can read, and neither enroot nor Kubernetes takes it there."""
    if re.match(r"[^/@#]*:[^/@#]*@", image):
        raise LaunchError(f"{flag} holds a password (user:password@...), which would be written into the job's "
                          "files: give the user alone (enroot reads the password from its .credentials file) or, "
                          "on Kubernetes, an imagePullSecret")


def require_no_control_characters(name: str, value: str, allowed: str = "") -> None:
    """Refuse C0/C1 control characters (new lines, carriage returns, escapes, NUL) in `value`.

    A new line ends an #SBATCH directive and starts a shell command; a carriage return makes sbatch
    refuse the script; terminal escapes rewrite what the user sees. `allowed` lists the exceptions
    (a quoted shell word may hold tabs and new lines).
    """
    for char in value:
        if (ord(char) < 0x20 or 0x7f <= ord(char) < 0xa0) and char not in allowed:
            raise LaunchError(f"{name} {value!r} contains the control character {char!r}: remove it")


def submit(tool: str, path: Path) -> str:
    """Run `sbatch`/`kubectl create -f` on the written file and return what identifies the job (create,
    not apply: a job of the same name is an error, never changed into this one)."""
    if shutil.which(tool) is None:
        raise LaunchError(f"--submit needs `{tool}` on PATH; without --submit the file is written for you "
                          f"to submit: {path}")
    # absolute, so that a file named like an option (`-h.sbatch`) is never read as one
    path = path.resolve()
    command = [tool, str(path)] if tool == "sbatch" else [tool, "create", "-f", str(path)]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise LaunchError(f"`{shlex.join(command)}` failed ({result.returncode}): {result.stderr.strip()}")
    return result.stdout.strip()
