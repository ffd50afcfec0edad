"""Windows, warm-ups and unfinished segments of resumed runs in `report` and `compare`: a run's
--window means its steps across its segments, warm-ups that differ along a scaling curve are named,
and segments that failed or were interrupted count their finished steps. Summaries and steps.jsonl
are written by the package's own writers (build_summary, progress.step_rows, append_jsonl)."""

import json
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import torch

from nemo_throughput.goodput.ledger import DATA
from nemo_throughput.goodput.run import RunGoodput
from nemo_throughput.progress import step_rows
from nemo_throughput.report.grouping import build_report
from nemo_throughput.report.runs import load_run, read_steps_jsonl
from nemo_throughput.run.publishing import Publisher
from nemo_throughput.run_stats import RunStats, rank_rows
from nemo_throughput.summary import STEPS_FILE, append_jsonl, build_summary
from nemo_throughput.timing import StepTimes
from nemo_throughput.window import Window
from test_report_segments import cli, facts, write_segments

STEPS_OK = {"path": STEPS_FILE, "complete": True, "error": None}  # as run.startup records per_step_jsonl


# ------------------------------------------------------------------------------- scaling curve
def test_warm_ups_that_differ_along_a_scaling_curve_are_named(tmp_path, capsys):
    """8 and 16 GPUs, each measured after its own warm-up: the efficiency compares them, so the
    curve says that they differ, as repeats and --baseline sides do (comparable.warmup_note)."""
    small = write_segments(tmp_path / "8", [[1.0] * 8], warmup=2)
    large = write_segments(tmp_path / "16", [[1.1] * 8], warmup=4, gpus=16, gbs=256)
    report = build_report([load_run(path) for path in (*small, *large)])
    assert [g.num_gpus for g in report.groups] == [8, 16] and report.groups[1].scaling_efficiency is not None
    (note,) = report.notes
    assert note.startswith("the scaling curve of bm / gpt3-126m (8, 16 GPUs): the runs left out different numbers "
                           f"of warm-up steps before the steps they count ({small[0]}: 2 (warmup_steps 2); "
                           f"{large[0]}: 4 (warmup_steps 4))")
    same = write_segments(tmp_path / "16-same", [[1.1] * 8], warmup=2, gpus=16, gbs=256)
    assert build_report([load_run(path) for path in (*small, *same)]).notes == []
    code, _, err = cli("report", small[0], large[0], "--window", "5:", capsys=capsys)
    assert "warm-up" not in err  # one window, chosen for every run


def test_a_curve_whose_sizes_each_mix_warm_ups_is_not_named_twice(tmp_path):
    """Each size's own note already names its runs; a size whose runs agree among themselves but
    not with the others' is still named on the curve."""
    runs = [*write_segments(tmp_path / "a", [[1.0] * 8], warmup=2),
            *write_segments(tmp_path / "b", [[1.0] * 8], warmup=3),
            *write_segments(tmp_path / "c", [[1.1] * 8], warmup=2, gpus=16, gbs=256),
            *write_segments(tmp_path / "d", [[1.1] * 8], warmup=3, gpus=16, gbs=256)]
    notes = build_report([load_run(path) for path in runs]).notes
    assert len(notes) == 2 and not any("scaling curve" in note for note in notes)
    uniform = write_segments(tmp_path / "e", [[1.1] * 8], warmup=5, gpus=32, gbs=512)
    notes = build_report([load_run(path) for path in (*runs, *uniform)]).notes
    assert len(notes) == 3 and "the scaling curve of bm / gpt3-126m (8, 16, 32 GPUs)" in notes[2]


# ------------------------------------------------------------------------------- a run's segments
@dataclass(frozen=True)
class Segment:
    """One process of a resumed run: its step times, where it saved the checkpoint the next one resumes
    from (None: at its last step; 0: none, a retry that died), and how it ended."""

    times: list[float]
    checkpoint_at: int | None = None
    status: str = "completed"
    missing: str | None = None  # end.missing: steps its summary lacks


