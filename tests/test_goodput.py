"""Goodput across restarts: a real 2-rank Lightning run with checkpoints, killed with SIGKILL between
two log steps and resumed from its last checkpoint, read back as one run of two segments with the
lost steps known exactly; and the ledger arithmetic on its own."""

import json
import shutil
import signal
import time
from pathlib import Path

import pytest
import torch

from conftest import nemo_throughput_cli, read_json, run_train_tiny
from nemo_throughput.goodput.ledger import CATEGORIES, DATA, LEDGER_FILE, RUN_FILE, Segment, read_ledger, stitch
from nemo_throughput.goodput.segments import previous_segment, run_segments, scheduler_key

STEPS, CHECKPOINT_EVERY, KILL_AT = 20, 5, 13  # log steps 4, 8, 12, 16; checkpoints at 5 and 10


def train(out, *args, **popen):
    proc = run_train_tiny("--output-dir", out, "--steps", STEPS, "--log-every", 4, "--warmup", 1,
                          "--checkpoint-every", CHECKPOINT_EVERY, *args, start_new_session=True, **popen)
    output, _ = proc.communicate(timeout=240)
    return proc.returncode, output


def tree(directory):
    return {path.relative_to(directory): path.read_bytes() for path in sorted(directory.rglob("*")) if path.is_file()}


@pytest.mark.slow
@pytest.mark.invalid_summaries  # one hand-edited summary, refused by the report
def test_a_run_killed_and_resumed_from_its_checkpoint_is_one_run_of_two_segments(tmp_path):
    """A run killed after step 13 (checkpoints of 5 and 10). Its directory copied and the copy
    resumed: the original is left byte for byte, the copy's goodput holds both segments. The original
    then moved and resumed: one run of two segments, its first found where it lies now."""
    run = tmp_path / "run"
    returncode, output = train(run, "--kill-at", KILL_AT)
    assert returncode == -signal.SIGKILL, output
    killed = read_ledger(run / LEDGER_FILE)  # what the dead segment's memory-mapped ledger kept
    assert (killed.first_step, killed.last_step) == (0, KILL_AT)
    assert [step for step, *_ in killed.checkpoints] == [5, 10]
    first_summary = json.loads((run / "summary.json").read_text())  # its last running summary stays
    assert first_summary["status"] == "running"

    before, copy = tree(run), tmp_path / "copy"
    assert RUN_FILE in {str(path) for path in before}  # the killed segment's own goodput.json
    shutil.copytree(run, copy, symlinks=True)
    returncode, output = train(copy, "--resume")
    assert returncode == 0, output
    assert tree(run) == before
    copied = json.loads((copy / RUN_FILE).read_text())
    assert copied["run_id"] == killed.run_id and copied["segments"][0]["dir"] == str(copy)
    assert [row["joined_by"] for row in copied["segments"]] == [None, "checkpoint"]

    out = tmp_path / "moved"
    run.rename(out)
    returncode, output = train(out, "--resume")
    assert returncode == 0, output
    (second_dir,) = [path.parent for path in out.glob(f"*/{LEDGER_FILE}")]
    resumed = read_ledger(second_dir / LEDGER_FILE)
    assert (resumed.first_step, resumed.last_step) == (10, STEPS)
    summary = read_json(second_dir / "summary.json")
    assert summary["status"] == "completed" and summary["goodput"]["segment"] == 2
    assert summary["goodput"]["run_id"] == first_summary["run"]["id"] != summary["run"]["id"]
    assert "continues run " + first_summary["run"]["id"] in output

    goodput = json.loads((out / RUN_FILE).read_text())
    assert Path(summary["goodput"]["file"]) == Path("..") / RUN_FILE
    assert {k: v for k, v in summary["goodput"].items() if k not in ("file", "segment")} == \
        {k: v for k, v in goodput.items() if k != "schema"}
    first, second = goodput["segments"]
    assert first["dir"] == str(out) and second["run_id"] != copied["segments"][1]["run_id"] and goodput["notes"] == []
    # Steps 11-13 were trained after the checkpoint of step 10 and again after the restart.
    assert (first["lost_steps"], first["lost_estimated"], second["lost_steps"]) == (3, False, 0)
    _, step_at_10, data_at_10 = killed.checkpoints[-1]
    lost_s = killed.seconds["step"] - step_at_10 + killed.seconds["data"] - data_at_10
    assert first["lost_s"] == pytest.approx(lost_s, rel=1e-12) and lost_s > 0
    assert goodput["steps"] == {"trained": KILL_AT + STEPS - 10, "lost": 3, "last": STEPS}
    seconds = goodput["seconds"]
    assert set(seconds) == set(CATEGORIES) and all(value >= 0 for value in seconds.values())
    assert seconds["productive"] == pytest.approx(killed.seconds["step"] + resumed.seconds["step"]
                                                  - (killed.seconds["step"] - step_at_10), rel=1e-12)
    assert seconds["lost"] == pytest.approx(lost_s, rel=1e-12)
    assert seconds["restart"] == pytest.approx(resumed.started_epoch_s - killed.last_epoch_s, rel=1e-12)
    assert seconds["startup"] > 0 and seconds["checkpoint"] > 0
    # Every second from the first process start to the last event is in one category.
    assert sum(seconds.values()) == pytest.approx(goodput["wall_s"], rel=1e-6)
    assert goodput["goodput_pct"] == pytest.approx(100 * seconds["productive"] / goodput["wall_s"])

    # The report: one row for the run (from its latest segment's summary), hours by category.
    report = nemo_throughput_cli("report", out, "--format", "json")
    (row,) = json.loads(report.stdout)["goodput"]
    assert row == {"run_id": goodput["run_id"], "segments": 2, "steps_last": STEPS, "steps_lost": 3,
                   "wall_h": goodput["wall_s"] / 3600, "goodput_pct": goodput["goodput_pct"],
                   **{f"{category}_h": seconds[category] / 3600 for category in CATEGORIES}}
    assert "only completed runs are reported" in report.stderr  # the killed segment's own summary

    # A hand-edited section is refused, naming the file and the field, not taken (nor a traceback).
    hostile = first_summary | {"goodput": {**summary["goodput"], "wall_s": "1e9", "run_id": "edited"}}
    (tmp_path / "edited").mkdir()
    (tmp_path / "edited" / "summary.json").write_text(json.dumps(hostile))
    report = nemo_throughput_cli("report", out, tmp_path / "edited", "--format", "json")
    assert [row["run_id"] for row in json.loads(report.stdout)["goodput"]] == [goodput["run_id"]]
    assert "excluded from goodput: " in report.stderr and "goodput.wall_s" in report.stderr
    assert "Traceback" not in report.stderr


