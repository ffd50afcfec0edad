"""`nemo-throughput report` from summaries whose numbers are known, end to end with plots
(hostile and broken inputs: test_report_inputs.py; `nemo-throughput import`: test_import.py)."""

import json
import statistics
from pathlib import Path

import pytest

from conftest import nemo_throughput_cli
from nemo_throughput.aggregation import steps_tensor
from nemo_throughput.run_stats import RunStats
from nemo_throughput.cli import main
from nemo_throughput.flops import ModelSpec, model_flops_per_sample
from nemo_throughput.report.grouping import build_report
from nemo_throughput.report.rendering import render
from nemo_throughput.report.runs import ReportError, Window, load_run
from nemo_throughput.run_facts import RunFacts
from nemo_throughput.summary import build_summary, write_json_atomic
from nemo_throughput.timing import StepTimes

SMALL = ModelSpec(num_layers=12, hidden_size=768, num_attention_heads=12, seq_length=2048, vocab_size=51200)
LARGE = ModelSpec(num_layers=24, hidden_size=2048, num_attention_heads=16, seq_length=2048, vocab_size=51200)
H100 = 989.5


def write_run(path: Path, *, label: str, model: str = "gpt3-126m", spec: ModelSpec = SMALL, nodes: int = 1,
              gbs: int = 128, step_times: list[float], status: str = "completed", per_step: bool = False) -> Path:
    """A summary through the real RunFacts/RunStats/build_summary path, with the given step times."""
    facts = RunFacts(name=path.parent.name, label=label, global_batch_size=gbs, micro_batch_size=1,
                     seq_length=spec.seq_length, model_name=model, model_spec=spec, flops_formula="megatron",
                     flops_per_sample=model_flops_per_sample(spec), gpu_name="NVIDIA H100 80GB HBM3",
                     num_gpus=8 * nodes, num_nodes=nodes, dtype="bf16", peak_tflops=H100, peak_source="table:H100 SXM")
    stats = RunStats(world_size=1, warmup_steps=0)
    stats.add(steps_tensor([[StepTimes(i + 1, t) for i, t in enumerate(step_times)]]))
    write_json_atomic(path, build_summary(facts, stats, status))
    if per_step:
        lines = [json.dumps({"step": i + 1, "warmup": False, "step_time_s": t, "ranks": []})
                 for i, t in enumerate(step_times)]
        (path.parent / "steps.jsonl").write_text("\n".join(lines) + "\n")
    return path


def tokens(gbs: int, step_s: float, seq: int = 2048) -> float:
    return gbs * seq / step_s


def test_scaling_columns_from_known_numbers(tmp_path):
    # weak scaling: 128 samples per node; step times 1.00, 1.05, 1.20 s
    runs = [load_run(write_run(tmp_path / f"n{n}" / "summary.json", label="bare-metal", nodes=n, gbs=128 * n,
                               step_times=[s, s]))
            for n, s in ((1, 1.0), (2, 1.05), (4, 1.2))]
    report = build_report(runs, tokens=1e12)
    one, two, four = report.groups
    assert [g.num_nodes for g in report.groups] == [1, 2, 4] and [g.num_gpus for g in report.groups] == [8, 16, 32]
    assert one.tokens_per_s == pytest.approx(tokens(128, 1.0))
    assert two.linear_factor == pytest.approx(tokens(256, 1.05) / tokens(128, 1.0))  # 1.905
    assert four.linear_factor == pytest.approx(tokens(512, 1.2) / tokens(128, 1.0))  # 3.333
    assert (two.perfect_linear_factor, four.perfect_linear_factor) == (2, 4)
    assert four.perfect_linear_scale == pytest.approx(4 * tokens(128, 1.0))
    assert four.scaling_efficiency == pytest.approx(tokens(512, 1.2) / tokens(128, 1.0) / 4)
    assert four.tokens_per_s_per_gpu == pytest.approx(tokens(512, 1.2) / 32)
    assert four.days_to_train == pytest.approx(1e12 / tokens(512, 1.2) / 86400)
    flops = model_flops_per_sample(SMALL)
    assert four.mfu == pytest.approx(512 * flops / 1.2 / 32 / (H100 * 1e12))
    assert four.model_tflops_per_gpu == pytest.approx(512 * flops / 1.2 / 32 / 1e12)
    assert (one.runs, one.tokens_per_s_std) == (1, 0.0)


