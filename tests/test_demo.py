"""The README's demo command, end to end: 2 gloo ranks, +callbacks=throughput, a summary."""

import json

import pytest

from conftest import nemo_throughput_cli

pytestmark = pytest.mark.slow


def test_demo_trains_two_ranks_and_prints_the_headline(tmp_path):
    result = nemo_throughput_cli("demo", "--steps", "20", "--output-dir", tmp_path, cwd=tmp_path, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads((tmp_path / "throughput" / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert summary["hardware"]["num_gpus"] == 2 and summary["parallel"]["data"] == 2
    assert summary["timing"]["steps_measured"] == 10  # 20 steps, 10 warm-up
    assert summary["batch"]["global_batch_size"] == 16 and summary["batch"]["micro_batch_size"] == 4
    assert f"summary: {tmp_path / 'throughput' / 'summary.json'}" in result.stdout
    assert f"tokens/s       {summary['throughput']['tokens_per_s']:,.0f}" in result.stdout
    assert "[throughput] steps 10-19" in result.stdout + result.stderr  # the live line of rank 0
