"""`import --format mlperf` and the report's time to train, on real MLPerf Training v4.0 and v5.0
result logs and submissions (tests/data/mlperf, ORIGIN.md), checked against mlperf-logging's own
parser and result_summarizer."""

from __future__ import annotations

import hashlib
import json
import os
import re
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
STATE_THEIR_GPUS = (EOS_8, EOS_64)  # the others need --num-gpus
RULESET = "4.0.0"  # the round of the fixtures
V5 = DATA / "v5.0"  # whole submitters' folders: results/<system>/<benchmark>/ beside systems/<system>.json
HPE = V5 / "HPE"
HPE_N2, HPE_N4 = (HPE / "results" / f"HPE-Cray-XD670-H200-SXM5-141GB_n{n}_24.09" for n in (2, 4))
SUPERMICRO_DLRM = V5 / "Supermicro" / "results" / "SYS-821GE-TNHR" / "dlrm_dcnv2"
GOOGLE_V5 = V5 / "Google"  # TPU logs state no counts (and a platform of "tpu-trillium"): only systems/ does
RULESET_V5 = "5.0.0"
V20, V30, V31 = DATA / "v2.0", DATA / "v3.0", DATA / "v3.1"  # whole benchmark folders of older rounds (ORIGIN.md)
V41, V51 = DATA / "v4.1", DATA / "v5.1"  # single runs of v4.1 and v5.1 submissions, in the repository's layout
EOS_GPT3 = V41 / "NVIDIA" / "results" / "eos_n64_ngc24.09_nemo" / "gpt3"  # NVIDIA's gpt3: throughput in tokens/s
AMD_LLAMA8B = V51 / "AMD" / "results" / "MI355X_EPYC_9575F_pytorch" / "llama31_8b"  # states max_sequence_length
THEIA_8 = V51 / "NVIDIA" / "results" / "theia_ngpu8_ngc25.09_nemo" / "llama2_70b_lora"  # 2 x 4 GB300, "2xNVIDIA GB200"
LAMBDA_72 = V51 / "Lambda" / "results" / "gb300_n18_ngc25.04_nemo" / "llama2_70b_lora"  # placeholders in the log
AZURE_512 = V41 / "Azure" / "results" / "ND_H200_v5_n64_nemo" / "llama2_70b_lora"  # 64 x 8 H200, "64xND_H200_v5"