def write_run(root: Path, segments: list[Segment], warmup: int = 2, steps_file: dict | None = STEPS_OK,
              **options) -> list[Path]:
    """The run's summaries and steps.jsonl as the callback writes them: RunGoodput joins each segment
    to the checkpoint it resumed from, RunStats counts, step_rows/append_jsonl write the steps, and the
    Publisher writes the final summary with its end section."""
    paths, state, step = [], None, 0
    for number, segment in enumerate(segments, 1):
        out = root / f"segment-{number}"
        out.mkdir(parents=True)
        run_facts = replace(facts(f"{root.name}-{number}", **options), steps_jsonl=steps_file)
        goodput = RunGoodput(root, out)
        if state is not None:
            goodput.checkpoint_loaded(state)
            step = state["goodput"]["step"]
        goodput.start(step, run_facts.run_id, env={})
        stats, rows = RunStats(world_size=1, warmup_steps=warmup, start_step=step), []
        for seconds in segment.times:
            step += 1
            goodput.ledger.switch(DATA, step)
            rows.append(StepTimes(step, seconds))
            if step == (len(segment.times) + rows[0].step - 1 if segment.checkpoint_at is None
                        else segment.checkpoint_at):
                goodput.ledger.checkpoint(step)
                state = goodput.checkpoint_state()
        gathered = rank_rows([rows])
        stats.add(gathered)
        if steps_file is not None:
            append_jsonl(out / STEPS_FILE, step_rows(torch.tensor(gathered), stats, run_facts.run_id))
        section = goodput.section()
        goodput.ledger.close()
        error = None if segment.status == "completed" else "RuntimeError: NCCL watchdog timeout"
        publisher = Publisher(0, str(out))
        publisher.open()
        publisher.final(build_summary(run_facts, stats, segment.status, error, goodput=section), segment.missing)
        paths.append(out / "summary.json")
    return paths


def report_json(*args, capsys) -> tuple[int, dict | None, str]:
    code, out, err = cli("report", *args, "--format", "json", capsys=capsys)
    return code, json.loads(out) if out else None, err


def step_time(document: dict) -> float:
    (group,) = document["groups"]
    return group["step_time_s"]


# Segment 1: steps 1-6 (3-6 counted at 1.0 s); segment 2: steps 7-12 (7-8 its warm-up, 9-12 counted at 2.0 s).
TWO = [Segment([1.0] * 6), Segment([3.0, 3.0, 2.0, 2.0, 2.0, 2.0])]


def test_the_last_n_steps_are_the_run_s_last_n_across_its_segments(tmp_path, capsys):
    """-6: is the run's last 6 counted steps: segment 1's last 2 and segment 2's 4 (10 s over 6 steps),
    not each segment's last 6 (all 8 steps, 1.5 s); last is the run's last step, segment 2's."""
    paths = write_run(tmp_path / "run", TWO)
    code, document, err = report_json(tmp_path, "--window", "-6:", capsys=capsys)
    assert code == 0, err
    assert step_time(document) == pytest.approx(10.0 / 6)
    assert "counted as one run, its step time over all 8 counted steps" in err
    code, document, _ = report_json(tmp_path, "--window", "last", capsys=capsys)
    assert code == 0 and step_time(document) == pytest.approx(2.0)
    run = build_report([load_run(path, Window.parse("-5:")) for path in paths]).groups[0]
    assert run.step_time_s == pytest.approx((1.0 + 4 * 2.0) / 5)
    alone = build_report([load_run(paths[0], Window.parse("-2:"))]).groups[0]  # a segment given alone: its own
    assert alone.step_time_s == pytest.approx(1.0) and alone.files == [str(paths[0])]


def test_a_fixed_window_counts_the_same_steps_as_before_and_one_segment_may_hold_none(tmp_path, capsys):
    write_run(tmp_path / "run", TWO)
    code, document, err = report_json(tmp_path, "--window", "5:11", capsys=capsys)
    assert code == 0 and step_time(document) == pytest.approx((2 * 1.0 + 2 * 2.0) / 4)  # steps 5, 6, 9, 10
    code, document, err = report_json(tmp_path, "--window", "9:13", capsys=capsys)
    assert code == 0, err  # segment 1 holds none of steps 9-12: still the run's, not an excluded summary
    assert step_time(document) == pytest.approx(2.0) and "excluded" not in err


