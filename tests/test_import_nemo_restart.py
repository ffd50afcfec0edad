"""`nemo-throughput import`: a NeMo job restarted into its log, seen from Lightning's resume message
(`Restored all states from the checkpoint at ...`), built from real logs (tests/data/import, origins in
its ORIGIN.md): a NeMo 2 in-job restart of eight interleaved ranks, and a NeMo 1 run that restores its
best checkpoint after its last step."""

import re
from pathlib import Path

import pytest

from conftest import import_error_line, summary_of
from nemo_throughput.cli import main

DATA = Path(__file__).parent / "data" / "import"
INJOB = DATA / "nemo2_nemo_run_injob_restart.log"  # iterations 0-15, crash, restart from step 9: 10-19 again
PEFT_END = DATA / "nemo1_peft_restore_best_at_end.out"  # step 6024, then the best checkpoint restored
RANK0 = "ining-demo/0 [default0]:"
STARTS = "starting where a process starts at line {} (`Restored all states from the checkpoint`: a run resumed)"


def run_import(capsys, log, *extra, out):
    code = main(["import", str(log), "--label", "bare-metal", "--model", "gpt3-126m", "--seq-length", "128",
                 "--num-gpus", "8", "--output-dir", str(out), *map(str, extra)])
    captured = capsys.readouterr()
    return code, captured.err


def steps_of(out, name):
    return [step for step, _ in summary_of(out, name)["timing"]["steps"]]


def injob_lines() -> list[str]:
    return INJOB.read_text().splitlines(keepends=True)


def first_index(lines: list[str], text: str) -> int:
    return next(i for i, line in enumerate(lines) if text in line)


def resumed_past_the_last_printed_step(path: Path) -> Path:
    """The real in-job restart without the first process's iterations 10-15 (lost with the killed
    process, as block-buffered output is): the restart resumes at the next step, none printed again."""
    lines = injob_lines()
    restored = first_index(lines, "Restored all states")
    lost = re.compile(r"iteration 1[0-5]/19 ")
    path.write_text("".join(line for i, line in enumerate(lines) if i > restored or not lost.search(line)))
    return path


# ------------------------------------------------------------------------------- real logs
def test_real_nemo2_in_job_restart_is_cut_where_lightning_says_it_resumed(tmp_path, capsys):
    code, err = run_import(capsys, INJOB, "--warmup", "0", out=tmp_path)
    line = import_error_line(err, INJOB.name)
    assert code == 2 and "2 segments" in line
    assert "1: steps 1-16, 16 printed, lines 141-159; 2: steps 11-20, 10 printed, lines 763-772, " \
           + STARTS.format(758) in line
    assert "Restored all states" in INJOB.read_text().splitlines()[757]
    code, err = run_import(capsys, INJOB, "--warmup", "0", "--segment", "last", out=tmp_path)
    assert code == 0, err
    steps = summary_of(tmp_path, INJOB.stem)["timing"]["steps"]
    assert steps[0] == [11, 10.26] and [s for s, _ in steps] == list(range(11, 21))  # the restart's own first step


def test_real_nemo2_restart_resuming_past_the_last_printed_step_is_no_longer_one_run(tmp_path, capsys):
    log = resumed_past_the_last_printed_step(tmp_path / "forward.log")
    code, err = run_import(capsys, log, "--warmup", "0", out=tmp_path / "out")
    line = import_error_line(err, "forward.log")
    assert code == 2 and "2 segments" in line and "1: steps 1-10, 10 printed, lines 141-150; 2: steps 11-20, " \
        "10 printed, lines 757-766, " + STARTS.format(752) in line
    code, err = run_import(capsys, log, "--warmup", "0", "--segment", "1", out=tmp_path / "out")
    assert code == 0, err
    assert steps_of(tmp_path / "out", "forward") == list(range(1, 11))  # the restart's 10.2 s is not in it
    assert "read segment 1 of 2 (steps 1-10, 10 printed, lines 141-150)" in err


def test_a_resumed_process_alone_is_one_run(tmp_path, capsys):
    # the log of the restarted worker group only: Lightning's message before any step is no restart
    lines = injob_lines()
    log = tmp_path / "resumed.log"
    log.write_text("".join(lines[first_index(lines, "restart_count=1"):]))
    code, err = run_import(capsys, log, "--warmup", "0", out=tmp_path)
    assert code == 0, err
    summary = summary_of(tmp_path, "resumed")
    assert steps_of(tmp_path, "resumed") == list(range(11, 21)) and summary["environment"]["imported_segment"] is None
    assert "segment" not in err


def test_nemo1_best_checkpoint_restored_after_the_last_step_is_no_restart(tmp_path, capsys):
    code, err = run_import(capsys, PEFT_END, "--window", "last", out=tmp_path)
    assert code == 0, err
    summary = summary_of(tmp_path, PEFT_END.stem)
    assert summary["timing"]["steps"] == [[6024, 2.59]] and summary["environment"]["imported_segment"] is None


def test_a_restart_whose_process_prints_no_step_is_no_segment(tmp_path, capsys):
    # the restarted process restores its checkpoint, then dies before its first step
    lines = resumed_past_the_last_printed_step(tmp_path / "full.log").read_text().splitlines(keepends=True)
    log = tmp_path / "died.log"
    log.write_text("".join(lines[:first_index(lines, "Restored all states") + 1]))
    code, err = run_import(capsys, log, "--warmup", "0", out=tmp_path)
    assert code == 0, err
    assert steps_of(tmp_path, "died") == list(range(1, 11)) and "segment" not in err