def segment(directory, first, last, seconds, checkpoints=(), started=0.0, run_id="r1", key=None):
    wall = sum(seconds.values())
    return Segment(Path(directory), {"run_id": run_id, "scheduler_key": key}, started, started + wall, first, last,
                   {"startup": 0.0, "data": 0.0, "step": 0.0, "validation": 0.0, "checkpoint": 0.0, **seconds},
                   list(checkpoints))


def test_lost_steps_are_priced_at_the_checkpoint_resumed_from_else_estimated_and_flagged():
    a = segment("a", 0, 30, {"startup": 5.0, "step": 30.0, "data": 3.0, "checkpoint": 2.0},
                checkpoints=[(10, 10.0, 1.0), (20, 20.0, 2.0)])
    b = segment("b", 20, 25, {"startup": 4.0, "step": 5.0, "data": 1.0}, started=a.last_epoch_s + 60)
    c = segment("c", 22, 40, {"startup": 4.0, "step": 18.0, "data": 2.0}, started=b.last_epoch_s + 6)
    goodput = stitch([a, b, c])
    rows = goodput["segments"]
    # a: steps 21-30 lost, priced from its checkpoint of step 20: (30 - 20) + (3 - 2) seconds.
    assert (rows[0]["lost_steps"], rows[0]["lost_s"], rows[0]["lost_estimated"]) == (10, 11.0, False)
    # b resumed at 20 and c at 22: b's steps 23-25 lost, no checkpoint of 22 in b: 3/5 of its step and data.
    assert (rows[1]["lost_steps"], rows[1]["lost_s"], rows[1]["lost_estimated"]) == (3, 3.0 + 0.6, True)
    assert rows[2]["lost_steps"] == 0
    assert goodput["seconds"] == pytest.approx({"productive": 30 + 5 + 18 - 10 - 3, "startup": 13.0,
                                                "data": 3 + 1 + 2 - 1 - 0.6, "validation": 0.0, "checkpoint": 2.0,
                                                "lost": 11 + 3.6, "restart": 66.0})
    assert goodput["wall_s"] == pytest.approx(sum(goodput["seconds"].values()))
    assert goodput["steps"] == {"trained": 30 + 5 + 18, "lost": 13, "last": 40}


