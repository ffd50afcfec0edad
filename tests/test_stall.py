"""The stall watch's own logic, its clock given: when a silence is a stall, when it ends, what is
recorded, and where the stacks go (a planted link, a directory or a FIFO there is never written
through). A real two-rank run that stalls is in test_run_status.py."""

import os
import time

import pytest

from nemo_throughput.run.stall import StallWatch, look_every_s


class Progress:
    """The training thread's last step and the statistics' median, as the watch reads them."""

    def __init__(self, step=10, median=0.1):
        self.step, self.median = step, median


def watch(tmp_path, progress, factor=10.0, min_s=1.0, rank=0):
    return StallWatch(factor, min_s, rank, str(tmp_path), last_step=lambda: progress.step,
                      median_step_s=lambda: progress.median)


def test_a_silence_longer_than_the_threshold_is_a_stall_until_a_step_ends(tmp_path):
    progress = Progress()
    stall = watch(tmp_path, progress)
    assert stall.threshold_s() == 1.0  # 10 x 0.1 s is under the 1 s floor
    assert stall.look(now=100.0) is None and stall.look(now=100.9) is None
    assert stall.look(now=101.2) == "stalled" and stall.stalled
    assert stall.look(now=103.0) is None  # still stalled: said once
    (record,) = stall.records()
    assert record["after_step"] == 10 and record["seconds"] == 3.0 and record["ongoing"]
    assert record["stacks"] == "stacks.rank0.txt"
    progress.step = 11
    assert stall.look(now=103.5) == "resumed" and not stall.stalled
    assert stall.records()[0]["ongoing"] is False and stall.records()[0]["seconds"] == 3.0
    assert stall.look(now=104.0) is None


def test_the_threshold_is_factor_times_the_median_and_at_least_the_floor(tmp_path):
    progress = Progress(median=60.0)
    assert watch(tmp_path, progress, factor=10, min_s=300).threshold_s() == 600.0
    progress.median = 2.0
    assert watch(tmp_path, progress, factor=10, min_s=300).threshold_s() == 300.0


def test_no_stall_before_the_median_is_known_nor_after_the_watch_stopped(tmp_path):
    progress = Progress(median=None)  # warm-up and compilation: not usual steps yet
    stall = watch(tmp_path, progress)
    assert stall.look(now=0.0) is None and stall.look(now=10_000.0) is None
    progress.median = 0.1
    stall.stopped = True  # training ended: the final exchange may take long
    assert stall.look(now=20_000.0) is None and stall.records() == []


def test_a_stall_whose_steps_resumed_within_the_last_look_before_the_end_is_over(tmp_path):
    progress = Progress()
    stall = watch(tmp_path, progress)
    stall.look(now=0.0)
    assert stall.look(now=2.0) == "stalled"
    progress.step = 14  # the hang ended, and the last steps ran before the next look
    assert stall.stop() == "resumed"  # said like a look's "resumed": the run's log shows the stall ended
    assert stall.records()[0]["ongoing"] is False and stall.look(now=3.0) is None
    hung = watch(tmp_path, Progress())
    hung.look(now=0.0)
    assert hung.look(now=2.0) == "stalled"
    assert hung.stop() is None  # the run ends (fails) while no step has ended: the stall was never over
    assert hung.records()[0]["ongoing"] is True


def test_every_stall_is_appended_to_the_rank_s_stacks_with_every_thread(tmp_path):
    progress = Progress()
    stall = watch(tmp_path, progress, rank=3)
    for start in (0.0, 3.5):  # the second silence starts when the first stall ended
        stall.look(now=start)
        assert stall.look(now=start + 2) == "stalled"
        progress.step += 1
        assert stall.look(now=start + 3) == "resumed"
    text = (tmp_path / "stacks.rank3.txt").read_text()
    assert text.count("=== rank 3: no step since step") == 2
    assert "test_every_stall_is_appended" in text  # this thread's frame: the stacks are real
    assert [r["after_step"] for r in stall.records()] == [10, 11]


@pytest.mark.parametrize("planted", ["link", "directory", "fifo"])
def test_a_link_directory_or_fifo_at_the_stacks_path_is_never_written_through(tmp_path, planted, caplog):
    outside = tmp_path / "outside.txt"
    outside.write_text("not ours\n")
    out = tmp_path / "out"
    out.mkdir()
    path = out / "stacks.rank0.txt"
    {"link": lambda: path.symlink_to(outside), "directory": path.mkdir, "fifo": lambda: os.mkfifo(path)}[planted]()
    progress = Progress()
    stall = watch(out, progress)
    stall.look(now=0.0)
    started = time.monotonic()
    assert stall.look(now=2.0) == "stalled"  # a FIFO with no reader does not block the watch
    assert time.monotonic() - started < 5
    assert stall.records()[0]["stacks"] is None
    assert outside.read_text() == "not ours\n"
    assert "its threads' stacks could not be written" in caplog.text


def test_looks_are_a_twentieth_of_the_shortest_stall_within_bounds():
    assert look_every_s(300) == 5.0 and look_every_s(20) == 1.0 and look_every_s(0.1) == 0.05