def test_a_window_larger_than_the_run_says_so_and_one_of_none_of_its_steps_excludes_it(tmp_path, capsys):
    paths = write_run(tmp_path / "run", TWO)
    code, document, err = report_json(tmp_path, "--window", "-100:", capsys=capsys)
    assert code == 0 and step_time(document) == pytest.approx(12.0 / 8)
    assert "--window -100: asks for its last 100 counted steps; it has 8: all of them are counted" in err
    other = write_run(tmp_path / "other", [Segment([1.5] * 30)])
    code, document, err = report_json(tmp_path, "--window", "20:30", capsys=capsys)
    assert code == 1 and document["groups"][0]["files"] == [str(other[0])]
    assert (f"excluded: run {json.loads(paths[0].read_text())['run']['id']} (segments {paths[0]}, {paths[1]}): "
            "--window 20:30 selects none of its steps (segment 1: steps 3 to 6; segment 2: steps 9 to 12)") in err
    code, _, err = cli("report", tmp_path / "run", "--window", "-0:", capsys=capsys)
    assert code == 2 and "counts no step from the end" in err


def test_a_segment_resumed_from_an_older_checkpoint_repeats_steps_and_each_execution_counts(tmp_path, capsys):
    """Segment 1 saved step 6, trained to 10 and failed; segment 2 resumed at 6: steps 7-10 twice
    (9-10 counted in both: 7-8 are segment 2's warm-up). -3: is the latest 3 trained: 10, 11, 12 of
    segment 2; 9:11 counts both executions of 9 and 10."""
    failed = Segment([1.0] * 10, checkpoint_at=6, status="failed")
    write_run(tmp_path / "run", [failed, Segment([3.0, 3.0, 2.0, 2.0, 2.0, 2.0])])
    code, document, err = report_json(tmp_path, "--window", "-3:", capsys=capsys)
    assert code == 0 and step_time(document) == pytest.approx(2.0)
    assert "segment 2 repeats counted steps 9-10 of an earlier segment (resumed from an older checkpoint)" in err
    code, document, _ = report_json(tmp_path, "--window", "9:11", capsys=capsys)
    assert step_time(document) == pytest.approx((2 * 1.0 + 2 * 2.0) / 4)
    code, document, _ = report_json(tmp_path, capsys=capsys)  # no window: every counted step of each
    assert step_time(document) == pytest.approx((8 * 1.0 + 4 * 2.0) / 12)


def test_a_segment_without_counted_steps_adds_none_and_a_run_without_any_is_excluded(tmp_path, capsys):
    paths = write_run(tmp_path / "run", [Segment([1.0] * 6), Segment([3.0, 3.0])])  # segment 2: warm-up only
    for window in ((), ("--window", "-2:")):
        code, document, err = report_json(tmp_path / "run", *window, capsys=capsys)
        assert code == 0 and step_time(document) == pytest.approx(1.0), err
        assert f"2: {paths[1]} (0 steps)" in err
    write_run(tmp_path / "short", [Segment([1.0] * 2), Segment([3.0, 3.0])])
    code, _, err = cli("report", tmp_path / "short", capsys=capsys)  # exit 1: only its goodput is reported
    assert code == 1 and "no measured steps (the run was shorter than its warm-up)" in err


def test_a_window_over_a_steps_file_that_stopped_is_refused(tmp_path, capsys):
    """The disk filled: steps.jsonl stopped while the run went on; its last N written steps are not
    the run's last N."""
    stopped = {"path": STEPS_FILE, "complete": False, "error": "OSError: [Errno 28] No space left on device"}
    write_run(tmp_path / "run", TWO, steps_file=stopped)
    code, _, err = cli("report", tmp_path, "--window", "-4:", capsys=capsys)  # exit 1: only its goodput
    assert code == 1 and "its steps.jsonl stopped before the run ended" in err and "No space left" in err
    code, document, _ = report_json(tmp_path, capsys=capsys)  # the summaries' own statistics still hold
    assert code == 0 and step_time(document) == pytest.approx(12.0 / 8)


# ------------------------------------------------------------------------------- unfinished segments
def test_an_interrupted_segment_counts_its_finished_steps_in_its_run(tmp_path, capsys):
    """A time limit stopped segment 1 (SIGTERM: interrupted) after its checkpoint: its final summary
    counts the steps it finished, as a completed segment's does; the run counts them, and says so."""
    paths = write_run(tmp_path / "run", [Segment([1.0] * 6, status="interrupted"), TWO[1]])
    code, document, err = report_json(tmp_path, capsys=capsys)
    assert code == 0, err
    assert step_time(document) == pytest.approx(12.0 / 8) and document["groups"][0]["runs"] == 1
    assert document["groups"][0]["files"] == [str(path) for path in paths]
    assert ("segment 1 ended with status interrupted: its 4 counted steps, each finished before it ended, are "
            "counted") in err
    assert "excluded" not in err
    code, document, _ = report_json(tmp_path, "--window", "-5:", capsys=capsys)
    assert step_time(document) == pytest.approx(9.0 / 5)


