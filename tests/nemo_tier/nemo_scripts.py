"""Runs NeMo programs (the scripts of tests/nemo_tier/scripts, NeMo's own CLI) for the tests.

Importing NeMo takes most of a run's time, so a test module hands all its runs to ONE fresh
interpreter (tests/scripts/run_in_one_process.py), which runs each program as `python FILE ARGS` would,
in its own directory, and the tests assert on each run's outputs.
"""

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

SCRIPTS = Path(__file__).parent / "scripts"
NEMO_CLI = Path(sys.executable).parent / "nemo"
ONE_PROCESS = Path(__file__).parents[1] / "scripts" / "run_in_one_process.py"


@dataclass
class Run:
    """One program to run: `program` is a script of SCRIPTS or a path; `env` adds to the environment."""

    name: str
    program: str | Path
    argv: list
    env: dict | None = None


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str
    record: dict | None  # what the script's probe wrote to $THROUGHPUT_PROBE, if it got that far


def run_dir(base: Path, name: str) -> Path:
    """Where a run works and writes its outputs (made here so a test can put inputs there first)."""
    path = base / name
    path.mkdir(parents=True, exist_ok=True)
    return path


def run_in_one_process(runs: list[Run], base: Path, timeout: float = 900) -> dict[str, Result]:
    """Run all `runs` in one fresh interpreter, in this order; return each run's Result by name."""
    specs = []
    for run in runs:
        cwd = run_dir(base, run.name)
        program = SCRIPTS / run.program if (SCRIPTS / run.program).exists() else Path(run.program)
        env = {"THROUGHPUT_PROBE": str(cwd / "probe.json"), **(run.env or {})}
        specs.append({"program": str(program), "argv": [str(a) for a in run.argv], "cwd": str(cwd), "env": env})
    (base / "runs.json").write_text(json.dumps(specs, indent=1))
    env = {**os.environ, "NVIDIA_PYTORCH_VERSION": "24.09", "PYTHONUNBUFFERED": "1", "COLUMNS": "200"}
    driver = subprocess.run([sys.executable, str(ONE_PROCESS), str(base / "runs.json")],
                            env=env, cwd=base, capture_output=True, text=True, timeout=timeout)
    assert driver.returncode == 0, driver.stderr[-3000:]
    return {run.name: read_result(base / run.name) for run in runs}


def read_result(cwd: Path) -> Result:
    exit_code = cwd / "exit_code"
    assert exit_code.exists(), f"the run in {cwd} did not finish (see {cwd}/stderr.txt)"
    probe = cwd / "probe.json"
    return Result(returncode=int(exit_code.read_text()), stdout=(cwd / "stdout.txt").read_text(),
                  stderr=(cwd / "stderr.txt").read_text(),
                  record=json.loads(probe.read_text()) if probe.exists() else None)