def test_repeats_give_mean_and_spread_shown_as_two_sigma(tmp_path):
    step_times = [1.0, 1.1, 0.95]
    runs = [load_run(write_run(tmp_path / f"r{i}" / "summary.json", label="slurm", step_times=[s]))
            for i, s in enumerate(step_times)]
    (group,) = build_report(runs).groups
    per_run = [tokens(128, s) for s in step_times]
    assert group.runs == 3
    assert group.tokens_per_s == pytest.approx(statistics.fmean(per_run))
    assert group.tokens_per_s_std == pytest.approx(statistics.stdev(per_run))
    text = render(build_report(runs), "table")
    assert f"{statistics.fmean(per_run):,.0f} ± {2 * statistics.stdev(per_run):,.0f}" in text


def test_comparison_against_a_baseline_and_its_sign(tmp_path):
    runs = [load_run(write_run(tmp_path / f"{label}{n}" / "summary.json", label=label, nodes=n, gbs=128 * n,
                               step_times=[s]))
            for label, n, s in (("bare-metal", 1, 1.0), ("bare-metal", 2, 1.0), ("kubernetes", 1, 1.04),
                                ("kubernetes", 2, 0.98))]
    report = build_report(runs, baseline="bare-metal")
    slower, faster = report.comparisons
    assert (slower.num_nodes, slower.baseline, slower.other) == (1, "bare-metal", "kubernetes")
    assert slower.diff_pct == pytest.approx(100 * (tokens(128, 1.0) - tokens(128, 1.04)) / tokens(128, 1.0))
    assert slower.diff_pct > 0 > faster.diff_pct  # positive: the other environment is slower
    text = render(report, "table")
    assert "positive when the other environment is slower" in text and f"{slower.diff_pct:+.2f}" in text
    data = json.loads(render(report, "json"))
    assert set(data) >= {"groups", "comparisons"}
    assert set(data["groups"][0]) >= {"label", "model", "num_nodes", "num_gpus", "runs", "tokens_per_s",
                                      "tokens_per_s_std", "linear_factor", "perfect_linear_factor",
                                      "perfect_linear_scale", "scaling_efficiency", "mfu", "days_to_train"}
    assert set(data["comparisons"][0]) >= {"model", "num_nodes", "baseline", "other", "diff_pct"}
    csv_text = render(report, "csv")
    assert csv_text.splitlines()[0].startswith("label,model,num_nodes,num_gpus,runs,tokens_per_s")

    assert "model,num_nodes,num_gpus,baseline,other" in csv_text
    assert render(report, "markdown").startswith("| label | model | nodes |")


def report_cli(*args, cwd=None):
    return nemo_throughput_cli(*args, cwd=cwd, timeout=120)


@pytest.mark.slow
def test_whitepaper_campaign_end_to_end(tmp_path):
    """Two environments x 1/2/4 nodes x two model sizes x two repeats, tables and plots."""
    slowdown = {"bare-metal": 1.0, "kubernetes": 1.03}
    for label, factor in slowdown.items():
        for model, spec, base in (("gpt3-126m", SMALL, 0.30), ("gpt3-1.3b", LARGE, 1.6)):
            for nodes in (1, 2, 4):
                for repeat in (1, 2):
                    step = base * factor * (1 + 0.04 * (nodes - 1)) * (1 + 0.01 * repeat)
                    write_run(tmp_path / "runs" / label / model / f"{nodes}n" / f"r{repeat}" / "summary.json",
                              label=label, model=model, spec=spec, nodes=nodes, gbs=64 * nodes, step_times=[step])
    plot = tmp_path / "scaling.png"
    result = report_cli("report", tmp_path / "runs", "--baseline", "bare-metal", "--format", "json", "--plot", plot,
                        "--tokens", "2e12")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert len(data["groups"]) == 2 * 2 * 3 and all(g["runs"] == 2 for g in data["groups"])
    assert len(data["comparisons"]) == 2 * 3
    assert all(c["diff_pct"] == pytest.approx(100 * (1 - 1 / 1.03)) for c in data["comparisons"])
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and plot.stat().st_size > 20_000
    table = report_cli("report", tmp_path / "runs", "--baseline", "bare-metal")
    assert table.returncode == 0 and "gpt3-1.3b" in table.stdout and "days for 1T tokens" in table.stdout


