"""Two ranks over gloo in a real Lightning DDP run, one of them made slower."""

import pytest

from conftest import read_json, run_train_tiny

pytestmark = pytest.mark.slow

SLOW_S = 0.15


def test_a_slow_rank_is_named_and_the_global_step_time_follows_it(tmp_path):
    proc = run_train_tiny("--output-dir", tmp_path, "--devices", 2, "--steps", 16, "--log-every", 4,
                          "--warmup", 2, "--slow-rank", 1, "--slow-s", SLOW_S, "--per-step-jsonl")
    output, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, output
    summary = read_json(tmp_path / "summary.json")
    timing = summary["timing"]

    assert summary["status"] == "completed" and summary["hardware"]["num_gpus"] == 2
    assert summary["parallel"]["data"] == 2
    (node,) = summary["environment"]["nodes"]  # both ranks on this host, recorded once
    assert node["ranks"] == [0, 1]
    assert timing["steps_measured"] == 14
    # Rank 1 spends SLOW_S more before its gradient all-reduce; rank 0 waits for it inside the step.
    assert timing["slowest_rank"] == 1 and timing["straggler"]["metric"] == "local_time_s"
    local = timing["per_rank_local_time_s"]
    assert local[1] - local[0] >= 0.8 * SLOW_S
    # so every rank's step, and the global step time, carries the slow rank's delay
    assert timing["step_time_s"]["min"] >= SLOW_S
    assert min(timing["per_rank_step_time_s"]) >= SLOW_S
    assert summary["throughput"]["tokens_per_s"] == pytest.approx(
        summary["batch"]["tokens_per_step"] / timing["step_time_s"]["mean"])
    # the live log line on rank 0 names it too
    assert "slowest rank 1" in output

    # steps.jsonl: both ranks' phases for every step; the global time is the larger of the two
    import json
    steps = [json.loads(line) for line in open(tmp_path / "steps.jsonl")]
    assert [s["step"] for s in steps] == list(range(1, 17))
    for s in steps:
        assert len(s["ranks"]) == 2
        assert s["step_time_s"] == max(r["step_s"] for r in s["ranks"])