def test_a_segment_resumed_from_an_older_checkpoint_loses_every_step_after_it():
    a = segment("a", 0, 10, {"step": 10.0}, checkpoints=[(5, 5.0, 0.0)])
    b = segment("b", 10, 12, {"step": 2.0}, started=20.0)
    c = segment("c", 5, 12, {"step": 7.0}, started=40.0)  # resumed from a's step 5: a's 6-10 and all of b lost
    rows = stitch([a, b, c])["segments"]
    assert [(r["lost_steps"], r["lost_s"]) for r in rows] == [(5, 5.0), (2, 2.0), (0, 0.0)]


@pytest.mark.parametrize("env, expected", [
    ({"SLURM_JOB_ID": "42", "SLURM_CLUSTER_NAME": "c", "SLURM_RESTART_COUNT": "2"}, ("slurm:c:42", 2)),
    ({"SLURM_JOB_ID": "43", "SLURM_ARRAY_JOB_ID": "40", "SLURM_ARRAY_TASK_ID": "3"}, ("slurm::40_3", 0)),
    ({"KUBERNETES_SERVICE_HOST": "10.0.0.1", "JOB_NAME": "gpt", "POD_NAMESPACE": "ml"}, ("kubernetes:ml/gpt", 0)),
    ({}, (None, 0)),
    ({"SLURM_JOB_ID": "44", "SLURM_RESTART_COUNT": "²"}, ("slurm::44", 0)),  # not a count: no restart taken
])
def test_the_scheduler_names_the_job_across_its_restarts(env, expected):
    assert scheduler_key(env) == expected


def test_only_a_resumed_or_restarted_segment_continues_an_earlier_one(tmp_path):
    """A repeat of a benchmark in the same directory (step 0, no restart) is a new run; a resume is not."""
    from nemo_throughput.goodput.ledger import Ledger

    earlier = tmp_path / "first"
    earlier.mkdir()
    ledger = Ledger(earlier)
    ledger.start_training(0, {"run_id": "first", "scheduler_key": None, "root": str(tmp_path)})
    for step in range(1, 9):
        ledger.switch(DATA, step)
    ledger.close()
    own = tmp_path / "second"
    assert previous_segment(tmp_path, own, None, restarts=0, first_step=0) is None
    assert previous_segment(tmp_path, own, None, restarts=0, first_step=5).run_id == "first"
    assert previous_segment(tmp_path, own, None, restarts=0, first_step=9) is None  # trained past nothing it has
    assert previous_segment(tmp_path, own, "slurm::7", restarts=1, first_step=0) is None  # another job's


def test_a_ledger_that_is_not_ours_or_cut_short_is_not_a_segment(tmp_path):
    from nemo_throughput.goodput.ledger import Ledger

    (tmp_path / LEDGER_FILE).write_bytes(b"NTGOODPT" + b"\xff" * 100)  # cut short
    assert read_ledger(tmp_path / LEDGER_FILE) is None
    ledger = Ledger(tmp_path)
    ledger.start_training(3, {"run_id": 7, "root": str(tmp_path)})  # an identity not written by a run
    ledger.close()
    assert read_ledger(tmp_path / LEDGER_FILE) is None
    assert previous_segment(tmp_path, tmp_path / "other", None, restarts=0, first_step=3) is None


