"""`import --format mlperf` on result trees as they are found (a submitter's checkout, a partial rsync):
links to nowhere, loops of links, FIFOs, folders named like a result file, files that cannot be read
or hold nothing; and result files whose text is hostile (malformed or cut lines, a huge line, escape
sequences). The real files of tests/data/mlperf (ORIGIN.md) are copied into each case."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mlperf_logging")

from mlperf_logging.compliance_checker.mlp_parser import parse_file  # noqa: E402

from conftest import import_error_line  # noqa: E402
from nemo_throughput.cli import main  # noqa: E402
from nemo_throughput.importers.mlperf.tree import MAX_LISTED  # noqa: E402

DATA = Path(__file__).parent / "data" / "mlperf"
EOS_8 = DATA / "NVIDIA" / "eos_ngc24.04_nemo" / "llama2_70b_lora"  # 1 x 8 H100, :::SYSJSON states them
RULESET = "4.0.0"
REPO = Path(__file__).parent.parent


def run_import(capsys, *inputs, out: Path) -> tuple[int, str]:
    code = main(["import", "--format", "mlperf", *map(str, inputs), "--output-dir", str(out), "--ruleset", RULESET])
    return code, capsys.readouterr().err


def summaries(out: Path) -> dict[str, dict]:
    return {p.parent.name: json.loads(p.read_text()) for p in sorted(out.rglob("summary.json"))}


def run_ends(path: Path) -> tuple[float, float]:
    """run_start and run_stop as mlperf-logging's parser reads them from the file."""
    lines, _ = parse_file(str(path), ruleset=RULESET)
    return next(ln.timestamp for ln in lines if ln.key == "run_start"), \
        next(ln.timestamp for ln in lines if ln.key == "run_stop")


def good_copy(folder: Path, name: str = "result_0.txt") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copyfile(EOS_8 / name, folder / name))


def hostile_tree(root: Path) -> dict[str, str]:
    """One readable result file among the entries a real tree holds that cannot be read as one; the
    relative path of each of those, and what import must say of it."""
    good_copy(root / "a")
    (root / "a" / "result_1.txt").symlink_to("result_gone.txt")
    os.mkfifo(root / "a" / "result_2.txt")
    (root / "b" / "result_3.txt").mkdir(parents=True)  # a folder named like a result file
    (root / "b" / "result_4.txt").symlink_to("result_5.txt")
    (root / "b" / "result_5.txt").symlink_to("result_4.txt")
    (root / "b" / "up").symlink_to("..")  # a loop of folders
    (root / "b" / "result_6.txt").write_bytes(b"")  # a copy cut short at 0 bytes
    (root / "b" / "result_notes.txt").write_text("submitted on the 2nd try\n")
    return {"a/result_1.txt": "a link to result_gone.txt, which does not exist",
            "a/result_2.txt": "a FIFO (named pipe), not a regular file: not opened",
            "b/result_3.txt": "a folder named like a result file, not a file: not walked",
            "b/result_4.txt": "a loop of links: it links to no file",
            "b/result_5.txt": "a loop of links: it links to no file",
            "b/up": "a link to a folder: not walked (give it on the command line to import the result files under it)",
            "b/result_6.txt": "empty (0 bytes: a copy cut short?): no `:::MLLOG` lines",
            "b/result_notes.txt": "no `:::MLLOG` lines"}


@pytest.mark.timeout(60)  # a FIFO opened, or a loop walked, would hang here
def test_a_tree_imports_its_readable_files_and_names_each_left_out_with_why(capsys, tmp_path):
    root = tmp_path / "tree"
    expected = hostile_tree(root)
    code, err = run_import(capsys, root, out=tmp_path / "out")
    assert code == 0, err
    (summary,) = summaries(tmp_path / "out").values()
    start, stop = run_ends(root / "a" / "result_0.txt")
    assert summary["environment"]["imported_from"] == str(root / "a" / "result_0.txt")
    assert summary["time_to_train"]["minutes"] == (stop - start) / 60000 and summary["hardware"]["num_gpus"] == 8
    left_out = [line for line in err.splitlines() if "warning: left out " in line]
    assert len(left_out) == len(expected)
    for relative, why in expected.items():
        assert f"nemo-throughput import: warning: left out {root / relative}: {why}" in left_out


def test_more_files_left_out_than_listed_are_counted(capsys, tmp_path):
    good_copy(tmp_path / "tree")
    for number in range(1, MAX_LISTED + 4):
        (tmp_path / "tree" / f"result_{number:02}.txt").symlink_to(f"gone_{number}")
    code, err = run_import(capsys, tmp_path / "tree", out=tmp_path / "out")
    assert code == 0, err
    assert sum("warning: left out " in line for line in err.splitlines()) == MAX_LISTED
    assert "nemo-throughput import: warning: and 3 more result file(s) left out" in err
    assert list(summaries(tmp_path / "out")) == ["result_0"]