# ---------------------------------------------------------------------------------- bad input
def test_bad_inputs_name_the_file_and_the_problem(tmp_path):
    broken = tmp_path / "broken" / "summary.json"
    broken.parent.mkdir()
    broken.write_text("{not json")
    with pytest.raises(ReportError, match="broken/summary.json: not a readable JSON summary"):
        load_run(broken)
    old = tmp_path / "old" / "summary.json"
    old.parent.mkdir()
    old.write_text(json.dumps({"schema": "nemo-throughput/summary/v0"}))
    with pytest.raises(ReportError, match="old/summary.json: schema is 'nemo-throughput/summary/v0'"):
        load_run(old)
    failed = write_run(tmp_path / "failed" / "summary.json", label="x", step_times=[1.0], status="failed")
    with pytest.raises(ReportError, match="failed/summary.json: status 'failed': only completed runs"):
        load_run(failed)
    no_steps = write_run(tmp_path / "nosteps" / "summary.json", label="x", step_times=[1.0])
    with pytest.raises(ReportError, match="nosteps/summary.json: --window needs per-step times"):
        load_run(no_steps, Window.parse("35:45"))
    per_step = write_run(tmp_path / "ps" / "summary.json", label="x", step_times=[1.0] * 20, per_step=True)
    with pytest.raises(ReportError, match=r"ps/summary.json: --window 35:45 selects none of its steps \(it has "
                                          r"steps 1 to 20\)"):
        load_run(per_step, Window.parse("35:45"))
    with pytest.raises(ReportError, match="--window 'x:y'"):
        Window.parse("x:y")


def test_incompatible_runs_are_never_averaged_or_compared(tmp_path):
    a = load_run(write_run(tmp_path / "a" / "summary.json", label="slurm", gbs=128, step_times=[1.0]))
    b = load_run(write_run(tmp_path / "b" / "summary.json", label="slurm", gbs=256, step_times=[1.0]))
    with pytest.raises(ReportError, match=r"runs of slurm / gpt3-126m / 1 nodes differ in their set-up and cannot "
                                          r"be averaged:\n  .*a/summary.json: global batch 128.*\n  .*b/summary.json: "
                                          r"global batch 256"):
        build_report([a, b])
    c = load_run(write_run(tmp_path / "c" / "summary.json", label="kubernetes", gbs=256, step_times=[1.0]))
    with pytest.raises(ReportError, match="gpt3-126m at 1 nodes under 'slurm' and 'kubernetes' differ"):
        build_report([a, c], baseline="slurm")
    other_model = load_run(write_run(tmp_path / "d" / "summary.json", label="slurm", spec=LARGE, step_times=[1.0]))
    with pytest.raises(ReportError, match="FLOPs per sample"):  # same name, another shape
        build_report([a, other_model])
    with pytest.raises(ReportError, match=r"--baseline 'bare-metal' is not a label of these runs; their labels are "
                                          r"\['slurm'\]"):
        build_report([a], baseline="bare-metal")


def test_the_cli_reports_what_it_left_out(tmp_path):
    write_run(tmp_path / "ok" / "summary.json", label="slurm", step_times=[1.0])
    write_run(tmp_path / "failed" / "summary.json", label="slurm", step_times=[1.0], status="interrupted")
    result = report_cli("report", tmp_path)
    assert result.returncode == 0, result.stderr
    assert "excluded:" in result.stderr and "status 'interrupted'" in result.stderr
    missing = report_cli("report", tmp_path / "nothing")
    assert missing.returncode == 2 and "nothing: no such file or directory\n" in missing.stderr


def test_window_recomputes_from_per_step_times(tmp_path):
    times = [5.0] * 10 + [1.0] * 10 + [2.0] * 10  # steps 1-30
    path = write_run(tmp_path / "w" / "summary.json", label="x", step_times=times, per_step=True)
    assert load_run(path, Window.parse("11:21")).step_time_s == 1.0
    assert load_run(path, Window.parse("-10:")).step_time_s == 2.0
    assert load_run(path, Window.parse("last")).step_time_s == 2.0
    run = load_run(path, Window.parse("11:"))
    assert (run.step_time_s, run.steps_counted, run.window) == (1.5, 20, "11:")


