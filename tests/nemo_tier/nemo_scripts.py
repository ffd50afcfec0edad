"""Runs the scripts of tests/nemo_tier/scripts, NeMo programs, in a fresh interpreter."""

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPTS = Path(__file__).parent / "scripts"


def run_nemo_script(script, *args, tmp_path, env=None, timeout=300):
    """Run a script of tests/nemo_tier/scripts in a fresh interpreter; return (result, probe record)."""
    probe = tmp_path / "probe.json"
    env = {**os.environ, "THROUGHPUT_PROBE": str(probe), "NVIDIA_PYTORCH_VERSION": "24.09",
           "PYTHONUNBUFFERED": "1", **(env or {})}
    result = subprocess.run([sys.executable, str(SCRIPTS / script), *map(str, args)], env=env, cwd=tmp_path,
                            capture_output=True, text=True, timeout=timeout)
    record = json.loads(probe.read_text()) if probe.exists() else None
    return result, record