def test_no_ledger_under_the_root_can_stall_or_break_a_resume(tmp_path):
    """Beside the segment a resume continues: a ledger of NaN numbers, one cut short, a FIFO, a link to
    /dev/zero, a directory, a huge file and a link to a real ledger elsewhere. None is a segment, the
    real one is found, and the search returns at once (a FIFO would block a plain read forever)."""
    import os
    import struct
    import threading

    from nemo_throughput.goodput.ledger import Ledger

    def ledger_in(directory, run_id):
        directory.mkdir(parents=True)
        ledger = Ledger(directory)
        ledger.start_training(0, {"run_id": run_id, "scheduler_key": None, "root": str(tmp_path)})
        for step in range(1, 9):
            ledger.switch(DATA, step)
        ledger.close()
        return directory / LEDGER_FILE

    ledger_in(tmp_path / "first", "first")
    nan = bytearray(ledger_in(tmp_path / "nan", "nan").read_bytes())
    nan[8:16] = struct.pack("d", float("nan"))  # the start time
    (tmp_path / "nan" / LEDGER_FILE).write_bytes(bytes(nan))
    (tmp_path / "cut").mkdir()
    (tmp_path / "cut" / LEDGER_FILE).write_bytes(nan[:2000])
    (tmp_path / "fifo").mkdir()
    os.mkfifo(tmp_path / "fifo" / LEDGER_FILE)
    (tmp_path / "zero").mkdir()
    (tmp_path / "zero" / LEDGER_FILE).symlink_to("/dev/zero")
    (tmp_path / "directory" / LEDGER_FILE).mkdir(parents=True)
    (tmp_path / "huge").mkdir()
    with open(tmp_path / "huge" / LEDGER_FILE, "wb") as huge:
        huge.truncate(1 << 33)  # 8 GiB, sparse
    elsewhere = ledger_in(tmp_path.parent / f"{tmp_path.name}-elsewhere" / "run", "elsewhere")
    (tmp_path / "link").mkdir()
    (tmp_path / "link" / LEDGER_FILE).symlink_to(elsewhere)

    found = []
    search = threading.Thread(target=lambda: found.append(
        previous_segment(tmp_path, tmp_path / "own", None, restarts=0, first_step=5)), daemon=True)
    search.start()
    search.join(timeout=30)
    assert not search.is_alive(), "the search for the segment to continue hangs"
    assert found[0] is not None and found[0].run_id == "first"
    for name in ("nan", "cut", "fifo", "zero", "directory", "huge", "link"):
        assert read_ledger(tmp_path / name / LEDGER_FILE) is None, name


def test_a_ledger_path_that_is_a_link_is_refused_and_its_target_left_alone(tmp_path):
    from nemo_throughput.goodput.ledger import Ledger

    target = tmp_path / "someone-elses.json"
    target.write_text('{"keep": true}')
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / LEDGER_FILE).symlink_to(target)
    with pytest.raises(OSError):
        Ledger(tmp_path / "run")
    assert target.read_text() == '{"keep": true}'


def test_a_host_clock_behind_neither_reorders_the_segments_nor_shrinks_the_wall_time(tmp_path):
    """The second segment's host runs an hour behind: its ledger still says it is segment 2, the
    wall time is each segment's span by its own clock (the restart between them unknown, and said
    so), and goodput stays what the segments' own seconds give."""
    from nemo_throughput.goodput.ledger import Ledger

    def ledger(directory, segment_number, started, first, last):
        directory.mkdir()
        writer = Ledger(directory, started_epoch_s=started)
        writer.start_training(first, {"run_id": "r", "segment": segment_number, "scheduler_key": None,
                                      "root": str(tmp_path)})
        for step in range(first + 1, last + 1):
            writer.step_starts()
            time.sleep(0.002)
            writer.switch(DATA, step)
        writer.close()

    now = time.time()
    ledger(tmp_path / "a", 1, now - 60, 0, 10)  # its own clock
    ledger(tmp_path / "b", 2, now - 3600 - 5, 10, 20)  # an hour behind
    segments = run_segments(tmp_path, "r")
    assert [s.identity["segment"] for s in segments] == [1, 2]
    goodput = stitch(segments)
    spans = sum(s.last_epoch_s - s.started_epoch_s for s in segments)
    assert goodput["wall_s"] == pytest.approx(spans) and goodput["seconds"]["restart"] == 0
    assert goodput["clock_notes"][0].startswith("segment 2 started ") and "clocks disagree" in goodput["clock_notes"][0]
    assert goodput["wall_s"] == pytest.approx(sum(goodput["seconds"].values()))
    assert 0 < goodput["goodput_pct"] <= 100


