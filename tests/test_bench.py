"""`nemo-throughput bench` runs every condition and reports every field (timings are its output,
never asserted here: these machines are shared)."""

import json

import pytest

from conftest import nemo_throughput_cli

pytestmark = pytest.mark.slow

FIELDS = {"name", "skipped", "median_step_time_s", "step_times_s", "spread_pct", "overhead_pct",
          "measured_step_time_s", "error_pct", "hook_us_per_step", "hook_share_pct", "hook_us_per_non_log_step",
          "hook_us_per_log_step", "device_syncs_per_non_log_step"}


def bench(*args, cwd):
    return nemo_throughput_cli("bench", *args, cwd=cwd)


def test_bench_reports_every_field_for_every_condition(tmp_path):
    result = bench("--steps", "12", "--window", "4:12", "--rounds", "2", "--format", "json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert report["window"] == [4, 12] and report["rounds"] == 2 and report["model"] == "cpu"
    conditions = {c["name"]: c for c in report["conditions"]}
    assert list(conditions) == ["no-callback", "nemo-throughput", "nemo-throughput-debug",
                                "lightning-throughput-monitor", "nemo-timing-callback"]
    for name, condition in conditions.items():
        assert set(condition) == FIELDS, name
    assert conditions["nemo-timing-callback"]["skipped"] == "NeMo is not installed"
    for name in ("no-callback", "nemo-throughput", "nemo-throughput-debug", "lightning-throughput-monitor"):
        condition = conditions[name]
        assert condition["skipped"] is None and len(condition["step_times_s"]) == 2
        assert condition["median_step_time_s"] > 0 and condition["spread_pct"] >= 0
    assert conditions["no-callback"]["overhead_pct"] == 0 and conditions["no-callback"]["measured_step_time_s"] is None
    for name in ("nemo-throughput", "nemo-throughput-debug", "lightning-throughput-monitor"):
        assert conditions[name]["measured_step_time_s"] > 0 and conditions[name]["error_pct"] is not None
    ours = conditions["nemo-throughput"]
    assert ours["hook_us_per_non_log_step"] > 0 and ours["hook_us_per_log_step"] > 0 and ours["hook_share_pct"] > 0
    assert ours["device_syncs_per_non_log_step"] is None  # counted on CUDA only
    assert conditions["nemo-throughput-debug"]["hook_us_per_non_log_step"] is None  # every step logs


def test_bench_table_and_bad_arguments(tmp_path):
    result = bench("--steps", "6", "--window", "2:6", "--rounds", "1", "--conditions", "no-callback,nemo-throughput",
                   cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "nemo-throughput" in result.stdout and "overhead" in result.stdout
    bad = bench("--steps", "6", "--window", "5:9", cwd=tmp_path)
    assert bad.returncode == 2 and "the window 5:9 must lie inside the 6 steps" in bad.stderr