def test_a_tree_with_nothing_importable_left_is_refused_in_one_line(capsys, tmp_path):
    root = tmp_path / "tree"
    expected = hostile_tree(root)
    (root / "a" / "result_0.txt").unlink()
    code, err = run_import(capsys, root, out=tmp_path / "out")
    line = import_error_line(err, f"{len(expected)} left out")
    assert code == 2 and line.startswith("nemo-throughput import: no result file could be imported: ")
    assert not list((tmp_path / "out").rglob("summary.json")) if (tmp_path / "out").exists() else True


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", ["a/result_1.txt", "a/result_2.txt", "b/result_4.txt", "b/result_6.txt",
                                  "b/result_notes.txt"])
def test_a_bad_file_named_on_the_command_line_is_refused_naming_it(capsys, tmp_path, name):
    root = tmp_path / "tree"
    why = hostile_tree(root)[name]
    code, err = run_import(capsys, root / "a" / "result_0.txt", root / name, out=tmp_path / "out")
    line = import_error_line(err, str(root / name))
    assert code == 2 and f"{root / name}: {why}" in line
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").rglob("summary.json"))


@pytest.mark.timeout(60)
def test_a_submitters_folder_with_a_fifo_and_a_dangling_link_imports_the_rest(capsys, tmp_path):
    submitter = tmp_path / "NVIDIA"
    benchmark = submitter / "results" / EOS_8.parent.name / EOS_8.name
    good_copy(benchmark)
    os.mkfifo(benchmark / "result_1.txt")
    (benchmark / "result_2.txt").symlink_to(tmp_path / "elsewhere" / "result_2.txt")
    (submitter / "systems").mkdir()
    (submitter / "systems" / f"{EOS_8.parent.name}.json").write_text(json.dumps(
        {"system_name": "Eos", "number_of_nodes": "1", "accelerators_per_node": "8"}))
    code, err = run_import(capsys, submitter, out=tmp_path / "out")
    assert code == 0, err
    (summary,) = summaries(tmp_path / "out").values()
    assert summary["time_to_train"]["counts_from"] == f"systems/{EOS_8.parent.name}.json"
    assert f"left out {benchmark / 'result_1.txt'}: a FIFO (named pipe)" in err
    assert f"left out {benchmark / 'result_2.txt'}: a link to {tmp_path / 'elsewhere' / 'result_2.txt'}, which " \
           "does not exist" in err


def import_without_read_override(*args: str) -> tuple[int, str]:
    """`nemo-throughput import` where file permissions hold: in a child process, and as root without
    the capabilities that let root read any file (capsh drops them)."""
    command = [sys.executable, "-m", "nemo_throughput.cli", "import", "--format", "mlperf", *args]
    if os.geteuid() == 0:
        if shutil.which("capsh") is None:
            pytest.skip("running as root without capsh: file permissions do not stop root from reading")
        command = ["capsh", "--drop=cap_dac_override,cap_dac_read_search", "--", "-c",
                   " ".join(f"'{part}'" for part in command)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    return done.returncode, done.stderr


def test_a_file_and_a_folder_without_read_permission_are_left_out_and_refused_when_named(tmp_path):
    root = tmp_path / "tree"
    good_copy(root)
    closed = good_copy(root, "result_1.txt")
    locked = root / "locked"
    good_copy(locked)
    closed.chmod(0)
    locked.chmod(0)
    try:
        code, err = import_without_read_override(str(root), "--output-dir", str(tmp_path / "out"), "--ruleset",
                                                 RULESET)
        assert code == 0, err
        assert f"warning: left out {closed}: cannot be opened for reading (Permission denied)" in err
        assert f"warning: left out {locked}: a folder that cannot be read (Permission denied): not walked" in err
        assert [p.parent.name for p in (tmp_path / "out").rglob("summary.json")] == ["result_0"]
        code, err = import_without_read_override(str(closed), "--output-dir", str(tmp_path / "out2"))
        line = import_error_line(err, str(closed))
        assert code == 2 and line.startswith(f"nemo-throughput import: {closed}: cannot be opened for reading "
                                             "(Permission denied) (give ")
        code, err = import_without_read_override(str(locked), "--output-dir", str(tmp_path / "out3"))
        line = import_error_line(err, str(locked))
        assert code == 2 and line == f"nemo-throughput import: {locked}: a folder that cannot be read (Permission " \
                                     "denied) (check its permissions)"
    finally:
        closed.chmod(0o644)
        locked.chmod(0o755)


def with_text(target: Path, text: str) -> Path:
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text, encoding="latin-1")
    return target


def eos_text() -> str:
    return (EOS_8 / "result_0.txt").read_text(encoding="latin-1")


def mllog_line_of(text: str, key: str) -> str:
    return next(line for line in text.splitlines(keepends=True) if f'"key": "{key}"' in line)