def test_a_step_start_is_written_with_the_step_s_end_or_the_next_event(tmp_path, monkeypatch):
    """An ordinary step writes the mapped page once: its start stays in memory until its end, which
    stores both; a segment killed within the step reads as of the step before. Any other event
    (a validation) stores a pending start first. Seconds from a clock the test moves."""
    import nemo_throughput.goodput.ledger as goodput

    clock = [100.0]
    monkeypatch.setattr(goodput.time, "monotonic", lambda: clock[0])
    ledger = goodput.Ledger(tmp_path, started_epoch_s=time.time())
    ledger.start_training(0, {"run_id": "r", "root": str(tmp_path)})

    def seconds():
        return read_ledger(tmp_path / LEDGER_FILE).seconds

    before = seconds()
    clock[0] += 2  # waiting for data
    ledger.step_starts()
    clock[0] += 3
    ledger.step_starts()  # another micro-batch of the step: the first start stands
    clock[0] += 5
    assert seconds() == before  # nothing written within the step: a kill here reads as the step before
    ledger.switch(DATA, 1)
    after = read_ledger(tmp_path / LEDGER_FILE)
    assert after.last_step == 1
    assert after.seconds["data"] - before["data"] == 2 and after.seconds["step"] - before["step"] == 8
    clock[0] += 1
    ledger.step_starts()
    clock[0] += 4
    ledger.switch(goodput.VALIDATION)  # a pending start is stored before the event's own switch
    clock[0] += 6
    ledger.switch(goodput.DATA)
    ledger.close()
    final = read_ledger(tmp_path / LEDGER_FILE).seconds
    assert final["data"] - after.seconds["data"] == 1 and final["step"] - after.seconds["step"] == 4
    assert final["validation"] == 6


# ----------------------------------------------------------------------- which run a resume continues
def ledger_of(directory, run_id, first, last, segment=1, parent=None, checkpoints=(), started=None, key=None):
    """A segment's ledger as a run writes it, trained from ``first`` to ``last``."""
    from nemo_throughput.goodput.ledger import Ledger

    directory.mkdir(parents=True, exist_ok=True)
    writer = Ledger(directory, started_epoch_s=started)
    writer.start_training(first, {"run_id": run_id, "segment_run_id": f"{run_id}-{segment}-{directory.name}",
                                  "segment": segment, "scheduler_key": key, "parent": parent, "root": "/gone"})
    for step in range(first + 1, last + 1):
        writer.switch(DATA, step)
        if step in checkpoints:
            writer.checkpoint(step)
    writer.close()
    return read_ledger(directory / LEDGER_FILE)


def test_two_runs_that_could_each_be_resumed_without_the_checkpoint_s_word_start_a_new_run(tmp_path, caplog):
    """Two runs in one root trained past step 10; a resume at step 10 whose checkpoint says nothing (a
    Megatron-Bridge run, a checkpoint of an earlier version) continues neither: a warning names both."""
    from nemo_throughput.goodput.run import RunGoodput
    from nemo_throughput.goodput.segments import bind

    ledger_of(tmp_path, "x", 0, 13)
    ledger_of(tmp_path / "y", "y", 0, 12)
    with caplog.at_level("WARNING"):
        binding = bind(tmp_path, tmp_path / "z", None, restarts=0, first_step=10)
    assert binding.previous is None and binding.earlier == []
    assert "runs x, y under " in binding.notes[0] and "starts a new run" in binding.notes[0]
    assert "runs x, y under " in caplog.text
    (tmp_path / "z").mkdir()
    run = RunGoodput(tmp_path, tmp_path / "z")
    assert run.start(10, "z", env={}) is None
    section = run.section()
    assert section["run_id"] == "z" and section["segment"] == 1 and "runs x, y" in section["notes"][0]
    # One run that trained that far is continued, as before.
    assert bind(tmp_path, tmp_path / "z", None, restarts=0, first_step=13).previous.run_id == "x"


