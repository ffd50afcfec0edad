"""`import --format mlperf` and the report's time to train, on real MLPerf Training v4.0 result logs
(tests/data/mlperf, ORIGIN.md), checked against mlperf-logging's own parser and result_summarizer."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("mlperf_logging")

from mlperf_logging.compliance_checker.mlp_parser import parse_file  # noqa: E402
from mlperf_logging.result_summarizer import result_summarizer  # noqa: E402

from nemo_throughput.cli import main  # noqa: E402

DATA = Path(__file__).parent / "data" / "mlperf"
EOS_8 = DATA / "NVIDIA" / "eos_ngc24.04_nemo" / "llama2_70b_lora"
EOS_64 = DATA / "NVIDIA" / "eos_n8_ngc24.04_nemo" / "llama2_70b_lora"
ASUS = DATA / "ASUSTeK" / "ESC_N8A-E12" / "llama2_70b_lora"
GOOGLE = DATA / "Google" / "cloud-tpu-v5p-1024-maxtext" / "gpt3"
QUANTA = DATA / "Quanta_Cloud_Technology" / "D74H-7U" / "gnn"
SUBMISSIONS = (EOS_8, EOS_64, ASUS, GOOGLE, QUANTA)
RULESET = "4.0.0"  # the round of the fixtures


def run_import(capsys, *inputs, out: Path, extra=()) -> tuple[int, str]:
    code = main(["import", "--format", "mlperf", *map(str, inputs), "--output-dir", str(out), "--ruleset", RULESET,
                 *map(str, extra)])
    return code, capsys.readouterr().err


def summaries(out: Path) -> dict[str, dict]:
    return {p.parent.name: json.loads(p.read_text()) for p in sorted(out.rglob("summary.json"))}


def report_json(capsys, out: Path) -> dict:
    assert main(["report", str(out), "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def summarizer_score(folder: Path, benchmark: str) -> float | None:
    """result_summarizer's strong-scaling score of a submission folder (olympic average x scaling.json)."""
    score, _, _ = result_summarizer._compute_strong_score_standalone(
        benchmark, folder.parent.name, False, str(folder), "training", RULESET)
    return score


def keys_of(path: Path) -> dict:
    """What mlperf-logging's parser reads from the file: first value per key, and the run ends."""
    lines, failed = parse_file(str(path), ruleset=RULESET)
    assert not failed
    first = {}
    for line in lines:
        first.setdefault(line.key, line)
    return first


def test_import_reads_what_the_log_states(capsys, tmp_path):
    code, err = run_import(capsys, EOS_64 / "result_0.txt", out=tmp_path)
    assert code == 0, err
    (summary,) = summaries(tmp_path).values()
    keys = keys_of(EOS_64 / "result_0.txt")
    ttt = summary["time_to_train"]
    assert summary["run"]["source"] == "import:mlperf" and summary["run"]["label"] == "Eos_n8"  # SYSJSON system_name
    assert summary["hardware"]["num_nodes"] == 8 and summary["hardware"]["num_gpus"] == 64
    assert summary["hardware"]["gpu_name"] == "NVIDIA H100-SXM5-80GB"
    assert summary["batch"]["global_batch_size"] == keys["global_batch_size"].value["value"] == 8
    assert summary["model"]["name"] == ttt["benchmark"] == "llama2_70b_lora"
    assert ttt["run_start_ms"] == keys["run_start"].timestamp and ttt["run_stop_ms"] == keys["run_stop"].timestamp
    assert ttt["minutes"] == (ttt["run_stop_ms"] - ttt["run_start_ms"]) / 60 / 1000
    assert ttt["status"] == "success" and ttt["converged"] and ttt["compliant"] and ttt["compliance_errors"] == []
    assert ttt["ruleset"] == RULESET and ttt["required_runs"] == 10
    assert ttt["scaling_factor"] == json.loads((EOS_64 / "scaling.json").read_text())["scaling_factor"]
    lines, _ = parse_file(str(EOS_64 / "result_0.txt"), ruleset=RULESET)
    rates = [line.value["value"]["throughput"] for line in lines if line.key == "tracked_stats"]
    assert rates and summary["throughput"]["samples_per_s"] == pytest.approx(sum(rates) / len(rates))
    assert summary["throughput"]["tokens_per_s"] is None and summary["batch"]["seq_length"] is None  # never invented
    assert summary["throughput"]["primary"] == "samples_per_s" and summary["model"]["mfu_convention"]["formula"] is None
    assert summary["status"] == "completed"


def test_srun_rank_prefixes_read_the_same(capsys, tmp_path):
    prefixed = tmp_path / "srun" / "result_0.txt"
    prefixed.parent.mkdir()
    text = (EOS_8 / "result_0.txt").read_text(encoding="latin-1")
    prefixed.write_text("".join(f"0: {line}" for line in text.splitlines(keepends=True)), encoding="latin-1")
    code, err = run_import(capsys, EOS_8 / "result_0.txt", prefixed, out=tmp_path / "out")
    assert code == 0, err
    plain, srun = summaries(tmp_path / "out").values()
    assert srun["time_to_train"] == {**plain["time_to_train"], "scaling_factor": 1.0}  # no scaling.json beside it
    assert srun["hardware"]["num_gpus"] == plain["hardware"]["num_gpus"] == 8