def test_a_malformed_mllog_line_is_counted_and_said_and_the_rest_reads_the_same(capsys, tmp_path):
    text = eos_text()
    start = mllog_line_of(text, "run_start")
    broken = ':::MLLOG {"namespace": "", "time_ms": 1714861400000, "key": "eval_accuracy", "value": 0.9, \n'
    log = with_text(tmp_path / "broken" / "result_0.txt", text.replace(start, start + broken))
    code, err = run_import(capsys, EOS_8 / "result_0.txt", log, out=tmp_path / "out")
    assert code == 0, err
    plain, malformed = (summaries(tmp_path / "out")[name]["time_to_train"] for name in ("llama2_70b_lora-result_0",
                                                                                         "broken-result_0"))
    assert malformed["minutes"] == plain["minutes"] and malformed["evals"] == plain["evals"]
    assert "1 :::MLLOG line(s) could not be parsed" in malformed["notes"]


def test_a_copy_cut_in_its_run_stop_line_is_an_interrupted_run_never_a_converged_one(capsys, tmp_path):
    text = eos_text()
    stop = mllog_line_of(text, "run_stop")
    cut = text[:text.index(stop) + len(stop) // 2]  # a partial copy: the bytes end mid-line
    log = with_text(tmp_path / "cut" / "result_0.txt", cut)
    code, err = run_import(capsys, log, out=tmp_path / "out")
    assert code == 0, err
    (summary,) = summaries(tmp_path / "out").values()
    ttt = summary["time_to_train"]
    assert summary["status"] == "interrupted" and ttt["minutes"] is None and not ttt["converged"]
    assert ttt["run_start_ms"] == run_ends(EOS_8 / "result_0.txt")[0] and ttt["run_stop_ms"] is None
    assert "1 :::MLLOG line(s) could not be parsed" in ttt["notes"] and not ttt["compliant"]


def test_a_huge_line_of_noise_leaves_the_figures_as_they_are(capsys, tmp_path):
    text = eos_text()
    start = mllog_line_of(text, "run_start")
    noise = "x" * (32 * 1024 ** 2) + "\n"  # 32 MiB without a line break, as a runaway print leaves one
    log = with_text(tmp_path / "huge" / "result_0.txt", text.replace(start, start + noise) + noise.rstrip("\n"))
    code, err = run_import(capsys, log, out=tmp_path / "out")
    assert code == 0, err
    (summary,) = summaries(tmp_path / "out").values()
    start_ms, stop_ms = run_ends(EOS_8 / "result_0.txt")
    assert summary["time_to_train"]["minutes"] == (stop_ms - start_ms) / 60 / 1000
    assert summary["time_to_train"]["converged"] and len(err) < 4096  # nothing of the line is echoed


def test_escape_sequences_in_a_system_name_never_reach_the_console(capsys, tmp_path):
    hostile = "\x1b]0;owned\x07\x1b[2J\x1b[31mEos\x9b1m"
    submitter = tmp_path / "NVIDIA"
    benchmark = submitter / "results" / EOS_8.parent.name / EOS_8.name
    good_copy(benchmark)
    (submitter / "systems").mkdir()
    (submitter / "systems" / f"{EOS_8.parent.name}.json").write_text(json.dumps(
        {"system_name": hostile, "accelerator_model_name": hostile, "submitter": hostile, "number_of_nodes": "2",
         "accelerators_per_node": "4"}))  # counts the log contradicts (1 x 8): a warning quotes the file
    assert main(["import", "--format", "mlperf", str(submitter), "--output-dir", str(tmp_path / "out"),
                 "--ruleset", RULESET]) == 0
    imported = capsys.readouterr()
    assert main(["report", str(tmp_path / "out")]) == 0
    reported = capsys.readouterr()
    (summary,) = summaries(tmp_path / "out").values()
    assert summary["run"]["label"] == hostile  # kept as the file states it; only what is shown is made printable
    for shown in (imported.out, imported.err, reported.out, reported.err):
        assert "\x1b" not in shown and "\x9b" not in shown and "\x07" not in shown
    assert "on Eos (8 accelerators)" in imported.out and "the log states 1 node(s) x 8 accelerators" in imported.err


def test_escape_sequences_in_a_logs_benchmark_never_reach_the_console(capsys, tmp_path):
    stated = '"key": "submission_benchmark", "value": "llama2_70b_lora"'
    text = eos_text()
    assert stated in text
    log = with_text(tmp_path / "esc" / "result_0.txt",
                    text.replace(stated, stated.replace('"llama2', '"\\u001b[2J\\u001b]0;owned\\u0007llama2')))
    code = main(["import", "--format", "mlperf", str(log), "--output-dir", str(tmp_path / "out"), "--ruleset", RULESET])
    shown = capsys.readouterr()
    assert code == 0, shown.err
    assert not any(ch in shown.out + shown.err for ch in "\x1b\x07\x9b")
    assert ": llama2_70b_lora on Eos (8 accelerators)" in shown.out
