"""`nemo-throughput bench` runs every condition and reports every field (timings are its output,
never asserted here: these machines are shared); its arithmetic and arguments, checked exactly."""

import json
import math
import os
import re

import pytest
import torch

from conftest import nemo_throughput_cli
from nemo_throughput.bench.render import render
from nemo_throughput.bench.stats import Condition, paired_overhead_pct
from nemo_throughput.bench.trials import SIZES, _model_cfg, clock_steps, default_window, resolve_device
from nemo_throughput.window import Window

FIELDS = {"name", "skipped", "median_step_time_s", "step_times_s", "spread_pct", "overhead_pct", "overhead_mean_pct",
          "overhead_ci95_pct", "measured_step_time_s", "error_pct", "hook_us_per_step", "hook_share_pct",
          "hook_us_per_non_log_step", "hook_us_per_log_step", "device_syncs_per_non_log_step",
          "hook_syncs_per_log_step", "hook_syncs_per_step", "syncs_per_step"}
SYNC_FIELDS = ("device_syncs_per_non_log_step", "hook_syncs_per_log_step", "hook_syncs_per_step", "syncs_per_step")


def bench(*args, cwd):
    return nemo_throughput_cli("bench", *args, cwd=cwd)


@pytest.mark.slow
def test_bench_reports_every_field_for_every_condition(tmp_path):
    output = tmp_path / "bench.json"
    result = bench("--steps", "12", "--window", "4:12", "--rounds", "2", "--micro-batch-size", "2", "--format", "json",
                   "--output", output, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout == ""  # --output: the result goes to the file instead
    report = json.loads(output.read_text())
    assert report["window"] == "4:12" and report["window_steps"] == [4, 11]  # as report counts: 4 <= step < 12
    assert report["rounds"] == 2 and report["model"] == "cpu"
    assert report["device_info"] is None and report["sync_counting"] is None  # CPU: nothing to synchronize
    conditions = {c["name"]: c for c in report["conditions"]}
    assert list(conditions) == ["no-callback", "empty-callback", "nemo-throughput", "nemo-throughput-debug",
                                "nemo-throughput-prometheus", "lightning-throughput-monitor", "nemo-timing-callback"]
    for name, condition in conditions.items():
        assert set(condition) == FIELDS, name
        assert all(condition[field] is None for field in SYNC_FIELDS), name
    assert conditions["nemo-timing-callback"]["skipped"] == "NeMo is not installed"
    for name in ("no-callback", "empty-callback", "nemo-throughput", "nemo-throughput-debug",
                 "nemo-throughput-prometheus", "lightning-throughput-monitor"):
        condition = conditions[name]
        assert condition["skipped"] is None and len(condition["step_times_s"]) == 2
        assert condition["median_step_time_s"] > 0 and condition["spread_pct"] >= 0
        low, high = condition["overhead_ci95_pct"]  # two rounds: an interval around the mean
        assert low <= condition["overhead_mean_pct"] <= high
    baseline = conditions["no-callback"]
    assert baseline["overhead_pct"] == 0 and baseline["overhead_mean_pct"] == 0
    assert baseline["overhead_ci95_pct"] == [0, 0] and baseline["measured_step_time_s"] is None
    assert baseline["hook_us_per_step"] is None  # no tool, no hooks
    for name in ("nemo-throughput", "nemo-throughput-debug", "nemo-throughput-prometheus",
                 "lightning-throughput-monitor"):
        assert conditions[name]["measured_step_time_s"] > 0 and conditions[name]["error_pct"] is not None
        assert conditions[name]["hook_us_per_step"] > 0  # every tool's own hooks are timed
    ours = conditions["nemo-throughput"]
    assert ours["hook_us_per_non_log_step"] > 0 and ours["hook_us_per_log_step"] > 0 and ours["hook_share_pct"] > 0
    assert conditions["nemo-throughput-debug"]["hook_us_per_non_log_step"] is None  # every step logs
    assert conditions["lightning-throughput-monitor"]["hook_us_per_non_log_step"] is None  # ours only
    assert conditions["nemo-throughput-prometheus"]["hook_us_per_non_log_step"] > 0
    assert report["ratios"]["prometheus_non_log_step_vs_non_log_step"] > 0
    assert report["ratios"]["slow_nvml_log_step_vs_log_step"] is None  # a diagnostic: run only when named
    # the floor: an empty callback's four hooks, timed as ours are; every one of its steps is ordinary
    floor = conditions["empty-callback"]
    assert floor["hook_us_per_step"] > 0 and floor["hook_us_per_non_log_step"] > 0
    assert floor["measured_step_time_s"] is None and floor["hook_us_per_log_step"] is None
    assert report["ratios"]["non_log_step_above_empty_callback_us"] == pytest.approx(
        ours["hook_us_per_non_log_step"] - floor["hook_us_per_non_log_step"])


@pytest.mark.slow
def test_bench_table_counting_the_window_from_the_end_with_the_diagnostic_conditions(tmp_path):
    result = bench("--steps", "12", "--window", "-10:", "--rounds", "1", "--device", "cpu", "--micro-batch-size", "2",
                   "--conditions", "no-callback,empty-callback,nemo-throughput,nemo-throughput-slow-nvml,"
                   "nemo-throughput-idle-gpu,step-timer-only", "--format", "json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    table = render(report)
    assert "nemo-throughput" in table and "overhead" in table and "95% CI" in table
    assert "micro-batch 2" in table and "window -10: (steps 3-12 timed)" in table
    # the diagnostics run only when named: the slow NVML's log step beside the plain one's; no GPU to idle
    assert "nemo-throughput-idle-gpu   skipped: a CUDA diagnostic (the GPU idle before each hook)" in table
    assert "nemo-throughput's log step with a 5 ms NVML energy read = " in table
    # the step timer alone, between the floor and ours: its ordinary and log steps apart, as ours are
    conditions = {c["name"]: c for c in report["conditions"]}
    timer, ours, floor = (conditions[name] for name in ("step-timer-only", "nemo-throughput", "empty-callback"))
    assert timer["hook_us_per_non_log_step"] > 0 and timer["hook_us_per_log_step"] > 0
    assert timer["measured_step_time_s"] is None  # it reports nothing
    ratios = report["ratios"]
    assert ratios["non_log_step_above_step_timer_only_us"] == pytest.approx(
        ours["hook_us_per_non_log_step"] - timer["hook_us_per_non_log_step"])
    assert ratios["step_timer_only_above_empty_callback_us"] == pytest.approx(
        timer["hook_us_per_non_log_step"] - floor["hook_us_per_non_log_step"])
    assert "µs above step-timer-only's" in table and "step-timer-only's non-log step = " in table


def test_the_window_is_report_s_syntax_and_what_cannot_be_timed_is_refused(tmp_path):
    assert clock_steps(Window.parse("4:12"), 12) == (3, 11)  # clock at the end of steps 3 and 11: steps 4 to 11
    assert clock_steps(Window.parse("-4:"), 6) == (2, 6) and clock_steps(Window.parse("last"), 6) == (5, 6)
    assert clock_steps(Window.parse("2:"), 6) == (1, 6) and clock_steps(default_window(60), 60) == (15, 60)
    assert clock_steps(default_window(2), 2) == (1, 2)
    for window, refusal in (("5:9", "--window 5:9 reaches past the 6 steps of a trial (--steps 6)"),
                            ("-7:", "--window -7: reaches past the 6 steps"),
                            ("1:4", "--window 1:4 starts at step 1, which cannot be timed"),
                            (":4", "--window :4 starts at step 1"), ("-6:", "--window -6: starts at step 1"),
                            ("0:1", "--window 0:1 selects none of the 6 steps")):
        with pytest.raises(ValueError, match=re.escape(refusal)):
            clock_steps(Window.parse(window), 6)
    for window, refusal in (("-6:", "starts at step 1"), ("5-9", "--window '5-9': use A:B (steps A to B-1)")):
        bad = bench("--steps", "6", "--window", window, "--device", "cpu", cwd=tmp_path)
        assert bad.returncode == 2 and bad.stdout == "" and refusal in bad.stderr and "trial" not in bad.stderr, window


@pytest.mark.slow
def test_bench_output_holds_the_chosen_format(tmp_path):
    table = tmp_path / "bench.txt"
    result = bench("--steps", "3", "--rounds", "1", "--conditions", "no-callback", "--device", "cpu",
                   "--micro-batch-size", "1", "--no-sync-count", "--output", table, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout == "" and f"bench: {table}" in result.stderr
    assert table.read_text().startswith("nemo-throughput bench, ") and "window 2: (steps 2-3 timed)" in \
        table.read_text()


def test_bench_refuses_what_it_cannot_run(tmp_path):
    no_batch = bench("--micro-batch-size", "0", "--steps", "4", cwd=tmp_path)
    assert no_batch.returncode == 2 and "micro-batch size must be at least 1, got 0" in no_batch.stderr
    if not torch.cuda.is_available():
        no_gpu = bench("--device", "cuda", cwd=tmp_path)
        assert no_gpu.returncode == 2 and "--device cuda, but torch" in no_gpu.stderr and "sees no CUDA GPU" in \
            no_gpu.stderr
    unknown = bench("--device", "tpu", cwd=tmp_path)
    assert unknown.returncode == 2 and "invalid choice: 'tpu'" in unknown.stderr


def test_an_unknown_condition_is_one_line_naming_the_known_ones_before_any_training(tmp_path):
    typo = bench("--conditions", "no-callback,nemo-throughput-debgu", "--steps", "4", "--device", "cpu", cwd=tmp_path)
    assert typo.returncode == 2 and typo.stdout == ""
    assert typo.stderr.strip().splitlines() == [
        "nemo-throughput bench: unknown condition(s) ['nemo-throughput-debgu'] in --conditions; choose from "
        "no-callback, empty-callback, nemo-throughput, nemo-throughput-debug, nemo-throughput-prometheus, "
        "nemo-throughput-slow-nvml, nemo-throughput-idle-gpu, step-timer-only, lightning-throughput-monitor, "
        "nemo-timing-callback"]
    twice = bench("--conditions", "no-callback,no-callback", "--steps", "4", "--device", "cpu", cwd=tmp_path)
    assert twice.returncode == 2 and "names a condition twice" in twice.stderr


def test_device_resolution():
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device("auto") == expected and resolve_device("cpu") == "cpu"
    with pytest.raises(ValueError, match=r"unknown device 'tpu'; choose one of \['auto', 'cpu', 'cuda'\]"):
        resolve_device("tpu")


def test_model_sizes_and_micro_batch_override():
    cfg = _model_cfg("gpt3-2.7b")
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.ffn_hidden_size, cfg.encoder_seq_length,
            cfg.micro_batch_size, cfg.global_batch_size, cfg.tokenizer.vocab_size) == (32, 2560, 32, 10240, 2048, 2, 2,
                                                                                      50257)
    assert _model_cfg("gpt3-126m", micro_batch_size=4).global_batch_size == 4  # one device, no accumulation
    assert SIZES["gpt3-126m"]["micro_batch_size"] == 8  # the override is a copy
    with pytest.raises(ValueError, match="unknown size 'gpt3-175b'"):
        _model_cfg("gpt3-175b")


def test_paired_overhead_mean_and_confidence_interval():
    # per round: +1 %, +2 %, 0 %: mean 1, sample sd 1, half-width t(2) / sqrt(3) = 4.303 / 1.732
    overhead = paired_overhead_pct([1.01, 0.51, 2.0], [1.0, 0.5, 2.0])
    assert overhead["per_round"] == pytest.approx([1.0, 2.0, 0.0])
    assert overhead["mean"] == pytest.approx(1.0)
    half = 4.303 / math.sqrt(3)
    assert overhead["ci95"] == pytest.approx([1.0 - half, 1.0 + half], abs=1e-3)
    assert paired_overhead_pct([1.1], [1.0]) == {"per_round": pytest.approx([10.0]), "mean": pytest.approx(10.0),
                                                 "ci95": None}
    assert paired_overhead_pct([], []) is None
    with pytest.raises(ValueError, match="2 rounds against 3 baseline rounds"):
        paired_overhead_pct([1.0, 1.0], [1.0, 1.0, 1.0])


def test_condition_result_pairs_rounds_with_the_baseline():
    baseline = Condition("no-callback", step_times_s=[0.100, 0.200, 0.100])
    ours = Condition("nemo-throughput", step_times_s=[0.101, 0.200, 0.102], measured_s=[0.1005, 0.2, 0.1],
                     hook_us_mean=[10.0, 30.0, 20.0], syncs_non_log=[0, 0], hook_syncs_mean=[0.1],
                     step_syncs_mean=[1.0, 2.0])
    result = ours.result(baseline)
    assert result["overhead_pct"] == pytest.approx(100 * (0.102 / 0.1 - 1))  # medians: 0.102 vs 0.1
    assert result["overhead_mean_pct"] == pytest.approx((1.0 + 0.0 + 2.0) / 3)
    assert result["overhead_ci95_pct"][0] < result["overhead_mean_pct"] < result["overhead_ci95_pct"][1]
    assert result["hook_us_per_step"] == 20.0 and result["hook_share_pct"] == pytest.approx(100 * 20e-6 / 0.102)
    assert result["device_syncs_per_non_log_step"] == 0 and result["hook_syncs_per_step"] == 0.1
    assert result["syncs_per_step"] == 1.5
    skipped_rounds = Condition("lightning-throughput-monitor", step_times_s=[0.1, 0.1])  # rounds do not pair up
    assert skipped_rounds.result(baseline)["overhead_mean_pct"] is None
    assert Condition("nemo-throughput").result(None)["overhead_pct"] is None


def test_bench_checks_its_output_before_training(tmp_path, capsys):
    """A directory or a path under a file is refused at once, not after minutes of trials."""
    from nemo_throughput import cli

    (tmp_path / "a-file").write_text("")
    under_a_file = tmp_path / "a-file" / "b.json"
    for output, message in ((tmp_path, "is a directory"), (under_a_file, "is a file, not a directory")):
        assert cli.main(["bench", "--steps", "2", "--rounds", "1", "--output", str(output)]) == 2
        err = capsys.readouterr().err
        assert message in err and "trial" not in err


@pytest.mark.slow
def test_bench_ranks_reports_the_log_step_cost_per_rank_count_and_steps_done(tmp_path):
    output = tmp_path / "ranks.json"
    result = bench("--ranks", "2,1", "--steps-done", "1000,100", "--format", "json", "--output", output,
                   cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout == ""
    report = json.loads(output.read_text())
    assert [r["ranks"] for r in report["results"]] == [1, 2] and report["steps_done"] == [100, 1000]
    for row in report["results"]:
        assert row["steps"] > 1000
        assert set(row["by_steps_done"]) == {"100", "1000"}
        for point in row["by_steps_done"].values():
            assert all(point[key] > 0 for key in ("log_step_us", "log_step_cpu_us", "non_log_step_us",
                                                  "non_log_step_cpu_us"))


def test_bench_ranks_refuses_more_ranks_than_the_machine_can_start_before_starting_any(tmp_path):
    """Each rank is a process importing torch: `--ranks 100000` started them until memory ran out."""
    too_many = 4 * os.cpu_count() + 1
    result = bench("--ranks", f"2,{too_many}", cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr == (f"nemo-throughput bench: --ranks {too_many}: at most {too_many - 1} gloo ranks here "
                             f"(4 per CPU, {os.cpu_count()} CPUs): each rank is a process of its own\n")


def test_bench_ranks_refuses_a_bad_rank_list(tmp_path):
    for option, bad in (("--ranks", "2,x"), ("--ranks", "0,2"), ("--ranks", "2,2"), ("--steps-done", "100,ten")):
        result = bench("--ranks", "2", option, bad, cwd=tmp_path)
        assert result.returncode == 2 and result.stderr.startswith(f"nemo-throughput bench: {option} "), bad
        assert "Traceback" not in result.stderr