def test_a_failed_segment_s_missing_steps_are_named(tmp_path, capsys):
    missing = "steps 5-6: no longer held by every rank for the final exchange"
    write_run(tmp_path / "run", [Segment([1.0] * 6, status="failed", missing=missing), TWO[1]])
    code, _, err = report_json(tmp_path, capsys=capsys)
    assert code == 0 and "segment 1 ended with status failed" in err
    assert f"(its summary lacks {missing}: not counted)" in err


def test_a_run_none_of_whose_segments_completed_is_left_out_as_before(tmp_path, capsys):
    (lone,) = write_run(tmp_path / "lone", [Segment([1.0] * 6, status="failed")])
    code, _, err = cli("report", lone, capsys=capsys)  # exit 0: its goodput is reported, as before
    assert code == 0 and f"excluded: {lone}: status 'failed' (RuntimeError: NCCL watchdog timeout): only " \
                         "completed runs are reported" in err
    both = write_run(tmp_path / "both", [Segment([1.0] * 6, status="interrupted"), Segment([1.0] * 6,
                                                                                           status="failed")])
    ok = write_run(tmp_path / "ok", [Segment([1.5] * 6)])
    code, document, err = report_json(tmp_path / "both", tmp_path / "ok", capsys=capsys)
    assert code == 0 and document["groups"][0]["files"] == [str(ok[0])]
    assert (f"(1: {both[0]} (interrupted), 2: {both[1]} (failed)) all ended before the run did, none completed: only "
            "completed runs are reported") in err


def test_a_running_segment_is_still_left_out_and_the_note_says_why(tmp_path, capsys):
    """A segment killed without SIGTERM leaves its last running summary: nothing in it tells it from
    a segment still training, so it is left out and named."""
    paths = write_run(tmp_path / "run", [Segment([1.0] * 6), Segment([1.0] * 6, status="running"), TWO[1]])
    code, document, err = report_json(tmp_path, capsys=capsys)
    assert code == 0 and f"excluded: {paths[1]}: status 'running'" in err
    assert "segment(s) 2 not among them (not given, or left out: a summary still `running`" in err


def test_compare_counts_an_interrupted_segment_s_steps(tmp_path, capsys):
    write_run(tmp_path / "base", [Segment([1.0] * 6, status="interrupted"), TWO[1]])
    write_run(tmp_path / "cand", [Segment([1.0] * 6), TWO[1]])
    code, out, err = cli("compare", tmp_path / "base", tmp_path / "cand", "--format", "json", capsys=capsys)
    result = json.loads(out)
    assert result["baseline"]["runs"] == 1 and len(result["baseline"]["files"]) == 2
    assert "segment 1 ended with status interrupted" in err
    step = next(m for m in result["metrics"] if m["metric"] == "step_time_s")
    assert step["baseline_mean"] == pytest.approx(12.0 / 8) and step["candidate_mean"] == pytest.approx(12.0 / 8)


# ------------------------------------------------------------------------------- large inputs
def test_a_long_run_s_steps_jsonl_is_read_line_by_line(tmp_path):
    """A long run's steps.jsonl runs to hundreds of MB (every rank's phases on each line): it was read
    whole, its text and its lines held at once, some three times the file's size. Read line by line,
    what is held is the steps taken from it; the bound is a guard, a quarter of the file's size."""
    import tracemalloc

    ranks, steps = 8, 5_000
    stats = RunStats(world_size=ranks, warmup_steps=2, start_step=0)
    gathered = rank_rows([[StepTimes(step, 1.0 + rank / 100) for step in range(1, steps + 1)] for rank in range(ranks)])
    stats.add(gathered)
    jsonl = tmp_path / STEPS_FILE
    append_jsonl(jsonl, step_rows(torch.tensor(gathered), stats, "run-a"))
    del gathered
    tracemalloc.start()
    try:
        counted, notes = read_steps_jsonl(jsonl, "run-a")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert counted == [(step, pytest.approx(1.07)) for step in range(3, steps + 1)]
    assert notes == [f"{jsonl}: steps 1-2 are the run's warm-up (warmup_steps); left out"]
    assert peak < jsonl.stat().st_size / 4