def test_the_checkpoint_s_run_is_continued_whatever_else_lies_in_the_root(tmp_path):
    """The checkpoint names run x and the segment that saved it: x is continued though y is later, and
    a segment of x whose saver is gone still joins x, saying so; a run with no ledger here starts anew."""
    from nemo_throughput.goodput.segments import Resumed, bind

    x = ledger_of(tmp_path, "x", 0, 13, checkpoints=(5, 10))
    ledger_of(tmp_path / "y", "y", 0, 13, checkpoints=(5, 10))  # later, and trained as far
    resumed = Resumed.from_state({"goodput": {"run_id": "x", "segment_run_id": x.identity["segment_run_id"],
                                              "step": 10}})
    binding = bind(tmp_path, tmp_path / "own", None, 0, 10, resumed)
    assert (binding.previous, binding.earlier, binding.joined_by, binding.notes) == (x, [x], "checkpoint", [])
    gone = bind(tmp_path, tmp_path / "own", None, 0, 10, Resumed("x", "deleted", 10))
    assert gone.previous == x and "(deleted) has no ledger" in gone.notes[0]
    elsewhere = bind(tmp_path, tmp_path / "own", None, 0, 10, Resumed("w", "w", 10))
    assert elsewhere.previous is None and "saved by run w" in elsewhere.notes[0]


@pytest.mark.parametrize("state", [
    None, [], {"goodput": "x"}, {"goodput": {"run_id": "x"}}, {"goodput": {"run_id": "x" * 300, "segment_run_id": "s"}},
    {"goodput": {"run_id": "x\x1b[31m", "segment_run_id": "s"}}, {"goodput": {"run_id": 7, "segment_run_id": "s"}},
])
def test_a_checkpoint_state_not_written_by_a_run_says_nothing(state):
    from nemo_throughput.goodput.segments import Resumed

    assert Resumed.from_state(state) is None
    assert Resumed.from_state({"goodput": {"run_id": "x", "segment_run_id": "s", "step": True}}).step is None


def test_a_checkpoint_resumed_twice_is_two_branches_and_a_retry_that_died_is_lost_time(tmp_path):
    """Run r: segment 1 saved step 10; segment 2a resumed from it and saved 15; segment 2b resumed from
    10 again (a branch: 2a is left out, said so); segment 2c resumed from 10 and died before saving (a
    retry: its time is lost, kept)."""
    from nemo_throughput.goodput.segments import Resumed, bind

    now = time.time()
    one = ledger_of(tmp_path, "r", 0, 13, checkpoints=(5, 10), started=now - 100)
    ledger_of(tmp_path / "a", "r", 10, 20, segment=2, parent=one.identity["segment_run_id"], checkpoints=(15,),
              started=now - 80)
    died = ledger_of(tmp_path / "c", "r", 10, 12, segment=2, parent=one.identity["segment_run_id"], started=now - 60)
    binding = bind(tmp_path, tmp_path / "b", None, 0, 10, Resumed("r", one.identity["segment_run_id"], 10))
    assert binding.previous == one and binding.earlier == [one, died]
    assert any("another branch of run r" in note and str(tmp_path / "a") in note for note in binding.notes)
    rows = stitch([*binding.earlier, ledger_of(tmp_path / "b", "r", 10, 20, segment=3)])["segments"]
    assert [row["lost_steps"] for row in rows] == [3, 2, 0]


def test_segments_that_share_a_number_or_have_none_are_ordered_by_their_steps_not_their_clocks(tmp_path):
    """Ledgers that do not say which segment they are (hand-written, or both copies of one checkpoint's
    resume): the one that started at an earlier step goes first though its host's clock says it started
    an hour later; the clocks' disagreement is noted and the restart between them not counted."""
    from nemo_throughput.goodput.segments import run_history

    now = time.time()
    late_clock = ledger_of(tmp_path / "a", "r", 0, 10, segment=0, started=now - 60)
    early_clock = ledger_of(tmp_path / "b", "r", 10, 20, segment=0, started=now - 3600)
    ordered, notes = run_history([early_clock, late_clock])
    assert ordered == [late_clock, early_clock] and "2 segments say they are segment 0" in notes[0]
    goodput = stitch(ordered, notes)
    assert goodput["seconds"]["restart"] == 0 and "clocks disagree" in goodput["clock_notes"][0]
    assert goodput["notes"] == notes


