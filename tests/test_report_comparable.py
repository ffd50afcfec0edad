"""Runs that must not be averaged, compared or drawn on one scaling curve (report.comparable):
another set-up along a curve, one run counted twice, another MFU peak, another parallel layout.
Summaries are the package's own (RunFacts / RunStats / build_summary) or real logs imported."""

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from nemo_throughput.cli import main
from nemo_throughput.flops import ModelSpec, model_flops_per_sample
from nemo_throughput.hardware import resolve_peak
from nemo_throughput.report.grouping import build_report
from nemo_throughput.report.rendering import render
from nemo_throughput.report.runs import ReportError, load_run
from nemo_throughput.run_facts import RunFacts
from nemo_throughput.run_stats import RunStats, rank_rows
from nemo_throughput.summary import build_summary, write_json_atomic
from nemo_throughput.timing import StepTimes

H100, A100 = "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"
MIXTRAL_LOG = Path(__file__).parent / "data" / "import" / "megatron_lm_mixtral_issue756.log"
EVO2_LOG = MIXTRAL_LOG.with_name("nemo2_evo2_finetune_notebook.log")


def spec(seq: int = 2048) -> ModelSpec:
    return ModelSpec(num_layers=12, hidden_size=768, num_attention_heads=12, seq_length=seq, vocab_size=51200)


def write_run(path: Path, *, step_s: float, label: str = "bm", nodes: int = 1, gpus_per_node: int = 8,
              gbs: int = 128, seq: int = 2048, dtype: str = "bf16", gpu: str = H100, peak: float | None = None,
              parallel: dict | None = None) -> Path:
    """A completed run's summary, its peak from the GPU table unless `peak` is given."""
    peak_tflops, source = resolve_peak(peak, gpu, dtype)
    facts = RunFacts(name=path.parent.name, label=label, global_batch_size=gbs, micro_batch_size=1, seq_length=seq,
                     model_name="gpt3-126m", model_spec=spec(seq), flops_formula="megatron",
                     flops_per_sample=model_flops_per_sample(spec(seq)), gpu_name=gpu,
                     num_gpus=nodes * gpus_per_node, num_nodes=nodes, dtype=dtype, peak_tflops=peak_tflops,
                     peak_source=source)
    if parallel is not None:
        facts = replace(facts, parallel=parallel)
    stats = RunStats(world_size=1, warmup_steps=0)
    stats.add(rank_rows([[StepTimes(i + 1, step_s * (1 + 0.001 * (i % 3))) for i in range(12)]]))
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, build_summary(facts, stats, "completed"))
    return path