# ------------------------------------------------------------------------------- ranks
def test_the_same_message_from_every_rank_late_in_the_interleaving_cuts_once(tmp_path, capsys):
    # Lightning prints it on rank 0 only; where every rank prints it, the other ranks' copies reach the
    # file after rank 0's first steps: they must not cut the resumed process again
    lines = resumed_past_the_last_printed_step(tmp_path / "full.log").read_text().splitlines(keepends=True)
    restored = lines[first_index(lines, "Restored all states")]
    others = [restored.replace("[default0]", f"[default{r}]") for r in range(1, 8)]
    second = first_index(lines, "iteration 12/19")  # after the resumed process's first two steps
    log = tmp_path / "every_rank.log"
    log.write_text("".join([*lines[:second], *others[:4], lines[second], *others[4:], *lines[second + 1:]]))
    code, err = run_import(capsys, log, "--warmup", "0", out=tmp_path / "out")
    line = import_error_line(err, "every_rank.log")
    assert code == 2 and "2 segments" in line and "2: steps 11-20, 10 printed, lines 757-773, " in line


def test_the_message_on_a_non_zero_rank_only_is_not_a_restart_of_the_rank_read(tmp_path, capsys):
    lines = resumed_past_the_last_printed_step(tmp_path / "full.log").read_text().splitlines(keepends=True)
    restored = first_index(lines, "Restored all states")
    lines[restored] = lines[restored].replace("[default0]", "[default3]")
    log = tmp_path / "rank3.log"
    log.write_text("".join(lines))
    code, err = run_import(capsys, log, "--warmup", "0", out=tmp_path / "out")
    assert code == 0, err
    assert steps_of(tmp_path / "out", "rank3") == list(range(1, 21)) and "segment" not in err


# ------------------------------------------------------------------------------- carriage returns
PEFT_TEXT = PEFT_END.read_bytes().decode()  # read_text would turn its carriage returns into line breaks
PEFT_BAR = PEFT_TEXT.split("\n")[7].split("\r")[1]  # step 6024: global_step=6023.0, 2.590 s


def peft_bar(step: int, seconds: float) -> str:
    """The real bar of the NeMo 1 PEFT run at another step and time (its batch, 16, kept)."""
    return (PEFT_BAR.replace("6024/10000", f"{step}/10000").replace("global_step=6023.0", f"global_step={step - 1}.0")
            .replace("consumed_samples=96384.0", f"consumed_samples={step * 16}.0")
            .replace("train_step_timing in s=2.590", f"train_step_timing in s={seconds:.3f}"))


RESTORED = PEFT_TEXT.split("\n")[-2]


@pytest.mark.parametrize("between, said_line", [
    ("\r" + RESTORED + "\n", 1),  # on the bar's line, after a carriage return
    (RESTORED + "\n", 1),  # glued to the killed process's last bar, which had no line break
    ("\n" + RESTORED + "\n", 2),  # on a line of its own
])
def test_a_resume_among_progress_bar_redraws_cuts_between_them(tmp_path, capsys, between, said_line):
    first = "".join("\r" + peft_bar(step, 2.5) for step in range(6020, 6025))
    resumed = "".join("\r" + peft_bar(step, 4.0 + step % 2) for step in range(6025, 6029))
    log = tmp_path / "bar.out"
    log.write_text(first + between + resumed + "\n")
    code, err = run_import(capsys, log, "--warmup", "0", out=tmp_path / "out")
    line = import_error_line(err, "bar.out")
    assert code == 2 and f"1: steps 6020-6024, 5 printed, lines 1-1; 2: steps 6025-6028, 4 printed, " in line
    assert STARTS.format(said_line) in line
    code, err = run_import(capsys, log, "--warmup", "0", "--segment", "2", out=tmp_path / "out")
    assert code == 0, err
    assert summary_of(tmp_path / "out", "bar")["timing"]["steps"] == [[6025, 5.0], [6026, 4.0], [6027, 5.0],
                                                                      [6028, 4.0]]


# ------------------------------------------------------------------------------- many restarts
def test_fifty_restarts_each_resuming_past_the_last_printed_step(tmp_path, capsys):
    lines = injob_lines()
    restored = lines[first_index(lines, "Restored all states")]
    template = lines[first_index(lines, "iteration 10/19 | lr: 1.649e-06 | consumed_samples")]

    def printed(iteration: int, seconds: float) -> str:
        return (template.replace("iteration 10/19", f"iteration {iteration}/199")
                .replace("global_step: 10 ", f"global_step: {iteration} ")
                .replace("consumed_samples: 5632", f"consumed_samples: {512 * (iteration + 1)}")
                .replace("train_step_timing in s: 10.26", f"train_step_timing in s: {seconds}"))

    processes = ["".join(printed(2 * p + i, 7.5 + p / 100) for i in (0, 1)) for p in range(51)]
    log = tmp_path / "fifty.log"
    log.write_text(processes[0] + "".join(restored + process for process in processes[1:]))
    code, err = run_import(capsys, log, out=tmp_path / "out")
    line = import_error_line(err, "fifty.log")
    assert code == 2 and "51 segments" in line and "; ... 47 more ...; 51: steps 101-102, 2 printed, lines 151-152, " \
        + STARTS.format(150) in line and len(line) < 1200
    code, err = run_import(capsys, log, "--warmup", "1", "--segment", "51", out=tmp_path / "out")
    assert code == 0, err
    assert summary_of(tmp_path / "out", "fifty")["timing"]["steps"] == [[101, 8.0], [102, 8.0]]