def write_samples_run(path: Path, *, label: str, nodes: int = 1, gbs: int = 128, step_times: list[float]) -> Path:
    """A run rated in samples/s (a UNet: no sequence length), with FLOPs as given."""
    facts = RunFacts(name=path.parent.name, label=label, global_batch_size=gbs, micro_batch_size=1, seq_length=None,
                     rate="samples", model_name="unet-s", model_spec=None, flops_formula="user",
                     flops_per_sample=2e12, gpu_name="NVIDIA H100 80GB HBM3", num_gpus=8 * nodes, num_nodes=nodes,
                     dtype="bf16", peak_tflops=H100, peak_source="table:H100 SXM")
    stats = RunStats(world_size=1, warmup_steps=0)
    stats.add(steps_tensor([[StepTimes(i + 1, t) for i, t in enumerate(step_times)]]))
    write_json_atomic(path, build_summary(facts, stats, "completed"))
    return path


def test_runs_rated_in_samples_get_their_own_scaling_table_and_comparison(tmp_path, capsys):
    write_samples_run(tmp_path / "a1" / "summary.json", label="bare-metal", step_times=[1.0, 1.0])
    write_samples_run(tmp_path / "a4" / "summary.json", label="bare-metal", nodes=4, gbs=512, step_times=[1.2, 1.2])
    write_samples_run(tmp_path / "b1" / "summary.json", label="kubernetes", step_times=[1.25, 1.25])
    write_run(tmp_path / "gpt" / "summary.json", label="bare-metal", step_times=[1.0])
    assert main(["report", str(tmp_path), "--baseline", "bare-metal", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    unet = {(g["label"], g["num_nodes"]): g for g in data["groups"] if g["model"] == "unet-s"}
    one, four = unet[("bare-metal", 1)], unet[("bare-metal", 4)]
    assert (one["unit"], one["samples_per_s"], one["tokens_per_s"], one["days_to_train"]) == ("samples", 128.0,
                                                                                              None, None)
    assert four["samples_per_s_per_gpu"] == pytest.approx(512 / 1.2 / 32)
    assert four["linear_factor"] == pytest.approx((512 / 1.2) / 128) and four["perfect_linear_factor"] == 4
    assert four["mfu"] == pytest.approx(512 * 2e12 / 1.2 / 32 / (H100 * 1e12))  # from FLOPs per sample as before
    gpt = next(g for g in data["groups"] if g["model"] == "gpt3-126m")
    assert gpt["unit"] == "tokens" and gpt["tokens_per_s"] == pytest.approx(tokens(128, 1.0))
    (compared,) = data["comparisons"]
    assert (compared["unit"], compared["baseline_samples_per_s"], compared["other_samples_per_s"]) == (
        "samples", 128.0, 128 / 1.25)
    assert compared["diff_pct"] == pytest.approx(100 * (128 - 128 / 1.25) / 128)

    assert main(["report", str(tmp_path), "--baseline", "bare-metal"]) == 0
    text = capsys.readouterr().out
    assert "tokens/s (mean ± 2σ)" in text and "samples/s (mean ± 2σ)" in text
    assert "102.4 samples/s" in text  # the kubernetes run in the comparison, with its unit
    assert main(["report", str(tmp_path), "--format", "csv"]) == 0
    assert capsys.readouterr().out.splitlines()[0].endswith(",unit,samples_per_s,samples_per_s_std,"
                                                            "samples_per_s_per_gpu")
    plot = tmp_path / "scaling.png"
    assert main(["report", str(tmp_path), "--plot", str(plot)]) == 0 and plot.read_bytes()[:4] == b"\x89PNG"


def test_the_baseline_comparison_says_how_many_runs_each_side_averaged(tmp_path):
    """Three bare-metal repeats against one kubernetes run: a diff over one run is weaker evidence."""
    runs = [load_run(write_run(tmp_path / name / "summary.json", label=label, step_times=[s]))
            for name, label, s in (("b1", "bare-metal", 1.0), ("b2", "bare-metal", 1.01), ("b3", "bare-metal", 0.99),
                                   ("k1", "kubernetes", 1.04))]
    report = build_report(runs, baseline="bare-metal")
    header, _, row = render(report, "table").split("\n\n")[1].splitlines()
    assert header.split()[3:7] == ["baseline", "runs", "other", "runs"] and row.split()[3:7] == [
        "bare-metal", "3", "kubernetes", "1"]
    (compared,) = json.loads(render(report, "json"))["comparisons"]
    assert (compared["baseline_runs"], compared["other_runs"]) == (3, 1)
    comparisons = render(report, "csv").split("\n\n")[1].splitlines()
    assert comparisons[0].split(",")[5:7] == ["baseline_runs", "other_runs"] and comparisons[1].split(",")[5:7] == [
        "3", "1"]


# ------------------------------------------------------------------------- each summary read once
MLPERF_RESULTS = Path(__file__).parent / "data" / "mlperf" / "NVIDIA" / "eos_ngc24.04_nemo" / "llama2_70b_lora"


def count_reads_and_schema_checks(monkeypatch, summaries: list[Path]) -> tuple[dict[Path, int], list[int]]:
    """Per summary, how often anything in this process opens it (os.open, as summary.read_summary
    does, or open() / Path.open); and one entry per schema check of any summary. Real files, read
    for real: only counted on the way."""
    import builtins
    import io
    import os

    from nemo_throughput.report import runs as runs_module

    watched = {path.resolve(): path for path in summaries}
    opens = dict.fromkeys(summaries, 0)
    checks: list[int] = []

    def counted(opener):
        def wrapper(file, *args, **kwargs):
            if isinstance(file, (str, os.PathLike)) and Path(os.fsdecode(file)).resolve() in watched:
                opens[watched[Path(os.fsdecode(file)).resolve()]] += 1
            return opener(file, *args, **kwargs)
        return wrapper

    def validate(summary):
        checks.append(1)
        return real_validate(summary)

    real_validate = runs_module.validate_summary
    monkeypatch.setattr(os, "open", counted(os.open))
    monkeypatch.setattr(builtins, "open", counted(builtins.open))
    monkeypatch.setattr(io, "open", counted(io.open))
    monkeypatch.setattr(runs_module, "validate_summary", validate)
    return opens, checks


@pytest.mark.invalid_summaries  # one summary breaks the schema on purpose
def test_report_reads_and_schema_checks_each_summary_once(tmp_path, monkeypatch, capsys):
    """A throughput run, a resumed run's two segments (goodput sections: the goodput table's), an
    MLPerf time-to-train result and a summary that breaks the schema (left out of the runs and of
    goodput): each file is opened once, and checked against the schema once, for every table."""
    from test_report_segments import RESUMED, write_segments

    plain = write_run(tmp_path / "plain" / "summary.json", label="slurm", step_times=[1.0, 1.0])
    segments = write_segments(tmp_path / "resumed", RESUMED)
    assert main(["import", "--format", "mlperf", str(next(MLPERF_RESULTS.glob("result_*.txt"))), "--ruleset",
                 "4.0.0", "--output-dir", str(tmp_path / "mlperf")]) == 0
    (mlperf,) = (tmp_path / "mlperf").rglob("summary.json")
    broken = write_run(tmp_path / "broken" / "summary.json", label="slurm", step_times=[1.0, 1.0])
    summary = json.loads(broken.read_text())
    summary["run"]["started_at"] = 5  # the report's own checks pass it; the schema does not
    broken.write_text(json.dumps(summary))
    capsys.readouterr()
    summaries = [plain, *segments, mlperf, broken]
    opens, checks = count_reads_and_schema_checks(monkeypatch, summaries)

    assert main(["report", str(tmp_path), "--format", "json"]) == 1
    out, err = capsys.readouterr()
    assert f"excluded: {broken}: not a valid" in err and "excluded from goodput" not in err  # said once
    report = json.loads(out)
    assert len(report["groups"]) == 2 and len(report["time_to_train"]) == 1 and len(report["goodput"]) == 1
    assert opens == dict.fromkeys(summaries, 1)
    assert len(checks) == len(summaries)


def test_compare_reads_and_schema_checks_each_summary_once(tmp_path, monkeypatch, capsys):
    """compare takes a run and its summary's JSON (for its counted steps) from one read: a file
    rewritten between two reads could otherwise give a mix of two versions."""
    sides = [write_run(tmp_path / name / "summary.json", label="slurm", step_times=[1.0] * 5) for name in "ab"]
    opens, checks = count_reads_and_schema_checks(monkeypatch, sides)
    assert main(["compare", *map(str, sides)]) == 0, capsys.readouterr().err
    assert opens == dict.fromkeys(sides, 1) and len(checks) == len(sides)