def cli(*args, capsys) -> tuple[int, str, str]:
    code = main([*map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def import_log(output: Path, label: str = "bm", **options) -> Path:
    arguments = {"--model": "mixtral-8x7b", "--seq-length": "4096", "--num-gpus": "16", "--gpu-name": H100,
                 "--dtype": "bf16", **options}
    assert main(["import", str(MIXTRAL_LOG), "--label", label, "--output-dir", str(output),
                 *[str(part) for pair in arguments.items() if pair[1] is not None for part in pair]]) == 0
    return output / MIXTRAL_LOG.stem / "summary.json"


# ------------------------------------------------------------------------------- one scaling curve
def test_a_scaling_curve_never_spans_another_set_up(tmp_path, capsys):
    """fp8 at 16 GPUs was 166.7 % efficient against bf16 at 8; a longer sequence and another GPU
    model were scaled as well. Each is n/a now, with a note naming the field; weak and strong
    scaling (another global batch) stay on the curve, per token."""
    rows = {"base": dict(nodes=1, step_s=1.0), "fp8": dict(nodes=2, gbs=256, step_s=0.6, dtype="fp8"),
            "seq": dict(nodes=4, gbs=256, seq=4096, step_s=1.1), "a100": dict(nodes=8, gbs=1024, step_s=2.0, gpu=A100),
            "strong": dict(nodes=16, gbs=128, step_s=0.08), "weak": dict(nodes=32, gbs=4096, step_s=1.25)}
    for name, row in rows.items():
        write_run(tmp_path / name / "summary.json", **row)
    code, out, err = cli("report", tmp_path, "--format", "json", capsys=capsys)
    assert code == 0, err
    groups = {g["num_gpus"]: g for g in json.loads(out)["groups"]}
    for gpus, field in ((16, "dtype fp8 against bf16"), (32, "sequence length 4096 against 2048"),
                        (64, f"GPU model {A100} against {H100}")):
        assert (groups[gpus]["linear_factor"], groups[gpus]["scaling_efficiency"]) == (None, None)
        assert f"at {gpus} GPUs" in err and field in err
    base = 128 * 2048 / groups[8]["step_time_s"]
    for gpus, gbs in ((128, 128), (256, 4096)):  # the hand computation: tokens/s over the first's, over the GPUs'
        tokens_per_s = gbs * 2048 / groups[gpus]["step_time_s"]
        assert groups[gpus]["linear_factor"] == pytest.approx(tokens_per_s / base)
        assert groups[gpus]["scaling_efficiency"] == pytest.approx(tokens_per_s / base / (gpus / 8))
    assert "at 128 GPUs" not in err and "at 256 GPUs" not in err
    code, out, _ = cli("report", tmp_path, capsys=capsys)
    fp8_row = next(line for line in out.splitlines() if line.split()[3] == "16")
    assert fp8_row.split()[8:12] == ["n/a"] * 4 and "%" in fp8_row  # the scaling columns; its own MFU is shown


def test_the_curve_starts_at_the_fewest_nodes_whatever_the_order_of_the_files(tmp_path):
    """Two configurations of the fewest GPUs (4 x 4 and 2 x 8): the curve starts at 2 x 8."""
    runs = [load_run(write_run(tmp_path / name / "summary.json", nodes=nodes, gpus_per_node=per_node, step_s=step_s,
                               gbs=gbs))
            for name, nodes, per_node, step_s, gbs in (("a4x4", 4, 4, 1.1, 128), ("b2x8", 2, 8, 1.0, 128),
                                                        ("c4x8", 4, 8, 1.05, 256))]
    for order in (runs, runs[::-1]):
        groups = {(g.num_nodes, g.num_gpus): g for g in build_report(order).groups}
        assert groups[(2, 16)].scaling_efficiency == pytest.approx(1.0)
        assert groups[(4, 16)].linear_factor == pytest.approx(1.0 / 1.1, rel=1e-3)


# ------------------------------------------------------------------------------- one run, once
def test_a_copy_of_a_summary_is_one_run_in_the_report(tmp_path, capsys):
    first = write_run(tmp_path / "runs" / "r1" / "summary.json", step_s=1.0)
    write_run(tmp_path / "runs" / "r2" / "summary.json", step_s=1.1)
    (tmp_path / "backup").mkdir()
    shutil.copy(first, tmp_path / "backup" / "summary.json")
    code, out, err = cli("report", tmp_path / "runs", tmp_path / "backup", "--format", "json", capsys=capsys)
    assert code == 0, err
    (group,) = json.loads(out)["groups"]
    assert group["runs"] == 2 and len(group["files"]) == 2
    assert f"{tmp_path / 'backup' / 'summary.json'} is the same run as {first} (run.id" in err


def test_a_real_log_imported_twice_is_one_run(tmp_path, capsys):
    """Each import gives the log a new run.id: the log and its steps say it is one run."""
    once, again = import_log(tmp_path / "once"), import_log(tmp_path / "again")
    capsys.readouterr()
    code, out, err = cli("report", once, again, "--format", "json", capsys=capsys)
    assert code == 0, err
    assert json.loads(out)["groups"][0]["runs"] == 1
    assert f"{again} is the same run as {once} (imported from {MIXTRAL_LOG}, the same steps): counted once" in err
    code, _, err = cli("compare", tmp_path, once, capsys=capsys)  # two "repeats" on one side
    assert code == 2 and "are the same run (imported from" in err


def _import_evo2(log: Path, output: Path) -> Path:
    assert main(["import", str(log), "--label", "bm", "--model", "gpt3-126m", "--seq-length", "2048", "--num-gpus",
                 "16", "--output-dir", str(output)]) == 0
    return output / log.stem / "summary.json"


def test_a_real_log_renamed_or_copied_while_the_job_ran_is_one_run(tmp_path, capsys):
    """The same log under another name, and a copy taken at step 49 (its steps the full log's first
    16): three 'repeats' of one run, spread and count wrong. The longest copy is the run."""
    real = EVO2_LOG.read_text()
    renamed, partial = tmp_path / "renamed.out", tmp_path / "partial.out"
    renamed.write_text(real)
    partial.write_text(real[:real.index("Epoch 0, global step 49")])
    summaries = [_import_evo2(log, tmp_path / name)
                 for log, name in ((partial, "p"), (EVO2_LOG, "o"), (renamed, "r"))]
    capsys.readouterr()
    code, out, err = cli("report", *summaries, "--format", "json", capsys=capsys)
    assert code == 0, err
    (group,) = json.loads(out)["groups"]
    assert group["runs"] == 1 and group["files"] == [str(summaries[1])]  # the full log's
    shown = "imported, its first 10 steps printed with the same times: one log, copied or renamed"
    assert f"{summaries[0]} is the same run as {summaries[1]} ({shown}): counted once, as {summaries[1]}" in err
    assert f"{summaries[2]} is the same run as {summaries[1]} ({shown})" in err


def test_short_logs_that_print_the_same_times_are_two_runs_unless_one_file(tmp_path, capsys):
    """Six printed steps of two runs can coincide: another path is another run, as before."""
    copy = tmp_path / "other_job.log"
    copy.write_text(MIXTRAL_LOG.read_text())
    first = import_log(tmp_path / "a")
    assert main(["import", str(copy), "--label", "bm", "--model", "mixtral-8x7b", "--seq-length", "4096",
                 "--num-gpus", "16", "--gpu-name", H100, "--dtype", "bf16", "--output-dir", str(tmp_path / "b")]) == 0
    capsys.readouterr()
    code, out, err = cli("report", first, tmp_path / "b" / "other_job" / "summary.json", "--format", "json",
                         capsys=capsys)
    assert code == 0, err
    assert json.loads(out)["groups"][0]["runs"] == 2 and "the same run" not in err


def test_one_log_imported_as_two_environments_is_refused(tmp_path, capsys):
    """A comparison of a run with itself (diff 0.00 %), one label's facts wrong: refused."""
    bare = import_log(tmp_path / "bare", label="bare-metal")
    k8s = import_log(tmp_path / "k8s", label="kubernetes")
    capsys.readouterr()
    code, _, err = cli("report", bare, k8s, "--baseline", "bare-metal", capsys=capsys)
    assert code == 2
    assert f"{bare} and {k8s} are the same run (imported from {MIXTRAL_LOG}, the same steps) but differ in label" in err
    with pytest.raises(ReportError, match="differ in label, GPUs, nodes"):
        build_report([load_run(bare), load_run(import_log(tmp_path / "k32", "kubernetes", **{"--num-gpus": "32"}))])


# ------------------------------------------------------------------------------- MFU's peak, the layout
def test_another_peak_is_never_averaged_nor_a_slowdown(tmp_path, capsys):
    """A peak given for some runs (import --peak-tflops, callback peak_tflops): MFU halves while
    tokens/s is the same. The report averaged 2.85 % and 1.42 %; compare said `slower`, exit 1."""
    for i in range(3):
        write_run(tmp_path / "table" / f"r{i}" / "summary.json", step_s=1.0 + 0.01 * i)
        write_run(tmp_path / "given" / f"r{i}" / "summary.json", step_s=1.0 + 0.01 * i, peak=1979.0)
    code, _, err = cli("report", tmp_path, capsys=capsys)
    assert code == 2 and "cannot be averaged" in err and "peak TFLOPS 1979" in err and "peak TFLOPS 989.5" in err
    code, _, err = cli("compare", tmp_path / "table", tmp_path / "given", capsys=capsys)
    assert code == 2 and "peak TFLOPS: 989.5 (baseline) vs 1979 (candidate)" in err
    code, out, _ = cli("compare", tmp_path / "table", tmp_path / "given", "--allow-different", "--format", "json",
                       capsys=capsys)
    assert {"field": "peak TFLOPS", "baseline": 989.5, "candidate": 1979.0} in json.loads(out)["differences"]
    write_run(tmp_path / "k8s" / "summary.json", label="k8s", step_s=1.02)  # tokens/s compared: no peak in it
    code, out, err = cli("report", tmp_path / "given", tmp_path / "k8s", "--baseline", "bm", capsys=capsys)
    assert code == 0, err


def test_repeats_of_other_parallel_layouts_are_not_averaged(tmp_path, capsys):
    tp2, tp4 = ({"data": 8 // t, "tensor": t, "pipeline": 1, "context": 1} for t in (2, 4))
    write_run(tmp_path / "tp2" / "summary.json", step_s=1.0, parallel=tp2)
    write_run(tmp_path / "tp4" / "summary.json", step_s=1.3, parallel=tp4)
    code, _, err = cli("report", tmp_path, capsys=capsys)
    assert code == 2 and "parallel layout" in err and '"tensor": 4' in err
    code, _, err = cli("compare", tmp_path, tmp_path / "tp2", capsys=capsys)
    assert code == 2 and "not repeats of one configuration (they differ in parallel layout)" in err
    code, _, err = cli("compare", tmp_path / "tp2", tmp_path / "tp4", capsys=capsys)  # a setting a candidate changes
    assert code != 2 and "parallel layout" not in err
    shutil.rmtree(tmp_path / "tp4")
    shape = {name: getattr(spec(), name) for name in ("num_layers", "hidden_size", "num_attention_heads",
                                                       "seq_length", "vocab_size")}
    unstated = import_log(tmp_path / "log", **{"--model": None, "--model-spec": json.dumps(shape),
                                                "--model-name": "gpt3-126m", "--seq-length": "2048", "--num-gpus": "8"})
    summary = json.loads(unstated.read_text())
    assert summary["parallel"] == {}  # an imported log states no layout: checked where stated
    assert build_report([load_run(tmp_path / "tp2" / "summary.json"), load_run(unstated)], group_by="label")