def run_import(capsys, *inputs, out: Path, extra=(), ruleset=RULESET) -> tuple[int, str]:
    code = main(["import", "--format", "mlperf", *map(str, inputs), "--output-dir", str(out), "--ruleset", ruleset,
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
    assert srun["time_to_train"] == {**plain["time_to_train"], "scaling_factor": 1.0,  # no scaling.json beside it
                                     "sha256": srun["time_to_train"]["sha256"],  # other bytes
                                     "system": {**plain["time_to_train"]["system"], "directory": None}}
    assert plain["time_to_train"]["system"]["directory"] == "eos_ngc24.04_nemo"  # folder srun/: not <benchmark>/
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
    extra = () if folder in STATE_THEIR_GPUS else ("--num-gpus", "8")
    code, err = run_import(capsys, folder, out=tmp_path, extra=extra)
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
    assert code == 0 and "the logs do not name their MLPerf round: each was checked against the newest ruleset" in err
    ttt = summaries(tmp_path)["result_0"]["time_to_train"]
    assert ttt["ruleset_given"] is False and f"({ttt['ruleset']} for 1 file(s))" in err
    run_import(capsys, EOS_64 / "result_0.txt", out=tmp_path / "given")
    assert summaries(tmp_path / "given")["result_0"]["time_to_train"]["ruleset_given"] is True


def summarizer_rows(submitter: Path, ruleset: str, workdir: Path) -> list[dict]:
    """result_summarizer's strong-scaling table of a submitter folder, one row per system, as the
    `python -m mlperf_logging.result_summarizer FOLDER training RULESET` command prints it. It writes:
    a summary.json into the working directory, and a scaling.json of its RCP check into a closed
    benchmark's folder that has none (v3.0 Intel-HabanaLabs gpt3): both into `workdir`, on a copy."""
    cwd = os.getcwd()
    workdir.mkdir()
    copy = shutil.copytree(submitter, workdir / submitter.name)
    os.chdir(workdir)
    try:
        table, *_ = result_summarizer.summarize_results(str(copy), "training", ruleset)
    finally:
        os.chdir(cwd)
    return table.to_dict("records")


# Whole submissions of several rounds, accelerators and systems files (ORIGIN.md): (submitter folder, round's ruleset)
WHOLE_SUBMISSIONS = ((HPE, RULESET_V5), (GOOGLE_V5, RULESET_V5), (V5 / "Supermicro", RULESET_V5),
                     (V20 / "MosaicML", "2.0.0"), (V20 / "Google", "2.0.0"), (V30 / "Intel-HabanaLabs", "3.0.0"),
                     (V31 / "Google", "3.1.0"))


@pytest.mark.parametrize(("submitter", "ruleset"), WHOLE_SUBMISSIONS,
                         ids=lambda f: "/".join(f.parts[-2:]) if isinstance(f, Path) else f)
def test_a_whole_submission_imports_with_the_counts_of_its_systems_files(capsys, tmp_path, submitter, ruleset):
    code, err = run_import(capsys, submitter, out=tmp_path, ruleset=ruleset)
    assert code == 0, err
    imported = summaries(tmp_path)
    assert len(imported) == len(list(submitter.glob("results/*/*/result_*.txt")))
    groups = report_json(capsys, tmp_path)["time_to_train"]
    ours = {(g["benchmark"], g["num_nodes"], g["num_gpus"], g["label"]): g["time_to_train_minutes"]["olympic"]
            for g in groups}
    benchmarks = {folder.name for folder in submitter.glob("results/*/*")}
    theirs = {(benchmark, int(row["number_of_nodes"]), row["accelerators_count"], row["system"]): row[benchmark]
              for row in summarizer_rows(submitter, ruleset, tmp_path / "summarizer") for benchmark in benchmarks
              if row[benchmark] == row[benchmark]}  # NaN: the system did not submit the benchmark
    assert {key: str(score) for key, score in ours.items()} == {key: str(score) for key, score in theirs.items()}
    for summary in imported.values():  # every count from systems/<system>.json, and said so
        ttt = summary["time_to_train"]
        described = json.loads(Path(ttt["system_file"]).read_text())
        assert ttt["counts_from"] == "systems/" + Path(ttt["system_file"]).name
        assert summary["hardware"]["gpu_name"] == described["accelerator_model_name"]
        assert summary["run"]["label"] == described["system_name"]
        assert ttt["system"] == {"directory": Path(ttt["system_file"]).stem, "name": described["system_name"],
                                 "accelerator": described["accelerator_model_name"],
                                 "submitter": described["submitter"]}
        result_file = Path(summary["environment"]["imported_from"])
        assert result_file.parent.parent.name == ttt["system"]["directory"]
        assert ttt["sha256"] == hashlib.sha256(result_file.read_bytes()).hexdigest()


def test_a_log_that_disagrees_with_its_systems_file_is_counted_as_the_systems_file_says(capsys, tmp_path):
    # the real v5.0 logs of HPE's 2- and 4-node systems state number_of_nodes "1" in :::SYSJSON
    code, err = run_import(capsys, HPE_N2 / "dlrm_dcnv2", HPE_N4 / "dlrm_dcnv2", out=tmp_path, ruleset=RULESET_V5)
    assert code == 0, err
    for summary in summaries(tmp_path).values():
        nodes = 2 if "_n2_" in summary["environment"]["imported_from"] else 4
        assert summary["environment"]["system"]["number_of_nodes"] == "1"  # what the log says, kept as said
        assert (summary["hardware"]["num_nodes"], summary["hardware"]["num_gpus"]) == (nodes, nodes * 8)
        (note,) = summary["time_to_train"]["notes"]
        assert note.startswith(f"the log states 1 node(s) x 8 accelerators, systems/HPE-Cray-XD670-H200-SXM5-141GB"
                               f"_n{nodes}_24.09.json {nodes} x 8")
    assert err.count("the log states 1 node(s) x 8 accelerators") == 20
    groups = report_json(capsys, tmp_path)["time_to_train"]
    assert sorted((g["num_nodes"], g["time_to_train_minutes"]["runs"]) for g in groups) == [(2, 10), (4, 10)]


def test_the_valid_sysjson_line_is_read_past_the_xtrace_of_its_echo(capsys, tmp_path):
    alone = tmp_path / "alone" / "result_01.txt"  # outside a submission's layout: only the log can say
    alone.parent.mkdir()
    shutil.copyfile(SUPERMICRO_DLRM / "result_01.txt", alone)
    lines = alone.read_text(encoding="latin-1").splitlines()
    assert lines[1].startswith("+ echo ':::SYSJSON {") and lines[2].startswith(":::SYSJSON {")
    code, err = run_import(capsys, alone, out=tmp_path / "out", ruleset=RULESET_V5)
    assert code == 0, err
    (summary,) = summaries(tmp_path / "out").values()
    assert summary["environment"]["system"] == json.loads(lines[2].removeprefix(":::SYSJSON "))
    assert summary["hardware"]["num_gpus"] == 8 and summary["time_to_train"]["counts_from"] == "log"
    assert summary["run"]["label"] == "SYS-821GE-TNHR"  # :::SYSJSON system_name, not the placeholder platform
    assert summary["time_to_train"]["platform"] == "1xSUBMISSION_PLATFORM_PLACEHOLDER"


def test_usage_text_and_a_placeholder_platform_state_nothing(capsys, tmp_path):
    alone = tmp_path / "alone" / "result_1.txt"
    alone.parent.mkdir()
    shutil.copyfile(HPE_N2 / "llama2_70b_lora" / "result_1.txt", alone)
    text = alone.read_text(encoding="latin-1")
    assert ":::SYSJSON \nusage: mlperf-sysjson.sh" in text and '"2xSUBMISSION_PLATFORM_PLACEHOLDER"' in text
    code, err = run_import(capsys, alone, out=tmp_path / "a", ruleset=RULESET_V5)
    assert code == 2 and "the log does not state its accelerators" in err and "give --num-gpus" in err
    code, err = run_import(capsys, alone, out=tmp_path / "b", ruleset=RULESET_V5, extra=("--num-gpus", "16"))
    assert code == 0, err
    (summary,) = summaries(tmp_path / "b").values()
    assert summary["run"]["label"] == "unknown" and summary["environment"]["system"] is None
    # in its submission, the systems file names and counts it
    code, err = run_import(capsys, HPE_N2 / "llama2_70b_lora", out=tmp_path / "c", ruleset=RULESET_V5)
    assert code == 0, err
    labels = {s["run"]["label"] for s in summaries(tmp_path / "c").values()}
    assert labels == {"HPE Cray XD670 (8x H200-SXM-141GB)"}


def test_num_gpus_that_contradicts_the_files_is_an_error_naming_both(capsys, tmp_path):
    code, err = run_import(capsys, HPE_N4 / "dlrm_dcnv2", out=tmp_path / "a", ruleset=RULESET_V5,
                           extra=("--num-gpus", "8"))
    assert code == 2 and "--num-gpus 8 contradicts systems/HPE-Cray-XD670-H200-SXM5-141GB_n4_24.09.json" in err
    assert "32 accelerators" in err and len(err.splitlines()) == 1
    code, err = run_import(capsys, EOS_64 / "result_0.txt", out=tmp_path / "b", extra=("--num-gpus", "8"))
    assert code == 2 and "--num-gpus 8 contradicts log: 8 node(s), 64 accelerators" in err
    assert not list(tmp_path.rglob("summary.json"))
    code, err = run_import(capsys, EOS_64 / "result_0.txt", out=tmp_path / "c", extra=("--num-gpus", "64"))
    assert code == 0, err


def test_the_round_note_is_said_once_and_every_warning_in_one_format(capsys, tmp_path):
    cut = tmp_path / "cut" / "result_0.txt"
    cut.parent.mkdir()
    lines = (EOS_8 / "result_0.txt").read_text(encoding="latin-1").splitlines(keepends=True)
    cut.write_text("".join(line for line in lines if '"key": "run_stop"' not in line), encoding="latin-1")
    code = main(["import", "--format", "mlperf", str(EOS_8), str(cut), "--output-dir", str(tmp_path / "a")])
    err = capsys.readouterr().err
    assert code == 0, err
    assert err.count("MLPerf round") == 1 and len(summaries(tmp_path / "a")) == 11
    code = main(["import", "--format", "mlperf", str(HPE_N4 / "dlrm_dcnv2"), str(cut), "--output-dir",
                 str(tmp_path / "b")])
    err = capsys.readouterr().err
    assert code == 0, err
    assert err.count("the log states 1 node(s)") == 10 and "no run_stop line" in err and "compliance check" in err
    # one format for every warning: `nemo-throughput import: [<input>: ]warning: <message>`
    assert all(re.match(r"nemo-throughput import: (\S+: )?warning: ", line) for line in err.splitlines()), err


def _edited(source: Path, target: Path, edit) -> Path:
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(edit(source.read_text(encoding="latin-1")), encoding="latin-1")
    return target


def test_results_without_a_time_to_train_are_never_converged_runs(capsys, tmp_path):
    source = EOS_8 / "result_0.txt"
    system = tmp_path / EOS_8.parent.name / EOS_8.name  # the same system: <system>/<benchmark>/
    start, stop = keys_of(source)["run_start"].timestamp, keys_of(source)["run_stop"].timestamp
    no_start = _edited(source, system / "result_no_start.txt",
                       lambda text: "".join(line for line in text.splitlines(keepends=True)
                                            if '"key": "run_start"' not in line))
    end = '"event_type": "INTERVAL_END", "key": "run_stop"'
    before_start = f'"time_ms": {start - 1000:.0f}, {end}'
    backwards = _edited(source, system / "result_backwards.txt",
                        lambda text: text.replace(f'"time_ms": {stop:.0f}, {end}', before_start))
    assert "run_stop" in keys_of(backwards) and keys_of(backwards)["run_stop"].timestamp < start
    shutil.copyfile(EOS_8 / "result_1.txt", system / "result_1.txt")
    code, err = run_import(capsys, system, out=tmp_path / "out")
    assert code == 0, err
    imported = summaries(tmp_path / "out")
    for name, problem in (("result_no_start", "no run_start line"), ("result_backwards", "is before run_start")):
        ttt = imported[name]["time_to_train"]
        assert ttt["status"] == "success" and not ttt["converged"] and ttt["minutes"] is None, name
        assert imported[name]["status"] == "failed" and problem in imported[name]["error"]
        assert any(problem in note for note in ttt["notes"]) and problem in err
    (group,) = report_json(capsys, tmp_path / "out")["time_to_train"]
    assert (group["time_to_train_minutes"]["runs"], group["time_to_train_minutes"]["converged"]) == (3, 1)


def test_a_system_without_accelerators_or_a_broken_systems_file_is_refused(capsys, tmp_path):
    submission = tmp_path / "HPE"
    shutil.copytree(HPE / "systems", submission / "systems")
    shutil.copytree(HPE_N4 / "dlrm_dcnv2", submission / "results" / HPE_N4.name / "dlrm_dcnv2")
    described = submission / "systems" / f"{HPE_N4.name}.json"
    original = described.read_text()
    described.write_text(original.replace('"accelerators_per_node": "8"', '"accelerators_per_node": "0"'))
    code, err = run_import(capsys, submission, out=tmp_path / "a", ruleset=RULESET_V5)
    assert code == 2 and "accelerators_per_node is 0" in err and described.name in err
    described.write_text(original.replace('"number_of_nodes": "4"', '"number_of_nodes": "4 (32 GPUs)"'))
    code, err = run_import(capsys, submission, out=tmp_path / "a", ruleset=RULESET_V5)
    assert code == 2 and "number_of_nodes '4 (32 GPUs)' is not a whole number" in err
    described.write_text(original[: len(original) // 2])
    code, err = run_import(capsys, submission, out=tmp_path / "b", ruleset=RULESET_V5)
    assert code == 2 and "not a readable JSON system description" in err and len(err.splitlines()) == 1
    assert not list(tmp_path.rglob("summary.json"))
    described.unlink()  # result_summarizer skips the system; here the log counts, said per file
    code, err = run_import(capsys, submission, out=tmp_path / "missing", ruleset=RULESET_V5)
    assert code == 0 and err.count(f"no systems/{described.name} in the submission") == 10
    assert {s["hardware"]["num_gpus"] for s in summaries(tmp_path / "missing").values()} == {8}
    shutil.rmtree(tmp_path / "missing")
    zero = _edited(EOS_8 / "result_0.txt", tmp_path / "zero" / "result_0.txt",
                   lambda text: text.replace('"accelerators_per_node":"8"', '"accelerators_per_node":"0"'))
    assert '"accelerators_per_node":"0"' in zero.read_text(encoding="latin-1")
    code, err = run_import(capsys, zero, out=tmp_path / "c", extra=("--num-gpus", "8"))
    assert code == 2 and "the log states accelerators_per_node 0" in err


def test_file_names_in_messages_are_printable(capsys, tmp_path):
    hostile = tmp_path / "\x1b[2Jcleared\nresults"
    hostile.mkdir()
    code, err = run_import(capsys, hostile, out=tmp_path / "out")
    assert code == 2 and "no MLPerf result files" in err and "\x1b" not in err and len(err.splitlines()) == 1
    shutil.copyfile(EOS_8 / "result_0.txt", hostile / "result_0.txt")
    (hostile / "scaling.json").write_text("{}")
    code, err = run_import(capsys, hostile, out=tmp_path / "out")
    assert code == 2 and "not a scaling.json" in err and "\x1b" not in err and len(err.splitlines()) == 1


def test_runs_of_one_label_on_different_node_counts_are_never_one_group(capsys, tmp_path):
    """16 GPUs as 2 nodes of 8 and as 4 nodes of 4 are two systems, even under one label (Google's logs
    name no nodes: its platform is "tpu-v5p")."""
    for gpus_per_node in (8, 4):
        code, err = run_import(capsys, GOOGLE, out=tmp_path / f"per-node-{gpus_per_node}",
                               extra=("--num-gpus", 16, "--gpus-per-node", gpus_per_node, "--label", "same"))
        assert code == 0, err
    assert main(["report", str(tmp_path), "--format", "json"]) == 0
    captured = capsys.readouterr()
    groups = json.loads(captured.out)["time_to_train"]
    assert sorted((g["num_nodes"], g["num_gpus"], g["time_to_train_minutes"]["runs"]) for g in groups) == [
        (2, 16, 3), (4, 16, 3)]
    # the same files, imported twice as two sizes: said of each group
    assert ("note: gpt3 on same, cloud-tpu-v5p-1024-maxtext (2 node(s), 16 accelerators): 3 of its result files "
            f"(e.g. {GOOGLE / 'result_0.txt'}) have the bytes of result files reported under same on "
            "cloud-tpu-v5p-1024-maxtext (4 node(s), 16 accelerators): the same runs, imported as two systems or "
            "sizes") \
        in captured.err


def test_the_speedup_baseline_is_the_fewest_nodes_of_one_system_family():
    from nemo_throughput.report.time_to_train import TrainGroup, _add_speedup

    def group(system, nodes, gpus, minutes, accelerator="NVIDIA H100-SXM5-80GB", submitter="NVIDIA"):
        return TrainGroup("llama2_70b_lora", "eos", system, nodes, gpus, {"olympic": minutes, "mean": minutes},
                          submitter=submitter, accelerator=accelerator)

    four_by_four, two_by_eight = group("a", 4, 16, 30.0), group("b", 2, 16, 20.0)
    eight_by_eight = group("c", 8, 64, 5.0)
    h200, unstated = group("d", 1, 8, 10.0, accelerator="NVIDIA H200-SXM5-141GB"), group("e", 1, 8, 1.0, submitter=None)
    _add_speedup([four_by_four, eight_by_eight, h200, unstated, two_by_eight])  # in any order
    assert two_by_eight.speedup == 1.0 and eight_by_eight.speedup == 4.0 and eight_by_eight.scaling_efficiency == 1.0
    assert eight_by_eight.speedup_over == two_by_eight.speedup_over == "b (2 node(s), 16 GPUs)"
    assert "speedup over b (2 node(s), 16 GPUs): one system family (submitter NVIDIA, NVIDIA H100-SXM5-80GB, 8 GPUs " \
           "per node, label eos)" in eight_by_eight.notes
    # 4 GPUs per node, another accelerator, an unstated submitter: each its own family, compared with itself only
    for alone in (four_by_four, h200, unstated):
        assert alone.speedup == 1.0 and alone.speedup_over == alone.shown and alone.scaling_efficiency == 1.0
    assert "not compared with a (4 node(s), 16 GPUs): another number of GPUs per node (4)" in two_by_eight.notes
    assert "not compared with d (1 node(s), 8 GPUs): another accelerator (NVIDIA H200-SXM5-141GB)" in \
        two_by_eight.notes
    assert "not compared with b (2 node(s), 16 GPUs): a submitter or an accelerator is not stated, so no system " \
           "family is known" in unstated.notes

    family = [group("b", 2, 16, 20.0), group("b2", 2, 16, 25.0), group("c", 8, 64, 5.0)]  # two at the smallest size
    _add_speedup(family)
    for member in family:  # either could be the baseline: none is chosen
        assert member.speedup is member.speedup_over is member.scaling_efficiency is None
        assert any(note.startswith("no speedup: b (2 node(s), 16 GPUs) and b2 (2 node(s), 16 GPUs) are both the "
                                   "smallest size of one system family") for note in member.notes)


IMPLAUSIBLE = ('"eight"', '"8.0"',  # "8.0" as text: result_summarizer's int() refuses it too
               '"\\u00b2"', '"\\u0663"', str(10 ** 30), f'"{10 ** 30}"', "-1", '"-1"', "true", "8.5", '""')


@pytest.mark.parametrize("value", IMPLAUSIBLE)
def test_a_systems_file_count_that_is_not_plausible_is_refused_naming_the_file_and_key(capsys, tmp_path, value):
    submission = tmp_path / "HPE"
    shutil.copytree(HPE / "systems", submission / "systems")
    shutil.copytree(HPE_N4 / "dlrm_dcnv2", submission / "results" / HPE_N4.name / "dlrm_dcnv2")
    described = submission / "systems" / f"{HPE_N4.name}.json"
    original = described.read_text()
    for key, stated in (("number_of_nodes", '"4"'), ("accelerators_per_node", '"8"')):
        described.write_text(original.replace(f'"{key}": {stated}', f'"{key}": {value}'))
        assert json.loads(described.read_text())[key] != json.loads(original)[key]
        code, err = run_import(capsys, submission, out=tmp_path / "out", ruleset=RULESET_V5)
        assert code == 2 and f"{described.name}: {key} " in err and len(err.splitlines()) == 1, err
        assert "not a whole number" in err or "not a plausible count" in err or "not a count" in err
        assert not list(tmp_path.rglob("summary.json"))


def test_counts_whose_product_is_not_plausible_are_never_taken(capsys, tmp_path):
    submission = tmp_path / "HPE"
    shutil.copytree(HPE / "systems", submission / "systems")
    shutil.copytree(HPE_N4 / "dlrm_dcnv2", submission / "results" / HPE_N4.name / "dlrm_dcnv2")
    described = submission / "systems" / f"{HPE_N4.name}.json"
    described.write_text(described.read_text().replace('"number_of_nodes": "4"', '"number_of_nodes": "1000000"'))
    code, err = run_import(capsys, submission, out=tmp_path / "a", ruleset=RULESET_V5)
    assert code == 2 and f"{described.name}: number_of_nodes 1000000 x accelerators_per_node 8 is more than " \
                         "1,000,000 accelerators" in err and len(err.splitlines()) == 1
    log = _edited(EOS_8 / "result_0.txt", tmp_path / "log" / "result_0.txt",
                  lambda text: text.replace('"number_of_nodes":"1"', '"number_of_nodes":"1000000"'))
    code, err = run_import(capsys, log, out=tmp_path / "b")
    assert code == 2 and "1000000 nodes x 8 accelerators per node is more than 1,000,000 accelerators" in err
    assert not list(tmp_path.rglob("summary.json"))


def test_a_sysjson_count_that_is_not_plausible_is_never_taken(capsys, tmp_path):
    def with_count(key, value, name):
        return _edited(EOS_8 / "result_0.txt", tmp_path / name / "result_0.txt",
                       lambda text: text.replace(f'"{key}":"{1 if key == "number_of_nodes" else 8}"',
                                                 f'"{key}":{value}'))

    for name, value in (("word", '"eight"'), ("superscript", '"\u00b2"'), ("huge", str(10 ** 30)), ("zero", '"0"')):
        nodes = with_count("number_of_nodes", value, f"nodes-{name}")
        code, err = run_import(capsys, nodes, out=tmp_path / f"out-nodes-{name}")
        assert code == 0, err  # the platform, 1xNVIDIA DGX H100, still counts the nodes
        (summary,) = summaries(tmp_path / f"out-nodes-{name}").values()
        assert (summary["hardware"]["num_nodes"], summary["hardware"]["num_gpus"]) == (1, 8)
        (note,) = summary["time_to_train"]["notes"]
        assert note.startswith(":::SYSJSON number_of_nodes ") and note.endswith(": not taken")
        assert f"{nodes}: warning: :::SYSJSON number_of_nodes" in err

        per_node = with_count("accelerators_per_node", value, f"per-node-{name}")
        code, err = run_import(capsys, per_node, out=tmp_path / f"out-per-node-{name}")
        assert code == 2 and str(per_node) in err and len(err.splitlines()) == 1, err
        assert (":::SYSJSON accelerators_per_node" if name != "zero" else "accelerators_per_node 0") in err
    huge = tmp_path / "per-node-huge" / "result_0.txt"
    code, err = run_import(capsys, huge, out=tmp_path / "given", extra=("--num-gpus", "8"))
    assert code == 0 and f"{huge}: warning: :::SYSJSON accelerators_per_node {10 ** 30} is more than 1,000,000" in err
    assert summaries(tmp_path / "given")["result_0"]["hardware"]["num_gpus"] == 8
    code, err = run_import(capsys, huge, out=tmp_path / "none", extra=("--num-gpus", "0"))
    assert code == 2 and "--num-gpus 0: give a count from 1 to 1,000,000" in err


def two_one_node_systems(tmp_path: Path, accelerators: tuple[str, str]) -> Path:
    """A submitter folder of two 1-node, 8-GPU systems that ran llama2_70b_lora, each with its own
    scaling.json (NVIDIA's Eos: 1.00337, ASUSTeK's ESC_N8A-E12: 1.0347) and systems/<system>.json
    (HPE's real v5.0 description, with the system's own name, counts and accelerator)."""
    submitter = tmp_path / "submitter"
    template = json.loads((HPE / "systems" / f"{HPE_N2.name}.json").read_text())
    for (system, folder), accelerator in zip((("eos", EOS_8), ("esc", ASUS)), accelerators, strict=True):
        shutil.copytree(folder, submitter / "results" / system / "llama2_70b_lora")
        (submitter / "systems").mkdir(exist_ok=True)
        (submitter / "systems" / f"{system}.json").write_text(json.dumps(
            {**template, "submitter": "Submitter", "system_name": f"{system} 1x8", "number_of_nodes": "1",
             "accelerators_per_node": 8, "accelerator_model_name": accelerator}, indent=4))
    return submitter


def test_two_systems_of_one_node_count_are_scored_apart_whatever_the_label(capsys, tmp_path):
    submitter = two_one_node_systems(tmp_path, ("NVIDIA H100-SXM5-80GB", "NVIDIA H200-SXM5-141GB"))
    code, err = run_import(capsys, submitter, out=tmp_path / "out", extra=("--label", "same"))
    assert code == 0, err
    assert main(["report", str(tmp_path / "out"), "--format", "json"]) == 0
    captured = capsys.readouterr()
    groups = {g["system"]: g for g in json.loads(captured.out)["time_to_train"]}
    assert set(groups) == {"eos", "esc"}
    theirs = {row["system"]: row["llama2_70b_lora"]
              for row in summarizer_rows(submitter, RULESET, tmp_path / "summarizer")}
    for system, folder in (("eos", EOS_8), ("esc", ASUS)):
        group = groups[system]
        assert (group["label"], group["num_nodes"], group["num_gpus"]) == ("same", 1, 8)
        assert group["time_to_train_minutes"]["runs"] == 10
        assert group["time_to_train_minutes"]["scaling_factor"] == json.loads(
            (folder / "scaling.json").read_text())["scaling_factor"]
        olympic = group["time_to_train_minutes"]["olympic"]
        assert str(olympic) == str(theirs[f"{system} 1x8"]) == str(summarizer_score(folder, "llama2_70b_lora"))
        # another accelerator: no speedup against the other system, said
        assert group["speedup"] == 1.0 and group["speedup_over"] == f"{system} (1 node(s), 8 GPUs)"
    assert ("note: llama2_70b_lora on same, eos (1 node(s), 8 GPUs): not compared with esc (1 node(s), 8 GPUs): "
            "another accelerator (NVIDIA H200-SXM5-141GB)") in captured.err
    assert main(["report", str(tmp_path / "out")]) == 0
    table = capsys.readouterr().out
    assert all(f"{g['time_to_train_minutes']['olympic']:.2f}" in table for g in groups.values())


def test_two_systems_at_the_smallest_size_of_one_family_give_no_speedup(capsys, tmp_path):
    submitter = two_one_node_systems(tmp_path, ("NVIDIA H100-SXM5-80GB", "NVIDIA H100-SXM5-80GB"))
    code, err = run_import(capsys, submitter, EOS_64, out=tmp_path / "out", extra=("--label", "same"))
    assert code == 0, err
    assert main(["report", str(tmp_path / "out"), "--format", "json"]) == 0
    captured = capsys.readouterr()
    groups = json.loads(captured.out)["time_to_train"]
    assert len(groups) == 3  # eos and esc (1 x 8, submitter "Submitter"), Eos_n8 (8 x 8, submitter NVIDIA)
    by_system = {g["system"]: g for g in groups}
    assert by_system["eos"]["speedup"] is by_system["esc"]["speedup"] is None
    assert ("no speedup: eos (1 node(s), 8 GPUs) and esc (1 node(s), 8 GPUs) are both the smallest size of one "
            "system family (submitter Submitter, NVIDIA H100-SXM5-80GB, 8 GPUs per node, label same)") in captured.err
    assert by_system["eos_n8_ngc24.04_nemo"]["speedup"] == 1.0  # NVIDIA's: another family, by itself
    assert "not compared with eos (1 node(s), 8 GPUs): another submitter (Submitter)" in captured.err


def test_a_byte_copy_of_a_result_file_is_counted_once(capsys, tmp_path):
    system = tmp_path / EOS_8.parent.name / EOS_8.name
    shutil.copytree(EOS_8, system)
    shutil.copyfile(system / "result_3.txt", system / "result_10.txt")
    code, err = run_import(capsys, system, out=tmp_path / "out")
    assert code == 0, err
    assert f"{system / 'result_3.txt'}: warning: a byte copy of {system / 'result_10.txt'}: the same run" in err
    assert main(["report", str(tmp_path / "out"), "--format", "json"]) == 0
    captured = capsys.readouterr()
    (group,) = json.loads(captured.out)["time_to_train"]
    assert group["time_to_train_minutes"]["runs"] == 10 and len(group["files"]) == 10
    assert str(group["time_to_train_minutes"]["olympic"]) == str(summarizer_score(EOS_8, "llama2_70b_lora"))
    assert f"{system / 'result_3.txt'} is a byte copy of {system / 'result_10.txt'}: the same run, counted once" \
        in captured.err


def test_a_summary_claiming_more_nodes_than_gpus_is_refused_naming_it(capsys, tmp_path):
    code, err = run_import(capsys, EOS_8 / "result_0.txt", EOS_8 / "result_1.txt", out=tmp_path)
    assert code == 0, err
    claimed = tmp_path / "result_1" / "summary.json"
    summary = json.loads(claimed.read_text())
    summary["hardware"]["num_nodes"] = 16  # of 8 GPUs
    claimed.write_text(json.dumps(summary))
    assert main(["report", str(tmp_path), "--format", "json"]) == 1
    captured = capsys.readouterr()
    assert f"excluded: {claimed}: hardware.num_nodes 16 is more than hardware.num_gpus 8" in captured.err
    (group,) = json.loads(captured.out)["time_to_train"]
    assert group["time_to_train_minutes"]["runs"] == 1


def test_one_result_imported_twice_counts_once(capsys, tmp_path):
    for out in ("a", "b"):
        code, err = run_import(capsys, EOS_8, out=tmp_path / out)
        assert code == 0, err
    assert main(["report", str(tmp_path), "--format", "json"]) == 0
    captured = capsys.readouterr()
    (group,) = json.loads(captured.out)["time_to_train"]
    assert group["time_to_train_minutes"]["runs"] == 10
    assert str(group["time_to_train_minutes"]["olympic"]) == str(summarizer_score(EOS_8, "llama2_70b_lora"))
    assert (f"{EOS_8 / 'result_0.txt'} is imported twice ({tmp_path / 'a' / 'result_0' / 'summary.json'}, "
            f"{tmp_path / 'b' / 'result_0' / 'summary.json'}): the same run, counted once") in captured.err


def test_summaries_that_record_no_system_are_grouped_by_label_and_said_to_be(capsys, tmp_path):
    """Summaries of an older import have no time_to_train.system: the label is all that tells systems apart."""
    code, err = run_import(capsys, EOS_8, out=tmp_path)
    assert code == 0, err
    for path in tmp_path.rglob("summary.json"):
        summary = json.loads(path.read_text())
        del summary["time_to_train"]["system"], summary["time_to_train"]["sha256"]
        path.write_text(json.dumps(summary))
    assert main(["report", str(tmp_path), "--format", "json"]) == 0
    captured = capsys.readouterr()
    (group,) = json.loads(captured.out)["time_to_train"]
    assert group["system"] is None and group["submitter"] == "NVIDIA"  # the log's submission_org
    assert str(group["time_to_train_minutes"]["olympic"]) == str(summarizer_score(EOS_8, "llama2_70b_lora"))
    assert "note: llama2_70b_lora on Eos, (no system stated) (1 node(s), 8 GPUs): the runs state no system" \
        in captured.err


def test_the_system_directory_is_that_of_results_or_of_a_folder_named_after_the_benchmark(capsys, tmp_path):
    layouts = {"in-results": tmp_path / "results" / "eos" / "lora", "named": tmp_path / "eos2" / "llama2_70b_lora",
               "elsewhere": tmp_path / "eos3" / "lora"}
    for folder in layouts.values():
        folder.mkdir(parents=True)
        shutil.copyfile(EOS_8 / "result_0.txt", folder / "result_0.txt")
    code, err = run_import(capsys, *(folder / "result_0.txt" for folder in layouts.values()), out=tmp_path / "out")
    assert code == 0, err
    found = {Path(s["environment"]["imported_from"]).parent: s["time_to_train"]["system"]["directory"]
             for s in summaries(tmp_path / "out").values()}
    assert found == {layouts["in-results"]: "eos", layouts["named"]: "eos2", layouts["elsewhere"]: None}


def throughput_lines(path: Path) -> list:
    lines, failed = parse_file(str(path), ruleset=RULESET)
    assert not failed
    return [line for line in lines if line.key == "tracked_stats" and "throughput" in line.value["value"]]


def test_a_gpt3_rate_in_tokens_per_s_is_divided_by_its_sequence_length(capsys, tmp_path):
    log = EOS_GPT3 / "result_0.txt"
    code, err = run_import(capsys, log, out=tmp_path, ruleset="4.1.0")
    assert code == 0, err
    (summary,) = summaries(tmp_path).values()
    keys = keys_of(log)
    (line,) = throughput_lines(log)  # {"throughput": 404624.31}, metadata step 1207959552
    tokens_per_s, tokens = line.value["value"]["throughput"], line.value["metadata"]["step"]
    seq_length, batch = keys["max_sequence_length"].value["value"], keys["global_batch_size"].value["value"]
    assert tokens % (batch * seq_length) == 0 and tokens == keys["train_samples"].value["value"]  # 288 steps
    samples_per_s = summary["throughput"]["samples_per_s"]
    assert samples_per_s == pytest.approx(tokens_per_s / seq_length)  # 197.57, not 404,624
    seconds = (keys["run_stop"].timestamp - keys["run_start"].timestamp) / 1000
    assert samples_per_s == pytest.approx(tokens / seq_length / seconds, rel=0.01)  # 589,824 samples in 2,986 s
    assert summary["throughput"]["rate_source"] == "log:tracked_stats.throughput / max_sequence_length"
    assert summary["throughput"]["tokens_per_s"] is None
    (note,) = summary["time_to_train"]["notes"]
    assert note.startswith("the log's throughput 404,624/s is tokens/s (its step counts tokens: 1,207,959,552 = 288 x "
                           "global_batch_size 2048 x max_sequence_length 2048") and note in err


def test_a_rate_whose_step_counts_samples_stays_as_logged(capsys, tmp_path):
    log = AMD_LLAMA8B / "result_0.txt"  # max_sequence_length 8192; step 172,032 samples (5,376 batches of 32)
    code, err = run_import(capsys, log, out=tmp_path, ruleset="5.1.0")
    assert code == 0, err
    (summary,) = summaries(tmp_path).values()
    lines = throughput_lines(log)
    rates = [line.value["value"]["throughput"] for line in lines]
    assert summary["throughput"]["samples_per_s"] == pytest.approx(sum(rates) / len(rates))
    assert summary["throughput"]["rate_source"] == "log:tracked_stats.throughput"
    samples = lines[-1].value["metadata"]["step"]
    seconds = (lines[-1].timestamp - keys_of(log)["run_start"].timestamp) / 1000
    assert summary["throughput"]["samples_per_s"] == pytest.approx(samples / seconds, rel=0.05)
    assert not summary["time_to_train"]["notes"]


def test_a_token_rate_its_own_count_contradicts_gives_no_samples_per_s(capsys, tmp_path):
    logged = '{"throughput": 404624.3115973739}'
    log = _edited(EOS_GPT3 / "result_0.txt", tmp_path / "gpt3" / "result_0.txt",
                  lambda text: text.replace(logged, '{"throughput": 40462431.15973739}'))  # 100x
    code, err = run_import(capsys, log, out=tmp_path / "out", ruleset="4.1.0", extra=("--num-gpus", "512"))
    assert code == 0, err
    (summary,) = summaries(tmp_path / "out").values()
    assert summary["throughput"]["samples_per_s"] is None and summary["throughput"]["rate_source"] is None
    assert "looks like tokens/s" in err and "its unit is not known, samples/s not given" in err


def flat_copy(folder: Path, name: str, tmp_path: Path) -> Path:
    """A result file byte for byte in ``<system>/<benchmark>/`` with no systems/ around it: only its log counts."""
    target = tmp_path / folder.parent.name / folder.name / name
    target.parent.mkdir(parents=True)
    shutil.copyfile(folder / name, target)
    return target


def test_num_gpus_is_spread_over_the_nodes_the_platform_names(capsys, tmp_path):
    theia, azure = flat_copy(THEIA_8, "result_0.txt", tmp_path), flat_copy(AZURE_512, "result_3.txt", tmp_path)
    for log, given, nodes, platform in ((theia, 8, 2, "2xNVIDIA GB200"), (azure, 512, 64, "64xND_H200_v5")):
        assert keys_of(log)["submission_platform"].value["value"] == platform
        code, err = run_import(capsys, log, out=tmp_path / f"out-{given}", ruleset="5.1.0",
                               extra=("--num-gpus", given))
        assert code == 0, err
        (summary,) = summaries(tmp_path / f"out-{given}").values()
        assert (summary["hardware"]["num_nodes"], summary["hardware"]["num_gpus"]) == (nodes, given)
        assert summary["time_to_train"]["counts_from"] == "--num-gpus"
        assert (f"{given} accelerators as given, on the {nodes} node(s) of the log's submission_platform "
                f"'{platform}' ({given // nodes} per node)") in err
    described = json.loads((THEIA_8.parent.parent.parent / "systems" / f"{THEIA_8.parent.name}.json").read_text())
    assert (described["number_of_nodes"], described["accelerators_per_node"]) == ("2", "4")  # as published


def test_num_gpus_that_does_not_fit_the_platforms_nodes_is_refused_naming_both(capsys, tmp_path):
    theia, azure = flat_copy(THEIA_8, "result_0.txt", tmp_path), flat_copy(AZURE_512, "result_3.txt", tmp_path)
    for log, given, platform in ((azure, ("--num-gpus", "8"), "'64xND_H200_v5': 64 node(s)"),
                                 (azure, ("--num-gpus", "100", "--gpus-per-node", "8"), "'64xND_H200_v5': 64 node(s)"),
                                 (theia, ("--num-gpus", "3"), "'2xNVIDIA GB200': 2 node(s)"),
                                 (theia, ("--num-gpus", "8", "--gpus-per-node", "8"), "'2xNVIDIA GB200': 2 node(s)")):
        code, err = run_import(capsys, log, out=tmp_path / "out", ruleset="5.1.0", extra=given)
        assert code == 2 and len(err.splitlines()) == 1, err
        shown = " and ".join(f"{given[i]} {given[i + 1]}" for i in range(0, len(given), 2))
        assert f"{shown} {'contradicts' if len(given) == 2 else 'contradict'} the log's submission_platform " \
               f"{platform}" in err
    assert not list(tmp_path.rglob("summary.json"))
    code, err = run_import(capsys, azure, out=tmp_path / "out", ruleset="5.1.0",
                           extra=("--num-gpus", "512", "--gpus-per-node", "8"))
    assert code == 0, err
    # in its submission, systems/ counts it: a --gpus-per-node that contradicts that is refused too
    code, err = run_import(capsys, THEIA_8 / "result_0.txt", out=tmp_path / "in-layout", ruleset="5.1.0",
                           extra=("--gpus-per-node", "8"))
    assert code == 2 and "--gpus-per-node 8 contradicts systems/theia_ngpu8_ngc25.09_nemo.json: 2 node(s), 8 " \
                         "accelerators" in err


PLACEHOLDERS = ('"submitter":"UNKNOWN_MLPERF_SUBMITTER"', '"system_name":"UNKNOWN_MLPERF_SYSTEM_NAME"',
                '"value": "SUBMISSION_ORG_PLACEHOLDER"', '"value": "18xSUBMISSION_PLATFORM_PLACEHOLDER"')


def test_placeholder_names_in_a_log_name_no_submitter_or_system(capsys, tmp_path):
    log = flat_copy(LAMBDA_72, "result_9.txt", tmp_path)  # Lambda's real log, written by NVIDIA's scripts
    assert all(placeholder in log.read_text(encoding="latin-1") for placeholder in PLACEHOLDERS)
    code, err = run_import(capsys, log, out=tmp_path / "out", ruleset="5.1.0")
    assert code == 0, err
    (summary,) = summaries(tmp_path / "out").values()
    ttt = summary["time_to_train"]
    assert summary["run"]["label"] == "gb300_n18_ngc25.04_nemo"  # its <system> folder, not UNKNOWN_MLPERF_SYSTEM_NAME
    assert ttt["submitter"] is None and ttt["platform"] == "18xSUBMISSION_PLATFORM_PLACEHOLDER"  # the log's, as said
    assert ttt["system"] == {"directory": "gb300_n18_ngc25.04_nemo", "name": None, "accelerator": "NVIDIA GB300",
                             "submitter": None}
    assert summary["environment"]["system"]["submitter"] == "UNKNOWN_MLPERF_SUBMITTER"  # the :::SYSJSON line, kept
    assert (summary["hardware"]["num_nodes"], summary["hardware"]["num_gpus"]) == (18, 72)
    # in its submission, the systems file names it
    code, err = run_import(capsys, LAMBDA_72 / "result_9.txt", out=tmp_path / "in-layout", ruleset="5.1.0")
    assert code == 0, err
    (summary,) = summaries(tmp_path / "in-layout").values()
    assert summary["run"]["label"] == "Lambda_GB300_n18" and summary["time_to_train"]["system"]["submitter"] == "Lambda"


def test_runs_of_submitters_that_log_placeholders_are_never_one_system_family(capsys, tmp_path):
    """Two submitters' systems built with NVIDIA's scripts log the same placeholders: Lambda's 18 x 4 GB300,
    and here a 9 x 4 one (its log with 9 nodes). Never one family: no speedup of one over the other."""
    lambda_18 = flat_copy(LAMBDA_72, "result_9.txt", tmp_path / "a")
    other_9 = _edited(lambda_18, tmp_path / "b" / "other_n9" / "llama2_70b_lora" / "result_1.txt",
                      lambda text: text.replace('"number_of_nodes":"18"', '"number_of_nodes":"9"'))
    code, err = run_import(capsys, lambda_18, other_9, out=tmp_path / "out", ruleset="5.1.0",
                           extra=("--label", "same"))
    assert code == 0, err
    for older in (False, True):  # summaries of an older import kept the placeholders: read as unknown too
        if older:
            for path in (tmp_path / "out").rglob("summary.json"):
                summary = json.loads(path.read_text())
                summary["time_to_train"]["submitter"] = "SUBMISSION_ORG_PLACEHOLDER"
                summary["time_to_train"]["system"]["name"] = "UNKNOWN_MLPERF_SYSTEM_NAME"
                path.write_text(json.dumps(summary))
        assert main(["report", str(tmp_path / "out"), "--format", "json"]) == 0
        captured = capsys.readouterr()
        groups = {g["num_nodes"]: g for g in json.loads(captured.out)["time_to_train"]}
        assert set(groups) == {9, 18} and all(g["submitter"] is None for g in groups.values())
        for group in groups.values():  # each compared with itself only
            assert group["speedup"] == 1.0 and group["speedup_over"] == f"{group['system']} ({group['num_nodes']} " \
                                                                         f"node(s), {group['num_gpus']} GPUs)"
        assert ("not compared with other_n9 (9 node(s), 36 GPUs): a submitter or an accelerator is not stated, so no "
                "system family is known") in captured.err
        assert "one system family" not in captured.err


def with_line_after(text: str, after_key: str, line: str) -> str:
    """The log's text with ``line`` inserted after the first :::MLLOG line of ``after_key``."""
    at = text.index(f'"key": "{after_key}"')
    end = text.index("\n", at) + 1
    return text[:end] + line + text[end:]


def mllog_line(text: str, key: str) -> tuple[str, int]:
    """The first whole line of ``key`` and its time_ms."""
    (line,) = [line for line in text.splitlines(keepends=True) if f'"key": "{key}"' in line][:1]
    return line, int(re.search(r'"time_ms": (\d+)', line).group(1))


def summarizer_ends(path: Path) -> tuple[float, float]:
    lines, _ = parse_file(str(path), ruleset="5.1.0")
    return result_summarizer._query_run_start_stop(lines)


def test_several_run_starts_count_from_the_last_before_run_stop_as_result_summarizer_does(capsys, tmp_path):
    log = flat_copy(LAMBDA_72, "result_9.txt", tmp_path)

    def restarted(text):  # a second run_start 20 s later, after the first evaluation
        line, start = mllog_line(text, "run_start")
        return with_line_after(text, "eval_accuracy", line.replace(str(start), str(start + 20_000)))

    twice = _edited(log, tmp_path / "twice" / "llama2_70b_lora" / "result_1.txt", restarted)
    code, err = run_import(capsys, log, twice, out=tmp_path / "out", ruleset="5.1.0")
    assert code == 0, err
    by_file = {s["environment"]["imported_from"]: s["time_to_train"] for s in summaries(tmp_path / "out").values()}
    one, two = by_file[str(log)], by_file[str(twice)]
    start, stop = summarizer_ends(twice)
    assert two["run_start_ms"] == start == one["run_start_ms"] + 20_000 and two["run_stop_ms"] == stop
    assert two["minutes"] == (stop - start) / 60 / 1000 == pytest.approx(one["minutes"] - 20 / 60)
    assert two["converged"] and two["compliant"]
    assert two["notes"] == [f"the log has 2 run_start lines: the time to train counts from the last one before the "
                            f"first run_stop ({start:.0f} ms), as result_summarizer counts it"]
    assert f"{twice}: warning: the log has 2 run_start lines" in err


def test_several_run_stops_end_at_the_first_as_result_summarizer_does(capsys, tmp_path):
    log = flat_copy(LAMBDA_72, "result_9.txt", tmp_path)

    def stopped_early(text):  # an aborted run_stop 1 s after run_start, before the real one
        line, stop = mllog_line(text, "run_stop")
        _, start = mllog_line(text, "run_start")
        early = re.sub(r'"status": "success"', '"status": "aborted"', line.replace(str(stop), str(start + 1000)))
        return with_line_after(text, "run_start", early)

    twice = _edited(log, tmp_path / "twice" / "llama2_70b_lora" / "result_1.txt", stopped_early)
    code, err = run_import(capsys, twice, out=tmp_path / "out", ruleset="5.1.0")
    assert code == 0, err
    (summary,) = summaries(tmp_path / "out").values()
    ttt = summary["time_to_train"]
    start, stop = summarizer_ends(twice)
    assert (ttt["run_start_ms"], ttt["run_stop_ms"], ttt["status"]) == (start, stop, "aborted") and stop == start + 1000
    assert not ttt["converged"] and summary["status"] == "failed"
    assert ttt["notes"][0] == (f"the log has 2 run_stop lines: the first ({stop:.0f} ms, status 'aborted') ends the "
                               "time to train, as result_summarizer ends it")


def test_an_aborted_run_whose_evaluations_reach_the_target_is_dropped_and_said_to_count_for_result_summarizer(
        capsys, tmp_path):
    log = flat_copy(LAMBDA_72, "result_9.txt", tmp_path)
    aborted = _edited(log, tmp_path / "aborted" / "llama2_70b_lora" / "result_1.txt",
                      lambda text: text.replace('"status": "success"', '"status": "aborted"'))
    code, err = run_import(capsys, aborted, out=tmp_path / "out", ruleset="5.1.0")
    assert code == 0, err
    (summary,) = summaries(tmp_path / "out").values()
    ttt = summary["time_to_train"]
    assert ttt["status"] == "aborted" and ttt["compliant"] and not ttt["converged"]  # dropped from the olympic
    start, stop = summarizer_ends(aborted)
    assert f"result_summarizer would count it ({(stop - start) / 60000:.2f} min): it does not read run_stop's " \
           "status, and the compliance check passes it" in err


def test_a_linked_result_file_is_counted_and_scaled_as_the_folder_it_is_in(capsys, tmp_path):
    mine = tmp_path / "mytheia" / "llama2_70b_lora"  # links to a published system's results, in a folder of mine
    mine.mkdir(parents=True)
    for name in ("result_0.txt", "result_1.txt"):
        (mine / name).symlink_to((THEIA_8 / name).resolve())
    (mine / "scaling.json").write_text('{"scaling_factor": 2.0}')  # not the one of the runs' folder: never read
    code, err = run_import(capsys, mine, out=tmp_path / "out", ruleset="5.1.0")
    assert code == 0, err
    published = json.loads((THEIA_8 / "scaling.json").read_text())["scaling_factor"]  # 1.034722222222222
    for summary in summaries(tmp_path / "out").values():
        ttt = summary["time_to_train"]
        assert ttt["system"]["directory"] == THEIA_8.parent.name and ttt["counts_from"] == \
            f"systems/{THEIA_8.parent.name}.json"
        assert (summary["hardware"]["num_nodes"], summary["hardware"]["num_gpus"]) == (2, 8)
        assert ttt["scaling_factor"] == published
        source = Path(summary["environment"]["imported_from"])
        assert source.parent == mine and source.is_symlink()  # where it was given
        assert f"a link to {(THEIA_8 / source.name).resolve()}: the systems file and scaling.json are those of its " \
               "folder" in ttt["notes"]
    (group,) = report_json(capsys, tmp_path / "out")["time_to_train"]
    assert group["time_to_train_minutes"]["scaling_factor"] == published and group["time_to_train_minutes"]["runs"] == 2


def test_a_link_to_a_result_file_beside_it_is_imported_once(capsys, tmp_path):
    folder = tmp_path / THEIA_8.parent.name / THEIA_8.name
    folder.mkdir(parents=True)
    shutil.copyfile(THEIA_8 / "result_1.txt", folder / "result_1.txt")
    (folder / "result_0.txt").symlink_to("result_1.txt")  # first in name order
    shutil.copyfile(THEIA_8 / "result_0.txt", folder / "result_2.txt")
    code, err = run_import(capsys, folder, out=tmp_path / "out", ruleset="5.1.0", extra=("--num-gpus", "8"))
    assert code == 0, err
    assert set(summaries(tmp_path / "out")) == {"result_1", "result_2"}
    assert (f"nemo-throughput import: warning: {folder / 'result_0.txt'} is a link to {folder / 'result_1.txt'}: the "
            "same run, imported once") in err


def test_the_line_printed_per_file_says_accelerators_as_a_tpu_is_no_gpu(capsys, tmp_path):
    code = main(["import", "--format", "mlperf", str(GOOGLE / "result_0.txt"), "--num-gpus", "1024", "--output-dir",
                 str(tmp_path), "--ruleset", RULESET])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "result_0/summary.json: gpt3 on tpu-v5p (1024 accelerators), " in captured.out and "GPU" not in captured.out
    assert "1024 accelerators as given, on 128 node(s) of 8" in captured.err and "GPU" not in captured.err


def test_the_time_to_train_table_counts_gpus_only_where_every_accelerator_is_named_as_one(capsys, tmp_path):
    for submitter, ruleset in ((V31 / "Google", "3.1.0"), (V30 / "Intel-HabanaLabs", "3.0.0")):  # TPU v5e, Gaudi2
        assert run_import(capsys, submitter, out=tmp_path / "tpu_gaudi" / submitter.name, ruleset=ruleset)[0] == 0
    assert run_import(capsys, EOS_8, out=tmp_path / "h100")[0] == 0
    for folder, word in (("tpu_gaudi", "accelerators"), ("h100", "GPUs")):
        assert main(["report", str(tmp_path / folder)]) == 0
        table = capsys.readouterr().out.split("Time to train")[1].splitlines()
        header = next(line for line in table if line.startswith("benchmark"))
        assert header.split()[4] == word and ("GPUs" in header) == (word == "GPUs")
        groups = report_json(capsys, tmp_path / folder)["time_to_train"]
        assert all(g["speedup_over"].endswith(f"{g['num_gpus']} {word})") for g in groups)


def test_a_run_stop_without_a_status_is_said_to_state_none(capsys, tmp_path):
    log = flat_copy(THEIA_8, "result_0.txt", tmp_path)
    text = log.read_text(encoding="latin-1")
    (line,) = [line for line in text.splitlines() if '"key": "run_stop"' in line]
    assert '"status": "success"' in line
    silent = _edited(log, tmp_path / "silent" / "llama2_70b_lora" / "result_0.txt",
                     lambda text: text.replace(line, re.sub(r', "status": "success"', "", line)))
    code, err = run_import(capsys, silent, out=tmp_path / "out", ruleset="5.1.0", extra=("--num-gpus", "8"))
    assert code == 0, err
    (summary,) = summaries(tmp_path / "out").values()
    assert summary["time_to_train"]["status"] is None and summary["status"] == "failed"
    assert summary["error"] == "run_stop states no status: whether the target quality was reached is not known"
    assert "target quality was not reached" not in err and not summary["time_to_train"]["compliant"]


def test_lines_that_several_ranks_print_alike_are_one_event(capsys, tmp_path):
    log = flat_copy(THEIA_8, "result_0.txt", tmp_path)

    def from_two_ranks(text):  # srun -l: each :::MLLOG line from ranks 0 and 1
        return "".join(f"0: {line}1: {line}" if line.startswith(":::MLLOG") else line
                       for line in text.splitlines(keepends=True))

    twice = _edited(log, tmp_path / "twice" / "llama2_70b_lora" / "result_0.txt", from_two_ranks)
    code, err = run_import(capsys, log, twice, out=tmp_path / "out", ruleset="5.1.0", extra=("--num-gpus", "8"))
    assert code == 0, err
    by_file = {s["environment"]["imported_from"]: s["time_to_train"] for s in summaries(tmp_path / "out").values()}
    once, doubled = by_file[str(log)], by_file[str(twice)]
    lines, _ = parse_file(str(log), ruleset="5.1.0")
    evals = [line for line in lines if line.key == "eval_accuracy"]
    assert len(doubled["evals"]) == len(once["evals"]) == len(evals) == 5
    assert (doubled["minutes"], doubled["epochs"], doubled["status"]) == (once["minutes"], once["epochs"], "success")
    assert not any("run_start lines" in note for note in doubled["notes"])  # one run_start, printed twice
    read = ("run_start", "run_stop", "tracked_stats", "throughput", "eval_accuracy", "epoch_start")
    (note,) = [note for note in doubled["notes"] if "repeat an earlier line exactly" in note]
    assert note.startswith(f"{sum(line.key in read for line in lines)} :::MLLOG line(s) of {', '.join(read)} repeat")
    assert not any("repeat an earlier line" in note for note in once["notes"])


def test_reading_a_large_result_file_takes_memory_that_does_not_grow_with_its_size(tmp_path):
    import tracemalloc

    from nemo_throughput.importers.mlperf.result_log import read_result

    noisy = tmp_path / "result_0.txt"  # a real run, then 15 MB of NCCL-style lines, as a verbose job prints them
    nccl = "node01:1234:5678 [0] NCCL INFO Channel 00/32 : 0[0] -> 1[1] via P2P/CUMEM/read " * 40 + "\n"
    noisy.write_text((THEIA_8 / "result_0.txt").read_text(encoding="latin-1") + nccl * 5000, encoding="latin-1")
    size = noisy.stat().st_size
    assert size > 15 * 1024 ** 2
    tracemalloc.start()
    try:
        result = read_result(noisy, "5.1.0")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert result.sha256 == hashlib.sha256(noisy.read_bytes()).hexdigest() and result.minutes is not None
    assert peak < size / 4, f"{peak:,} bytes at the peak to read {size:,}"