def test_a_log_without_its_accelerators_needs_num_gpus(capsys, tmp_path):
    code, err = run_import(capsys, GOOGLE / "result_0.txt", out=tmp_path)
    assert code == 2 and "give --num-gpus" in err and not list(tmp_path.rglob("summary.json"))
    code, err = run_import(capsys, GOOGLE / "result_0.txt", out=tmp_path, extra=("--num-gpus", "1024"))
    assert code == 0, err
    (summary,) = summaries(tmp_path).values()
    assert summary["hardware"]["num_gpus"] == 1024 and "as given" in err
    assert summary["throughput"]["samples_per_s"] is None  # the log prints no throughput lines
    assert summary["run"]["label"] == "tpu-v5p"  # submission_platform


def test_a_run_without_run_stop_fails_the_compliance_check(capsys, tmp_path):
    cut = tmp_path / "cut" / "result_0.txt"
    cut.parent.mkdir()
    lines = (ASUS / "result_0.txt").read_text(encoding="latin-1").splitlines(keepends=True)
    cut.write_text("".join(line for line in lines if '"key": "run_stop"' not in line), encoding="latin-1")
    code, err = run_import(capsys, cut, out=tmp_path / "out", extra=("--num-gpus", "8"))
    assert code == 0, err
    (summary,) = summaries(tmp_path / "out").values()
    ttt = summary["time_to_train"]
    assert ttt["run_stop_ms"] is None and ttt["minutes"] is None and not ttt["compliant"]
    assert any("run_stop" in error for error in ttt["compliance_errors"])
    assert summary["status"] == "interrupted"
    assert "fails mlperf-logging's compliance check" in err


@pytest.mark.parametrize("folder", SUBMISSIONS, ids=lambda f: "/".join(f.parts[-3:]))
def test_olympic_score_agrees_with_result_summarizer(capsys, tmp_path, folder):
    code, err = run_import(capsys, folder, out=tmp_path, extra=("--num-gpus", "8"))
    assert code == 0, err
    (group,) = report_json(capsys, tmp_path)["time_to_train"]
    ours = group["time_to_train_minutes"]
    theirs = summarizer_score(folder, folder.name)
    assert theirs is not None and str(ours["olympic"]) == str(theirs)  # every printed digit
    assert ours["runs"] == ours["converged"] == ours["compliant"] == len(list(folder.glob("result_*.txt")))


def test_dropped_runs_count_as_result_summarizer_counts_them(capsys, tmp_path):
    submission = tmp_path / "ESC_N8A-E12" / "llama2_70b_lora"
    shutil.copytree(ASUS, submission)
    lines = (submission / "result_3.txt").read_text(encoding="latin-1").splitlines(keepends=True)
    (submission / "result_3.txt").write_text("".join(line for line in lines if '"key": "run_stop"' not in line),
                                             encoding="latin-1")
    code, err = run_import(capsys, submission, out=tmp_path / "one", extra=("--num-gpus", "8"))
    assert code == 0, err
    (group,) = report_json(capsys, tmp_path / "one")["time_to_train"]
    ours = group["time_to_train_minutes"]
    assert ours["dropped"] == 1 and ours["runs"] == 10 and ours["compliant"] == 9
    assert str(ours["olympic"]) == str(summarizer_score(submission, "llama2_70b_lora"))  # scaling.json applied too
    assert ours["scaling_factor"] == json.loads((ASUS / "scaling.json").read_text())["scaling_factor"]

    lines = (submission / "result_5.txt").read_text(encoding="latin-1").splitlines(keepends=True)
    (submission / "result_5.txt").write_text("".join(line for line in lines if '"key": "run_stop"' not in line),
                                             encoding="latin-1")
    code, err = run_import(capsys, submission, out=tmp_path / "two", extra=("--num-gpus", "8"))
    assert code == 0, err
    assert main(["report", str(tmp_path / "two"), "--format", "json"]) == 0
    captured = capsys.readouterr()
    (group,) = json.loads(captured.out)["time_to_train"]
    assert group["time_to_train_minutes"]["olympic"] is None and summarizer_score(submission, "llama2_70b_lora") is None
    assert "more than the 1 allowed" in captured.err


def test_fewer_runs_than_the_benchmark_needs_are_not_scored(capsys, tmp_path):
    code, err = run_import(capsys, *sorted(GOOGLE.glob("result_*.txt"))[:2], out=tmp_path, extra=("--num-gpus", "8"))
    assert code == 0, err
    assert main(["report", str(tmp_path), "--format", "json"]) == 0
    captured = capsys.readouterr()
    (group,) = json.loads(captured.out)["time_to_train"]
    minutes = sorted(s["time_to_train"]["minutes"] for s in summaries(tmp_path).values())
    assert group["time_to_train_minutes"]["olympic"] is None and "2 of the 3 runs gpt3 needs" in captured.err
    assert group["time_to_train_minutes"]["mean"] == pytest.approx(sum(minutes) / 2)
    assert group["time_to_train_minutes"]["two_sigma"] == pytest.approx(2 * abs(minutes[1] - minutes[0]) / 2 ** 0.5)


