"""`nemo-throughput compare`: the statistics against known values and simulated noise, verdicts on
synthetic repeats whose truth is known, real imported logs, and hostile input (exit status 2 with
a message naming the file, never a traceback, never a raw escape sequence)."""

import json
import math
import os
import random
import statistics
from pathlib import Path

import pytest

from conftest import nemo_throughput_cli
from nemo_throughput.cli import main
from nemo_throughput.compare import sides as sides_module
from nemo_throughput.compare.comparison import FASTER, INCONCLUSIVE, NO_CHANGE, SLOWER, decide
from nemo_throughput.compare.sides import load_side
from nemo_throughput.compare.stats import (
    batch_means_error,
    interval,
    one_run_noise,
    runs_noise,
)
from nemo_throughput.flops import ModelSpec, model_flops_per_sample
from nemo_throughput.run_facts import RunFacts
from nemo_throughput.run_stats import RunStats, rank_rows
from nemo_throughput.student_t import regularized_beta, t_cdf, t_quantile
from nemo_throughput.summary import STEPS_FILE, build_summary, write_json_atomic
from nemo_throughput.timing import StepTimes

SMALL = ModelSpec(num_layers=12, hidden_size=768, num_attention_heads=12, seq_length=2048, vocab_size=51200)
LARGE = ModelSpec(num_layers=24, hidden_size=2048, num_attention_heads=16, seq_length=2048, vocab_size=51200)
H100 = "NVIDIA H100 80GB HBM3"
DATA = Path(__file__).parent / "data" / "import"


def write_summary(path: Path, *, step_times: list[float], label: str = "base", model: str = "gpt3-126m",
                  spec: ModelSpec = SMALL, gbs: int = 128, gpus: int = 8, nodes: int = 1, gpu_name: str = H100,
                  dtype: str = "bf16", status: str = "completed", per_step: bool = False) -> Path:
    """A summary through the package's own RunFacts / RunStats / build_summary, with these step
    times; `per_step`: steps.jsonl beside it, as per_step_jsonl=true writes it."""
    facts = RunFacts(name=path.parent.name, label=label, global_batch_size=gbs, micro_batch_size=1,
                     seq_length=spec.seq_length, model_name=model, model_spec=spec, flops_formula="megatron",
                     flops_per_sample=model_flops_per_sample(spec), gpu_name=gpu_name, num_gpus=gpus,
                     num_nodes=nodes, dtype=dtype, peak_tflops=989.5, peak_source="table:H100 SXM",
                     steps_jsonl={"path": STEPS_FILE, "complete": True, "error": None} if per_step else None)
    stats = RunStats(world_size=1, warmup_steps=0)
    stats.add(rank_rows([[StepTimes(i + 1, t) for i, t in enumerate(step_times)]]))
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, build_summary(facts, stats, status))
    if per_step:
        rows = [json.dumps({"step": i + 1, "run_id": facts.run_id, "warmup": False, "profiled": False,
                            "skipped": False, "step_time_s": t, "ranks": []}) for i, t in enumerate(step_times)]
        (path.parent / STEPS_FILE).write_text("\n".join(rows) + "\n")
    return path


def repeats(root: Path, runs: int, mean_s: float, run_noise: float, rng: random.Random, *, steps: int = 20,
            **kwargs) -> Path:
    """`runs` summaries under `root`: each run's mean step time mean_s x (1 + N(0, run_noise)), its
    steps 0.2 % around it."""
    for index in range(runs):
        run_mean = mean_s * (1 + rng.gauss(0, run_noise))
        write_summary(root / f"run{index}" / "summary.json",
                      step_times=[run_mean * (1 + rng.gauss(0, 0.002)) for _ in range(steps)], **kwargs)
    return root


