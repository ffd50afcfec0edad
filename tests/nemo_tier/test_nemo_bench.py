"""`nemo-throughput bench` beside NeMo's own TimingCallback, where NeMo is installed."""

import json
import subprocess
import sys
from pathlib import Path


def test_bench_measures_nemo_timing_callback_too(tmp_path):
    cli = Path(sys.executable).parent / "nemo-throughput"
    # the fewest steps and samples that still give a timed window of several steps: the assertions
    # are about NeMo's TimingCallback being measured, not about the figures
    result = subprocess.run([cli, "bench", "--steps", "6", "--window", "2:6", "--rounds", "1", "--micro-batch-size",
                             "1", "--format", "json",
                             "--conditions", "no-callback,nemo-throughput,nemo-timing-callback"],
                            capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    conditions = {c["name"]: c for c in json.loads(result.stdout)["conditions"]}
    timing = conditions["nemo-timing-callback"]
    assert timing["skipped"] is None
    assert timing["median_step_time_s"] > 0 and timing["measured_step_time_s"] > 0
    assert timing["error_pct"] is not None and timing["overhead_pct"] is not None