def test_speedup_and_scaling_efficiency_across_gpu_counts(capsys, tmp_path):
    code, err = run_import(capsys, EOS_8, EOS_64, out=tmp_path, extra=("--label", "eos"))
    assert code == 0, err
    small, large = report_json(capsys, tmp_path)["time_to_train"]
    assert (small["num_gpus"], large["num_gpus"]) == (8, 64)
    olympic_8 = summarizer_score(EOS_8, "llama2_70b_lora")
    olympic_64 = summarizer_score(EOS_64, "llama2_70b_lora")
    assert large["speedup_of"] == "olympic" and large["speedup"] == pytest.approx(olympic_8 / olympic_64)
    assert large["scaling_efficiency"] == pytest.approx(olympic_8 / olympic_64 / 8)
    assert small["speedup"] == 1.0

    assert main(["report", str(tmp_path)]) == 0
    table = capsys.readouterr().out
    assert "olympic min" in table and f"{olympic_64:.2f}" in table and f"{olympic_8 / olympic_64:.2f}x" in table


def test_a_real_aborted_run_is_dropped_as_result_summarizer_drops_it(capsys, tmp_path):
    resnet = DATA / "ASUSTeK" / "ESC8000A-E12-8xH100-PCIE-80GB" / "resnet"
    code, err = run_import(capsys, resnet, out=tmp_path, extra=("--num-gpus", "8"))
    assert code == 0, err
    aborted = summaries(tmp_path)["result_3"]
    assert aborted["time_to_train"]["status"] == "aborted" and not aborted["time_to_train"]["converged"]
    assert not aborted["time_to_train"]["compliant"] and aborted["status"] == "failed"
    (group,) = report_json(capsys, tmp_path)["time_to_train"]
    ours = group["time_to_train_minutes"]
    assert (ours["runs"], ours["converged"], ours["dropped"]) == (5, 4, 1)
    assert str(ours["olympic"]) == str(summarizer_score(resnet, "resnet"))


def test_inputs_that_are_not_mlperf_results_are_refused(capsys, tmp_path):
    other = Path(__file__).parent / "data" / "import" / "nemo2_esm2_srun_label.out"
    code, err = run_import(capsys, other, out=tmp_path / "a")
    assert code == 2 and "no `:::MLLOG` lines" in err
    code, err = run_import(capsys, tmp_path, out=tmp_path / "b")
    assert code == 2 and "no MLPerf result files" in err
    code, err = run_import(capsys, EOS_8 / "result_0.txt", out=tmp_path / "c", extra=("--seq-length", "2048"))
    assert code == 2 and "--seq-length do(es) not apply to --format mlperf" in err
    broken = tmp_path / "result_0.txt"
    broken.write_text(':::MLLOG {"key": "run_start", "value": null, "metadata": {}}\n')  # no time_ms
    code, err = run_import(capsys, broken, out=tmp_path / "d", extra=("--num-gpus", "8"))
    assert code == 2 and "could not read it as an MLPerf result file (KeyError: 'time_ms')" in err
    assert not list(tmp_path.rglob("summary.json"))


def test_throughput_and_time_to_train_runs_report_together(capsys, tmp_path):
    from test_report import write_run

    write_run(tmp_path / "gpt" / "summary.json", label="bare-metal", step_times=[1.0, 1.0])
    code, err = run_import(capsys, GOOGLE, out=tmp_path / "mlperf", extra=("--num-gpus", "8"))
    assert code == 0, err
    data = report_json(capsys, tmp_path)
    assert [g["label"] for g in data["groups"]] == ["bare-metal"] and data["groups"][0]["tokens_per_s"] > 0
    assert [g["benchmark"] for g in data["time_to_train"]] == ["gpt3"]
    assert main(["report", str(tmp_path), "--format", "csv"]) == 0
    csv_text = capsys.readouterr().out
    assert "bare-metal" in csv_text and "olympic_min" in csv_text and "gpt3" in csv_text


def test_without_a_ruleset_the_round_checked_against_is_said_to_be_a_guess(tmp_path, capsys):
    code = main(["import", "--format", "mlperf", str(EOS_64 / "result_0.txt"), "--output-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 0 and "the log does not name its MLPerf round: checked against ruleset" in err
    ttt = summaries(tmp_path)["result_0"]["time_to_train"]
    assert ttt["ruleset_given"] is False and ttt["ruleset"] in err
    run_import(capsys, EOS_64 / "result_0.txt", out=tmp_path / "given")
    assert summaries(tmp_path / "given")["result_0"]["time_to_train"]["ruleset_given"] is True