def compare(*args, capsys) -> tuple[int, str, str]:
    """The real CLI, in this process: (exit status, stdout, stderr)."""
    code = main(["compare", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def compare_json(*args, capsys) -> tuple[int, dict, str]:
    code, out, err = compare(*args, "--format", "json", capsys=capsys)
    return code, json.loads(out) if out else {}, err


def verdicts(document: dict) -> dict[str, str]:
    return {m["metric"]: m["verdict"] for m in document["metrics"]}


# ------------------------------------------------------------------------ the statistics
@pytest.mark.parametrize("p, df, t", [  # Student's t table (e.g. NIST/SEMATECH e-Handbook 1.3.6.7.2)
    (0.975, 1, 12.706), (0.975, 2, 4.303), (0.975, 3, 3.182), (0.975, 4, 2.776), (0.975, 5, 2.571),
    (0.975, 9, 2.262), (0.975, 10, 2.228), (0.975, 20, 2.086), (0.975, 30, 2.042), (0.975, 100, 1.984),
    (0.975, 1000, 1.962), (0.975, 1e6, 1.960), (0.995, 4, 4.604), (0.95, 7, 1.895), (0.90, 15, 1.341),
])
def test_t_quantiles_match_the_table(p, df, t):
    assert t_quantile(p, df) == pytest.approx(t, abs=6e-4)
    assert t_quantile(1 - p, df) == pytest.approx(-t, abs=6e-4)
    assert t_cdf(t_quantile(p, df), df) == pytest.approx(p, abs=1e-9)


def test_t_quantile_between_whole_degrees_of_freedom_lies_between_them():
    """Welch's degrees of freedom are fractional."""
    assert t_quantile(0.975, 4) > t_quantile(0.975, 4.5) > t_quantile(0.975, 5)
    with pytest.raises(ValueError):
        t_quantile(1.0, 3)
    with pytest.raises(ValueError):
        t_quantile(0.975, 0)


def test_regularized_beta_known_values():
    assert regularized_beta(3.0, 3.0, 0.5) == pytest.approx(0.5)
    assert regularized_beta(1.0, 1.0, 0.3) == pytest.approx(0.3)
    assert regularized_beta(2.5, 1.0, 0.4) == pytest.approx(0.4 ** 2.5)
    assert (regularized_beta(2.0, 3.0, 0.0), regularized_beta(2.0, 3.0, 1.0)) == (0.0, 1.0)


def test_batch_means_need_two_batches_of_five_steps():
    assert batch_means_error([1.0] * 9) is None
    se, df = batch_means_error([1.0, 1.1, 1.0, 1.1, 1.05] * 2)
    assert df == 1 and se == pytest.approx(0.0, abs=1e-15)  # two batches with the same mean
    assert batch_means_error([1.0] * 1000)[1] == 9  # at most ten batches


def _ar1(rng: random.Random, n: int, rho: float, sigma: float) -> list[float]:
    """Step times around 1 s whose deviations follow an AR(1) process (consecutive steps correlated)."""
    value, series = 0.0, []
    for _ in range(n):
        value = rho * value + rng.gauss(0, sigma)
        series.append(1.0 + value)
    return series


def test_batch_means_cover_the_true_mean_of_correlated_steps():
    """Steps correlated step to step (rho 0.5): the naive std/sqrt(n) interval covers the true mean
    far less often than 95 %; batch means keep close to it."""
    rng = random.Random(7)
    covered = naive = 0
    trials = 300
    for _ in range(trials):
        steps = _ar1(rng, 400, 0.5, 0.01)
        noise = one_run_noise(0.0, steps)
        half = t_quantile(0.975, noise.df) * noise.se * statistics.fmean(steps)
        covered += abs(statistics.fmean(steps) - 1.0) <= half
        naive += abs(statistics.fmean(steps) - 1.0) <= 1.96 * statistics.stdev(steps) / math.sqrt(len(steps))
    assert covered / trials >= 0.90
    assert naive / trials < 0.85


def _simulate(rng: random.Random, runs: int, noise: float, change: float) -> tuple[str, object]:
    """One comparison of `runs` repeats a side, run-to-run noise `noise`, the candidate's tokens/s
    changed by `change` (a fraction)."""
    base = [math.log(1 + rng.gauss(0, noise)) for _ in range(runs)]
    cand = [math.log((1 + change) * (1 + rng.gauss(0, noise))) for _ in range(runs)]
    found = interval(runs_noise(base), runs_noise(cand))
    return decide(found, True, 2.0), found


def test_welch_interval_covers_the_true_change_95_percent_of_the_time():
    rng = random.Random(11)
    trials, covered = 600, 0
    for _ in range(trials):
        _, found = _simulate(rng, 5, 0.01, -0.05)
        covered += found.low <= math.log(0.95) <= found.high
    assert 0.92 <= covered / trials <= 0.98


def test_a_five_percent_slowdown_is_slower_and_equal_runs_never_are():
    rng = random.Random(12)
    slowdown = [_simulate(rng, 5, 0.01, -0.05)[0] for _ in range(300)]
    assert slowdown.count(SLOWER) / len(slowdown) >= 0.95 and NO_CHANGE not in slowdown and FASTER not in slowdown
    equal = [_simulate(rng, 10, 0.01, 0.0)[0] for _ in range(300)]
    assert equal.count(NO_CHANGE) / len(equal) >= 0.90 and SLOWER not in equal


def test_no_change_is_rarely_said_of_a_change_as_large_as_the_threshold():
    """"no change" is an equivalence test: with a true 2 % slowdown (the threshold) it is said at
    most about 2.5 % of the time; with a true 3 % slowdown, almost never."""
    rng = random.Random(13)
    at_threshold = [_simulate(rng, 5, 0.01, -0.02)[0] for _ in range(600)]
    assert at_threshold.count(NO_CHANGE) / len(at_threshold) <= 0.05
    beyond = [_simulate(rng, 5, 0.01, -0.03)[0] for _ in range(300)]
    assert beyond.count(NO_CHANGE) <= 3


def test_the_verdict_rule_at_its_edges():
    from nemo_throughput.compare.stats import Interval

    def verdict(low_pct, high_pct, higher_is_better=True, threshold=2.0):
        found = Interval(0.0, math.log1p(low_pct / 100), math.log1p(high_pct / 100), "runs")
        return decide(found, higher_is_better, threshold)

    assert verdict(-6, -3) == SLOWER and verdict(3, 6) == FASTER and verdict(-1.5, 1.9) == NO_CHANGE
    assert verdict(-4, -1) == INCONCLUSIVE  # slower, but maybe by less than the threshold
    assert verdict(-3, 1) == INCONCLUSIVE and verdict(-3, 3) == INCONCLUSIVE
    assert verdict(3, 6, higher_is_better=False) == SLOWER  # a longer step time
    assert verdict(-1, -0.5, threshold=0) == SLOWER and verdict(0, 0, threshold=0) == NO_CHANGE
    assert decide(Interval(0.0, None, None, "none"), True, 2.0) == INCONCLUSIVE


# ------------------------------------------------------------------------ verdicts on summaries
def test_five_repeats_with_a_five_percent_slowdown_are_slower_exit_1(tmp_path, capsys):
    rng = random.Random(1)
    base = repeats(tmp_path / "base", 5, 1.0, 0.01, rng)
    cand = repeats(tmp_path / "cand", 5, 1.0 / 0.95, 0.01, rng, label="cand")
    code, out, err = compare(base, cand, capsys=capsys)
    assert code == 1, err
    lines = {line.split()[0]: line for line in out.splitlines() if line.startswith(("tokens/s", "MFU"))}
    assert lines["tokens/s"].endswith("slower") and lines["MFU"].endswith("slower")
    assert "step time" in out and "exit status 1: the candidate is slower" in out
    code, document, _ = compare_json(base, cand, capsys=capsys)
    assert code == 1 and set(verdicts(document).values()) == {SLOWER}
    tokens = document["metrics"][0]
    assert tokens["metric"] == "tokens_per_s" and tokens["baseline_runs"] == tokens["candidate_runs"] == 5
    assert tokens["ci95_pct"][0] < tokens["change_pct"] < tokens["ci95_pct"][1] < -2
    assert tokens["change_pct"] == pytest.approx(-5, abs=1.5)


def test_repeats_of_one_distribution_are_no_change_exit_0(tmp_path, capsys):
    rng = random.Random(2)
    base = repeats(tmp_path / "base", 8, 1.0, 0.01, rng)
    cand = repeats(tmp_path / "cand", 8, 1.0, 0.01, rng, label="cand")
    code, document, err = compare_json(base, cand, capsys=capsys)
    assert code == 0, err
    assert set(verdicts(document).values()) == {NO_CHANGE}
    assert all(-2 <= m["ci95_pct"][0] <= m["ci95_pct"][1] <= 2 for m in document["metrics"])


def test_the_same_runs_on_both_sides_are_no_change_with_a_note(tmp_path, capsys):
    base = repeats(tmp_path / "base", 5, 1.0, 0.01, random.Random(3))
    code, document, err = compare_json(base, base, capsys=capsys)
    assert code == 0 and set(verdicts(document).values()) == {NO_CHANGE}
    assert document["metrics"][0]["change_pct"] == 0.0
    assert "5 run(s) are on both sides" in err


def test_two_runs_a_side_with_big_noise_are_inconclusive(tmp_path, capsys):
    rng = random.Random(4)
    base = repeats(tmp_path / "base", 2, 1.0, 0.10, rng)
    cand = repeats(tmp_path / "cand", 2, 1.0 / 0.95, 0.10, rng)
    code, out, _ = compare(base, cand, capsys=capsys)
    assert code == 0
    assert "inconclusive" in out and "slower  " not in out
    assert "more repeats narrow" in out


def test_a_faster_candidate_is_faster_exit_0(tmp_path, capsys):
    rng = random.Random(5)
    base = repeats(tmp_path / "base", 5, 1.0, 0.01, rng)
    cand = repeats(tmp_path / "cand", 5, 0.9, 0.01, rng)
    code, document, _ = compare_json(base, cand, capsys=capsys)
    assert code == 0 and set(verdicts(document).values()) == {FASTER}
    step = next(m for m in document["metrics"] if m["metric"] == "step_time_s")
    assert step["change_pct"] == pytest.approx(-10, abs=2) and step["ci95_pct"][1] < -2


def test_threshold_decides_between_no_change_and_inconclusive(tmp_path, capsys):
    rng = random.Random(6)
    base = repeats(tmp_path / "base", 5, 1.0, 0.01, rng)
    cand = repeats(tmp_path / "cand", 5, 1.0, 0.01, rng)
    _, wide, _ = compare_json(base, cand, "--threshold", "10", "--metric", "tokens_per_s", capsys=capsys)
    _, none, _ = compare_json(base, cand, "--threshold", "0", "--metric", "tokens_per_s", capsys=capsys)
    assert verdicts(wide) == {"tokens_per_s": NO_CHANGE} and wide["threshold_pct"] == 10
    assert verdicts(none) == {"tokens_per_s": INCONCLUSIVE}


# ------------------------------------------------------------------------ one run on a side
def test_one_run_a_side_uses_batch_means_of_its_steps(tmp_path, capsys):
    rng = random.Random(8)
    base = write_summary(tmp_path / "base" / "summary.json", step_times=_ar1(rng, 200, 0.5, 0.01), per_step=True)
    slow = write_summary(tmp_path / "slow" / "summary.json", per_step=True,
                         step_times=[t / 0.95 for t in _ar1(rng, 200, 0.5, 0.01)])
    same = write_summary(tmp_path / "same" / "summary.json", step_times=_ar1(rng, 200, 0.5, 0.01), per_step=True)
    code, document, _ = compare_json(base, slow, capsys=capsys)
    assert code == 1 and document["metrics"][0]["method"] == "steps"
    code, out, _ = compare(base, same, capsys=capsys)
    assert code == 0 and "no change" in out
    assert "the interval holds the noise of the steps, not how much runs differ" in out


def test_one_run_a_side_without_its_steps_is_inconclusive_never_no_change(tmp_path, capsys):
    base = write_summary(tmp_path / "base" / "summary.json", step_times=[1.0] * 50)
    cand = write_summary(tmp_path / "cand" / "summary.json", step_times=[1.0] * 50)
    code, document, _ = compare_json(base, cand, capsys=capsys)
    assert code == 0 and set(verdicts(document).values()) == {INCONCLUSIVE}
    assert document["metrics"][0]["ci95_pct"] is None
    assert "per_step_jsonl=true" in document["metrics"][0]["reason"]
    slower = write_summary(tmp_path / "slower" / "summary.json", step_times=[2.0] * 50)
    assert compare_json(base, slower, capsys=capsys)[0] == 0  # twice as slow, but noise unknown: not "slower"


def test_steps_jsonl_of_another_run_is_not_used(tmp_path, capsys):
    base = write_summary(tmp_path / "base" / "summary.json", step_times=[1.0, 1.01] * 50, per_step=True)
    other = write_summary(tmp_path / "other" / "summary.json", step_times=[1.5] * 100, per_step=True)
    (base.parent / STEPS_FILE).write_bytes((other.parent / STEPS_FILE).read_bytes())
    side = load_side(str(base))
    assert side.step_times is None and "do not give its mean step time" in side.steps_note


def test_one_run_beside_repeats_borrows_their_spread(tmp_path, capsys):
    rng = random.Random(9)
    base = repeats(tmp_path / "base", 6, 1.0, 0.01, rng)
    cand = write_summary(tmp_path / "cand" / "summary.json", step_times=[1.0 / 0.9] * 20)
    code, document, _ = compare_json(base, cand, capsys=capsys)
    assert code == 1 and document["metrics"][0]["method"] == "runs and one run"
    assert document["metrics"][0]["candidate_runs"] == 1


# ------------------------------------------------------------------------ comparability
@pytest.mark.parametrize("change, field", [
    ({"model": "llama-1b", "spec": LARGE}, "model"),
    ({"gbs": 256}, "global batch"),
    ({"spec": ModelSpec(num_layers=12, hidden_size=768, num_attention_heads=12, seq_length=4096,
                        vocab_size=51200)}, "sequence length"),
    ({"gpus": 16, "nodes": 2}, "GPUs"),
    ({"gpu_name": "NVIDIA A100-SXM4-80GB"}, "GPU model"),
    ({"gpu_name": "unknown"}, "GPU model"),  # known on one side only
])
def test_different_configurations_are_refused_unless_allowed(tmp_path, capsys, change, field):
    rng = random.Random(10)
    base = repeats(tmp_path / "base", 3, 1.0, 0.01, rng)
    cand = repeats(tmp_path / "cand", 3, 1.0, 0.01, rng, **change)
    code, out, err = compare(base, cand, capsys=capsys)
    assert code == 2 and out == ""
    assert "not the same configuration" in err and f"  {field}: " in err and "--allow-different" in err
    code, document, err = compare_json(base, cand, "--allow-different", capsys=capsys)
    assert code in (0, 1), err
    assert field in [d["field"] for d in document["differences"]]
    code, out, _ = compare(base, cand, "--allow-different", capsys=capsys)
    assert f"  {field}: " in out.split("compared although they differ")[1]


def test_step_time_is_left_out_where_steps_hold_different_work(tmp_path, capsys):
    rng = random.Random(14)
    base = repeats(tmp_path / "base", 3, 1.0, 0.01, rng)
    cand = repeats(tmp_path / "cand", 3, 2.0, 0.01, rng, gbs=256)
    code, document, err = compare_json(base, cand, "--allow-different", capsys=capsys)
    assert [m["metric"] for m in document["metrics"]] == ["tokens_per_s", "mfu"]
    assert "step time is not compared" in err
    assert verdicts(document)["tokens_per_s"] in (NO_CHANGE, INCONCLUSIVE) and code == 0


def test_a_directory_of_different_configurations_is_refused(tmp_path, capsys):
    side = tmp_path / "mixed"
    write_summary(side / "a" / "summary.json", step_times=[1.0] * 5)
    write_summary(side / "b" / "summary.json", step_times=[1.0] * 5, gbs=256)
    other = write_summary(tmp_path / "other" / "summary.json", step_times=[1.0] * 5)
    code, _, err = compare(side, other, capsys=capsys)
    assert code == 2
    assert err.startswith(f"nemo-throughput compare: baseline {side}: its runs are not repeats of one configuration")
    assert "global batch 128" in err and "global batch 256" in err


def test_runs_that_did_not_complete_are_left_out_with_a_note(tmp_path, capsys):
    rng = random.Random(15)
    base = repeats(tmp_path / "base", 3, 1.0, 0.01, rng)
    write_summary(base / "failed" / "summary.json", step_times=[9.0] * 5, status="failed")
    code, document, err = compare_json(base, base, capsys=capsys)
    assert code == 0 and document["baseline"]["runs"] == 3
    assert "left out:" in err and "status 'failed'" in err
    lone = write_summary(tmp_path / "lone" / "summary.json", step_times=[1.0] * 5, status="running")
    code, _, err = compare(lone, base, capsys=capsys)
    assert code == 2 and f"baseline {lone}: no completed run to compare" in err


def test_a_copy_of_a_run_is_not_a_repeat(tmp_path, capsys):
    base = repeats(tmp_path / "base", 2, 1.0, 0.01, random.Random(16))
    (base / "copy").mkdir()
    (base / "copy" / "summary.json").write_bytes((base / "run0" / "summary.json").read_bytes())
    code, _, err = compare(base, base, capsys=capsys)
    assert code == 2 and "are the same run (run.id" in err


def test_a_metric_not_known_for_every_run_is_refused_when_asked_for(tmp_path, capsys):
    base = write_summary(tmp_path / "base" / "summary.json", step_times=[1.0] * 5)
    summary = json.loads(base.read_text())
    summary["hardware"]["peak_tflops"] = None
    summary["throughput"]["mfu"] = None
    cand = tmp_path / "cand" / "summary.json"
    cand.parent.mkdir()
    summary["run"]["id"] = "0123456789ab"
    cand.write_text(json.dumps(summary))
    code, document, _ = compare_json(base, cand, "--allow-different", capsys=capsys)
    assert "mfu" not in verdicts(document)  # by default: only where known
    code, _, err = compare(base, cand, "--metric", "mfu", "--allow-different", capsys=capsys)
    assert code == 2 and f"{cand}: its MFU is not known" in err


# ------------------------------------------------------------------------ formats
def test_json_has_the_documented_keys(tmp_path, capsys):
    rng = random.Random(17)
    base = repeats(tmp_path / "base", 3, 1.0, 0.01, rng)
    cand = repeats(tmp_path / "cand", 3, 1.0, 0.01, rng, label="cand")
    _, document, _ = compare_json(base, cand, "--metric", "step_time_s", "--metric", "tokens_per_s",
                                  "--metric", "step_time_s", capsys=capsys)
    assert document["schema"] == "nemo-throughput/compare/v1"
    assert set(document) >= {"baseline", "candidate", "metrics", "differences", "threshold_pct", "slower"}
    assert [m["metric"] for m in document["metrics"]] == ["step_time_s", "tokens_per_s"]
    for metric in document["metrics"]:
        assert set(metric) >= {"metric", "baseline_mean", "baseline_runs", "candidate_mean", "candidate_runs",
                               "change_pct", "ci95_pct", "verdict"}
        assert len(metric["ci95_pct"]) == 2
    assert document["candidate"]["labels"] == ["cand"] and len(document["candidate"]["files"]) == 3
    assert document["baseline"]["configuration"]["global batch"] == 128


def test_bad_options_exit_2(tmp_path, capsys):
    base = write_summary(tmp_path / "base" / "summary.json", step_times=[1.0] * 5)
    for bad in (["--threshold", "nan"], ["--threshold", "-1"], ["--threshold", "100"], ["--metric", "loss"],
                ["--format", "csv"]):
        with pytest.raises(SystemExit) as caught:
            main(["compare", str(base), str(base), *bad])
        assert caught.value.code == 2


# ------------------------------------------------------------------------ real imported logs
def import_log(tmp_path: Path, log: str, *extra: str) -> Path:
    out = tmp_path / "imported" / Path(log).stem
    facts = ("--label", "real", "--model", "gpt3-126m", "--seq-length", "4096", "--num-gpus", "16",
             "--gpu-name", H100, "--dtype", "bf16", "--warmup", "0")
    assert main(["import", str(DATA / log), *facts, *extra, "--output-dir", str(out)]) == 0
    return next(out.rglob("summary.json"))


def test_a_real_log_against_itself_is_never_slower(tmp_path, capsys):
    for log in ("megatron_lm_mixtral_issue756.log", "nemo2_evo2_finetune_notebook.log"):
        summary = import_log(tmp_path, log)
        capsys.readouterr()
        code, document, err = compare_json(summary, summary, capsys=capsys)
        assert code == 0, err
        assert set(verdicts(document).values()) <= {NO_CHANGE, INCONCLUSIVE}
        assert document["metrics"][0]["change_pct"] == 0.0


def test_the_steps_of_real_imported_logs_give_their_own_mean(tmp_path, capsys):
    """timing.steps inside timing.window: the counted steps of a real import, found again exactly."""
    mixtral = load_side(str(import_log(tmp_path, "megatron_lm_mixtral_issue756.log")))
    assert len(mixtral.step_times) == 6 and "too few to estimate its noise" in mixtral.steps_note
    evo2 = load_side(str(import_log(tmp_path, "nemo2_evo2_finetune_notebook.log")))
    assert len(evo2.step_times) == evo2.runs[0].steps_counted >= 10 and evo2.steps_note is None


def test_two_halves_of_a_real_log_are_one_run_each(tmp_path, capsys):
    """Iterations 43-45 and 71-73 of a real Megatron-LM log as baseline and candidate."""
    early = import_log(tmp_path / "early", "megatron_lm_mixtral_issue756.log", "--window", "43:46")
    late = import_log(tmp_path / "late", "megatron_lm_mixtral_issue756.log", "--window", "71:")
    capsys.readouterr()
    code, out, _ = compare(early, late, capsys=capsys)
    assert code == 0 and "inconclusive" in out and "too few to estimate its noise" in out


def test_different_real_logs_are_refused_then_compared_with_their_differences(tmp_path, capsys):
    mixtral = import_log(tmp_path, "megatron_lm_mixtral_issue756.log")
    epfl = import_log(tmp_path, "megatron_llm_epfl_issue11.log")
    capsys.readouterr()
    code, _, err = compare(mixtral, epfl, capsys=capsys)
    assert code == 2 and "global batch: 128 (baseline) vs" in err
    code, document, _ = compare_json(mixtral, epfl, "--allow-different", capsys=capsys)
    assert code in (0, 1) and "global batch" in [d["field"] for d in document["differences"]]


# ------------------------------------------------------------------------ hostile input
@pytest.mark.invalid_summaries
def test_escape_sequences_in_a_label_never_reach_the_terminal(tmp_path, capsys):
    base = repeats(tmp_path / "base", 2, 1.0, 0.01, random.Random(18), label="evil\x1b]0;owned\x07\x1b[31mred")
    code, out, err = compare(base, base, capsys=capsys)
    assert code == 0 and "\x1b" not in out + err and "\x07" not in out + err
    assert "evilred" in out
    _, raw, _ = compare(base, base, "--format", "json", capsys=capsys)
    assert "\x1b" not in raw and json.loads(raw)["baseline"]["labels"] == ["evil\x1b]0;owned\x07\x1b[31mred"]


@pytest.mark.invalid_summaries
def test_escape_sequences_in_a_path_and_a_model_name_are_removed_from_errors(tmp_path, capsys):
    evil = tmp_path / "evil\x1b[2J"
    code, out, err = compare(evil, evil, capsys=capsys)
    assert code == 2 and "\x1b" not in err and "cannot read it" in err
    base = write_summary(tmp_path / "base" / "summary.json", step_times=[1.0] * 5, model="m\x1b[31m")
    cand = write_summary(tmp_path / "cand" / "summary.json", step_times=[1.0] * 5)
    code, _, err = compare(base, cand, capsys=capsys)
    assert code == 2 and "\x1b" not in err and "model: m[31m (baseline)" not in err


@pytest.mark.invalid_summaries
@pytest.mark.parametrize("make, message", [
    (lambda p: None, "cannot read it (No such file or directory)"),
    (lambda p: p.mkdir(), "no summary.json under it"),
    (lambda p: os.mkfifo(p), "not a regular file (a FIFO"),
    (lambda p: (p.mkdir(), (p / "summary.json").mkdir()), "a directory, not a summary file"),
    (lambda p: (p.mkdir(), os.mkfifo(p / "summary.json")), "not a regular file (a FIFO"),
    (lambda p: os.symlink(p, p), "cannot read it (Too many levels of symbolic links)"),
    (lambda p: p.write_text("{not json"), "not a readable JSON summary"),
    (lambda p: p.write_text('{"schema": "other/v9"}'), "schema is 'other/v9'"),
])
def test_unusable_inputs_exit_2_naming_the_file(tmp_path, capsys, make, message):
    good = write_summary(tmp_path / "good" / "summary.json", step_times=[1.0] * 5)
    bad = tmp_path / "bad"
    make(bad)
    for args, role in (((bad, good), "baseline"), ((good, bad), "candidate")):
        code, out, err = compare(*args, capsys=capsys)
        assert code == 2 and out == ""
        assert err.startswith(f"nemo-throughput compare: {role} ") and str(bad) in err and message in err, err


@pytest.mark.invalid_summaries
@pytest.mark.parametrize("field, value, message", [
    ("mean", float("nan"), "timing.step_time_s.mean is nan"),
    ("mean", 0.0, "timing.step_time_s.mean is 0.0"),
    ("mean", -1.0, "timing.step_time_s.mean is -1.0"),
    ("mean", 1e308, "its numbers give no finite throughput"),
])
def test_impossible_metrics_exit_2(tmp_path, capsys, field, value, message):
    path = write_summary(tmp_path / "bad" / "summary.json", step_times=[1.0] * 5)
    summary = json.loads(path.read_text())
    summary["timing"]["step_time_s"][field] = value
    path.write_text(json.dumps(summary))
    good = write_summary(tmp_path / "good" / "summary.json", step_times=[1.0] * 5)
    code, _, err = compare(good, path, capsys=capsys)
    assert code == 2 and message in err and str(path) in err


def test_a_summary_over_the_size_limit_is_refused_unread(tmp_path, capsys, monkeypatch):
    good = write_summary(tmp_path / "good" / "summary.json", step_times=[1.0] * 5)
    monkeypatch.setattr(sides_module, "MAX_SUMMARY_BYTES", 1000)
    code, _, err = compare(good, good, capsys=capsys)
    assert code == 2 and "more than a summary holds" in err


def test_a_time_to_train_result_is_refused(tmp_path, capsys):
    results = Path(__file__).parent / "data" / "mlperf" / "NVIDIA" / "eos_ngc24.04_nemo" / "llama2_70b_lora"
    assert main(["import", "--format", "mlperf", str(next(results.glob("result_*.txt"))), "--ruleset", "4.0.0",
                 "--output-dir", str(tmp_path / "mlperf")]) == 0
    result = next((tmp_path / "mlperf").rglob("summary.json"))
    capsys.readouterr()
    code, _, err = compare(result, result, capsys=capsys)
    assert code == 2 and "a time-to-train result (MLPerf)" in err


# ------------------------------------------------------------------------ the real command
def test_exit_status_of_the_installed_command(tmp_path):
    """The console script in a fresh process: 1 on a slowdown, 0 on none, 2 on unusable input."""
    rng = random.Random(19)
    base = repeats(tmp_path / "base", 5, 1.0, 0.01, rng)
    slow = repeats(tmp_path / "slow", 5, 1.0 / 0.95, 0.01, rng)
    done = nemo_throughput_cli("compare", base, slow, "--format", "json", timeout=120)
    assert done.returncode == 1, done.stderr
    assert json.loads(done.stdout)["slower"] is True
    assert nemo_throughput_cli("compare", base, base, timeout=120).returncode == 0
    missing = nemo_throughput_cli("compare", base, tmp_path / "missing", timeout=120)
    assert missing.returncode == 2 and "Traceback" not in missing.stderr


def test_a_different_model_shape_lists_each_field_that_differs(tmp_path, capsys):
    base = write_summary(tmp_path / "base" / "summary.json", step_times=[1.0] * 5)
    cand = write_summary(tmp_path / "cand" / "summary.json", step_times=[1.0] * 5, spec=LARGE)
    code, _, err = compare(base, cand, capsys=capsys)
    assert code == 2 and "  model shape: num_layers: 12 (baseline) vs 24 (candidate)" in err
    assert "model shape: vocab_size" not in err  # the same on both sides


@pytest.mark.invalid_summaries
def test_a_model_spec_nested_too_deeply_is_refused(tmp_path, capsys):
    path = write_summary(tmp_path / "deep" / "summary.json", step_times=[1.0] * 5)
    text = path.read_text().replace('"spec": {', '"spec": {"x": ' + "[" * 5000 + "]" * 5000 + ', ', 1)
    path.write_text(text)
    code, _, err = compare(path, path, capsys=capsys)
    assert code == 2 and str(path) in err and "Traceback" not in err


def test_repeats_without_spread_are_named(tmp_path, capsys):
    base = tmp_path / "base"
    for index in range(3):
        write_summary(base / f"run{index}" / "summary.json", step_times=[1.0] * 5)
    code, document, err = compare_json(base, base, capsys=capsys)
    assert code == 0 and set(verdicts(document).values()) == {NO_CHANGE}
    assert "the baseline's 3 runs have the same mean step time" in err


def test_help_prints_its_percent_signs(capsys):
    """argparse formats help with %: a bare one would break `nemo-throughput --help`."""
    for argv in (["--help"], ["compare", "--help"]):
        with pytest.raises(SystemExit) as caught:
            main(argv)
        assert caught.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "a 95 % interval and a verdict" in out and "with its 95 % interval" in out and "%%" not in out
