"""Launcher shims: render (and optionally submit) one benchmark job for Slurm or Kubernetes.

The templates are the files in the repository's `launchers/` (shipped as nemo_throughput/launchers):
a user can read them and use them by hand; `nemo-throughput launch` fills them in.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

TEMPLATES = Path(__file__).resolve().parent.parent / "launchers"


class LaunchError(ValueError):
    """A launch request that cannot work, with what to change."""


def require_positive(name: str, value: int) -> None:
    if value < 1:
        raise LaunchError(f"{name} must be at least 1, got {value}")


def require_command(command: list[str]) -> list[str]:
    command = command[1:] if command[:1] == ["--"] else command
    if not command:
        raise LaunchError("no training command: put it after `--`, e.g. "
                          "`-- python train.py +callbacks=throughput`")
    return command


def submit(tool: str, path: Path) -> str:
    """Run `sbatch`/`kubectl apply -f` on the written file and return what identifies the job."""
    if shutil.which(tool) is None:
        raise LaunchError(f"--submit needs `{tool}` on PATH; without --submit the file is written for you "
                          f"to submit: {path}")
    command = [tool, str(path)] if tool == "sbatch" else [tool, "apply", "-f", str(path)]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise LaunchError(f"`{shlex.join(command)}` failed ({result.returncode}): {result.stderr.strip()}")
    return result.stdout.strip()
