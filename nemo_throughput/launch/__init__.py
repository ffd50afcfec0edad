"""Launcher shims: render (and optionally submit) one benchmark job for Slurm or Kubernetes.

The templates are the files in the repository's `launchers/` (shipped as nemo_throughput/launchers):
a user can read them and use them by hand; `nemo-throughput launch` fills them in.
"""

from __future__ import annotations

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
    for arg in command:
        require_no_control_characters("the training command", arg, allowed="\t\n")
    return command


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
    """Run `sbatch`/`kubectl apply -f` on the written file and return what identifies the job."""
    if shutil.which(tool) is None:
        raise LaunchError(f"--submit needs `{tool}` on PATH; without --submit the file is written for you "
                          f"to submit: {path}")
    # absolute, so that a file named like an option (`-h.sbatch`) is never read as one
    path = path.resolve()
    command = [tool, str(path)] if tool == "sbatch" else [tool, "apply", "-f", str(path)]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise LaunchError(f"`{shlex.join(command)}` failed ({result.returncode}): {result.stderr.strip()}")
    return result.stdout.strip()