def test_a_copy_of_a_ledger_beside_the_original_counts_once(tmp_path):
    import shutil

    from nemo_throughput.goodput.segments import segments_under

    ledger_of(tmp_path / "run", "r", 0, 10)
    shutil.copytree(tmp_path / "run", tmp_path / "run-copy")
    segments, notes = segments_under(tmp_path, tmp_path / "own")
    assert [s.directory for s in segments] == [tmp_path / "run"] and "is a copy of the one in" in notes[0]


def test_no_directory_under_the_root_can_stall_fail_or_lead_the_search_out_of_it(tmp_path, monkeypatch):
    """A symlink loop, a link to a directory elsewhere holding another run's ledger, a directory named
    like a ledger, an unreadable directory, a FIFO, more entries than are read: the real segment is
    found, the rest is no segment, and a huge directory is searched in part, noted."""
    import os

    from nemo_throughput.goodput import segments as goodput_segments
    from nemo_throughput.goodput.segments import bind, segments_under

    ledger_of(tmp_path / "real", "r", 0, 13)
    ledger_of(tmp_path.parent / f"{tmp_path.name}-other" / "run", "other", 0, 20)
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    (tmp_path / "elsewhere").symlink_to(tmp_path.parent / f"{tmp_path.name}-other" / "run")
    (tmp_path / LEDGER_FILE).mkdir()  # the root's own ledger path a directory
    (tmp_path / "closed").mkdir()
    ledger_of(tmp_path / "closed" / "inner", "hidden", 0, 20)
    os.chmod(tmp_path / "closed", 0)
    os.mkfifo(tmp_path / "fifo")
    try:
        segments, notes = segments_under(tmp_path, tmp_path / "own")
        assert [s.run_id for s in segments] == ["r"] and notes == []
        assert bind(tmp_path, tmp_path / "own", None, 0, 10).previous.run_id == "r"
        for name in range(30):
            (tmp_path / f"empty{name:02}").mkdir()
        monkeypatch.setattr(goodput_segments, "MAX_ENTRIES", 20)
        segments, notes = segments_under(tmp_path, tmp_path / "own")
        assert "only the first 20 entries" in notes[0]
    finally:
        os.chmod(tmp_path / "closed", 0o755)
    # A root that is gone, or a file: no segment, a note, no exception.
    assert "could not be searched" in segments_under(tmp_path / "gone", tmp_path / "own")[1][0]
    assert "could not be searched" in segments_under(tmp_path / "fifo", tmp_path / "own")[1][0]


def test_an_unreadable_directory_under_the_root_is_no_segment(tmp_path):
    import os

    from nemo_throughput.goodput.segments import segments_under

    if os.geteuid() == 0:
        pytest.skip("running as root: a directory's permissions do not stop root from reading it")
    ledger_of(tmp_path / "closed", "hidden", 0, 20)
    os.chmod(tmp_path / "closed", 0)
    try:
        assert segments_under(tmp_path, tmp_path / "own") == ([], [])
    finally:
        os.chmod(tmp_path / "closed", 0o755)


def test_a_failing_search_or_a_first_segment_outside_the_root_never_fails_the_run_or_writes_outside(
        tmp_path, monkeypatch):
    """The search for earlier segments raising (whatever another's file did): a new run, noted. A
    first segment whose directory lies outside this segment's root: goodput.json goes into this
    segment's own directory, said so, and the other directory is left untouched."""
    from nemo_throughput.goodput import run as goodput_run
    from nemo_throughput.goodput.segments import Binding

    def failing(*args):
        raise RecursionError("deep")

    monkeypatch.setattr(goodput_run, "bind", failing)
    (tmp_path / "root2" / "own").mkdir(parents=True)
    (tmp_path / "root").mkdir()
    run = goodput_run.RunGoodput(tmp_path / "root", tmp_path / "root")
    assert run.start(10, "new", env={}) is None
    assert run.section()["run_id"] == "new" and "failed (RecursionError)" in run.section()["notes"][0]

    outside = ledger_of(tmp_path / "outside", "r", 0, 13)
    monkeypatch.setattr(goodput_run, "bind", lambda *args: Binding(outside, [outside], "checkpoint", []))
    run = goodput_run.RunGoodput(tmp_path / "root2", tmp_path / "root2" / "own")
    assert run.start(10, "own", env={}) == outside
    section = run.section()
    assert section["file"] == RUN_FILE and (tmp_path / "root2" / "own" / RUN_FILE).exists()
    assert not (tmp_path / "outside" / RUN_FILE).exists() and "lies outside" in section["notes"][-1]
    assert [row["dir"] for row in section["segments"]] == [str(tmp_path / "outside"), str(tmp_path / "root2" / "own")]


def test_a_long_output_path_still_fits_the_ledger(tmp_path):
    from nemo_throughput.goodput.run import RunGoodput

    run = RunGoodput("/" + "d" * 4000, tmp_path)  # the root is only recorded, never searched through here
    run._root = str(tmp_path)
    run.start(0, "r", env={})
    assert read_ledger(tmp_path / LEDGER_FILE).identity["root"] == str(tmp_path)
    (tmp_path / "b").mkdir()
    long_root = RunGoodput(tmp_path, tmp_path / "b")
    long_root._root = str(tmp_path / ("d" * 4000))
    long_root.start(0, "r", env={})
    assert read_ledger(tmp_path / "b" / LEDGER_FILE).identity["root"] == ""


def fit(root, checkpoints, steps, resume_from=None):
    """A real Lightning run in this process, with the callback, saving a checkpoint every 5 steps; its
    summary. Its segment starts now (the process started long before: in-process segments would overlap)."""
    import pytorch_lightning as pl

    from conftest import tiny_gpt_cfg
    from nemo_throughput import ThroughputCallback
    from nemo_throughput.demo.gpt import DemoGPT

    callback = ThroughputCallback(output_dir=str(root), log_every_n_steps=4, warmup_steps=1)
    saving = pl.callbacks.ModelCheckpoint(dirpath=checkpoints, every_n_train_steps=5, save_top_k=-1)
    pl.Trainer(max_steps=steps, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
               enable_model_summary=False, callbacks=[callback, saving], default_root_dir=root,
               ).fit(DemoGPT(tiny_gpt_cfg(global_batch_size=2)), ckpt_path=resume_from)
    return read_json(callback.summary_path)


def test_two_runs_in_one_root_each_resumed_continue_their_own_by_their_checkpoints(tmp_path, monkeypatch):
    """Runs x and y share an output root and both trained past step 10; each resumed from its own
    checkpoint of step 10 continues its own run (the latest ledger there would have been y's, for both)."""
    from nemo_throughput.goodput import ledger as goodput

    monkeypatch.setattr(goodput, "process_start_epoch_s", time.time)
    root = tmp_path / "root"
    x = fit(root, tmp_path / "x", 13)
    y = fit(root, tmp_path / "y", 13)
    assert x["run"]["id"] != y["run"]["id"]
    saved = torch.load(tmp_path / "x" / "epoch=0-step=10.ckpt", weights_only=False)["nemo_throughput"]["goodput"]
    assert saved["run_id"] == x["run"]["id"] and saved["step"] == 10  # the checkpoint's own key says which run
    resumed_x = fit(root, tmp_path / "x", 15, resume_from=tmp_path / "x" / "epoch=0-step=10.ckpt")
    resumed_y = fit(root, tmp_path / "y", 15, resume_from=tmp_path / "y" / "epoch=0-step=10.ckpt")
    for first, resumed in ((x, resumed_x), (y, resumed_y)):
        goodput = resumed["goodput"]
        assert goodput["run_id"] == first["run"]["id"] and goodput["segment"] == 2, goodput
        assert [row["run_id"] for row in goodput["segments"]] == [first["run"]["id"], resumed["run"]["id"]]
        assert [row["joined_by"] for row in goodput["segments"]] == [None, "checkpoint"]
        assert goodput["steps"] == {"trained": 13 + 5, "lost": 3, "last": 15} and goodput["notes"] == []
    # x's checkpoint of step 10 resumed again, though x's second segment saved step 15: another branch.
    branch = fit(root, tmp_path / "x", 12, resume_from=tmp_path / "x" / "epoch=0-step=10.ckpt")["goodput"]
    assert [row["run_id"] for row in branch["segments"]] == [x["run"]["id"], branch["segments"][1]["run_id"]]
    assert branch["segment"] == 2 and branch["steps"] == {"trained": 13 + 2, "lost": 3, "last": 12}
    assert len(branch["notes"]) == 1 and "another branch of run " + x["run"]["id"] in branch["notes"][0]
