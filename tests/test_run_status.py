"""Summary status when a run completes, raises, or is stopped by SIGTERM (Slurm's time limit) or
SIGINT; the summary on disk is valid JSON at every moment."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from conftest import TRAIN_TINY, free_port, read_json, run_train_tiny

pytestmark = pytest.mark.slow


def wait_for_measured_steps(path, proc, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stdout.read()
        if path.exists() and read_json(path)["timing"]["steps_measured"] > 0:
            return
        time.sleep(0.05)
    raise TimeoutError("no measured steps in the summary")


class SummaryReader(threading.Thread):
    """Reads the summary as fast as it can while the run rewrites it; records any torn read."""

    def __init__(self, path):
        super().__init__(daemon=True)
        self.path, self.reads, self.torn, self.stop = path, 0, [], threading.Event()

    def run(self):
        while not self.stop.is_set():
            try:
                text = self.path.read_text()
            except FileNotFoundError:
                continue
            try:
                json.loads(text)
                self.reads += 1
            except json.JSONDecodeError:
                self.torn.append(text)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_marks_the_run_interrupted_and_keeps_its_measurements(tmp_path, sig):
    path = tmp_path / "summary.json"
    proc = run_train_tiny("--output-dir", tmp_path, "--steps", 100000, "--log-every", 1, "--warmup", 1,
                          "--step-sleep-s", 0.02)
    reader = SummaryReader(path)
    reader.start()
    try:
        wait_for_measured_steps(path, proc)
        proc.send_signal(sig)
        output, _ = proc.communicate(timeout=60)
    finally:
        reader.stop.set()
        proc.kill()
    reader.join()
    summary = read_json(path)
    assert summary["status"] == "interrupted", output
    expected = "SIGTERMException" if sig == signal.SIGTERM else "KeyboardInterrupt"
    assert summary["error"].startswith(expected)
    assert summary["timing"]["steps_measured"] > 0
    assert summary["timing"]["step_time_s"]["min"] >= 0.02
    assert reader.reads > 0 and reader.torn == []
    assert list(tmp_path.glob(".summary.json.*")) == []  # no temporary file left behind


# Slurm sends SIGKILL this long after SIGTERM (KillWait, 30 s by default); shortened in the suite,
# where the cases that hang wait all of it. tests/scripts/sigterm_repeat.py waits 20 s.
KILL_WAIT_S = float(os.environ.get("NEMO_THROUGHPUT_KILL_WAIT_S", "9"))
COLLECTIVE_TIMEOUT_S = 5  # the setting the README recommends, shortened


def launch_ranks(out, *args, world_size=2):
    """One process per rank, as srun and torchrun start them (Lightning then launches none)."""
    port = free_port()
    procs = []
    for rank in range(world_size):
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "WORLD_SIZE": str(world_size), "NODE_RANK": "0", "LOCAL_RANK": str(rank),
               "NEMO_THROUGHPUT_FINAL_EXCHANGE_TIMEOUT_S": "3"}
        command = [sys.executable, str(TRAIN_TINY), "--output-dir", out, "--devices", world_size,
                   "--steps", 100000, "--log-every", 1, "--warmup", 1, "--step-sleep-s", 0.02, *args]
        procs.append(subprocess.Popen(list(map(str, command)), env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    return procs


def launch_with_lightning(out, *args):
    """Lightning's own launcher: rank 0 starts rank 1 as its child, and forwards SIGTERM to it."""
    return [run_train_tiny("--output-dir", out, "--devices", 2, "--steps", 100000, "--log-every", 1, "--warmup", 1,
                           "--step-sleep-s", 0.02, *args, start_new_session=True)]


def sigterm_then_sigkill(procs, targets):
    """SIGTERM to the target ranks ("group": rank 0's process group); like Slurm, SIGKILL to all
    KILL_WAIT_S later. Returns how it ended."""
    if targets == "group":
        os.killpg(procs[0].pid, signal.SIGTERM)
    for rank in [] if targets == "group" else targets:
        procs[rank].send_signal(signal.SIGTERM)
    deadline = time.monotonic() + KILL_WAIT_S
    ended = "exited"
    for proc in procs:
        try:
            proc.communicate(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            ended = "killed"
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL) if targets == "group" else proc.kill()
            proc.communicate()
    return ended


# Once per case in the suite; tests/scripts/sigterm_repeat.py runs every case many times (its result is in the docs).
TRIES = int(os.environ.get("NEMO_THROUGHPUT_SIGTERM_TRIES", "1"))


@pytest.mark.parametrize("case, launch, targets, args", [
    ("every rank (Slurm's time limit, torchrun)", launch_ranks, [0, 1], []),
    ("rank 1 only, with a collective timeout", launch_ranks, [1], ["--process-group-timeout-s", COLLECTIVE_TIMEOUT_S]),
    ("rank 1 only: Lightning hangs", launch_ranks, [1], []),
    ("rank 0 under Lightning's launcher (it forwards to rank 1)", launch_with_lightning, [0], []),
    ("both under Lightning's launcher: rank 1 gets it twice, Lightning hangs", launch_with_lightning, "group", []),
])
def test_sigterm_on_two_ranks_leaves_an_interrupted_summary_every_time(tmp_path, case, launch, targets, args):
    """Lightning 2.6 broadcasts from inside its SIGTERM handler, which hangs a run whose ranks are
    not all signalled once (whatever the callbacks); the summary must say `interrupted` anyway."""
    endings, tries = [], TRIES
    for attempt in range(tries):
        out = tmp_path / f"try{attempt}"
        procs = launch(out, *args)
        try:
            wait_for_measured_steps(out / "summary.json", procs[0])
            endings.append(sigterm_then_sigkill(procs, targets))
        finally:
            for proc in procs:
                proc.kill()
        found = {path.name: read_json(path) for path in out.glob("summary*.json")}
        statuses = {name: summary["status"] for name, summary in found.items()}
        where = f"try {attempt} ({endings[-1]}): {statuses}"
        # Rank 0's summary says interrupted, or else rank 1 left its own saying so.
        written = found["summary.json"] if statuses["summary.json"] == "interrupted" else found["summary.rank1.json"]
        assert written["status"] == "interrupted", where
        assert written["timing"]["steps_measured"] > 0, where
        end = written["end"]
        assert end["all_steps_exchanged"] == (end["missing"] is None), where
        if targets == "group" or 0 in targets:
            assert statuses["summary.json"] == "interrupted", where
        assert statuses["summary.json"] in ("running", "interrupted"), where  # never completed or failed
        if end["all_steps_exchanged"] and endings[-1] == "exited":
            assert statuses == {"summary.json": "interrupted"}, where  # rank 0 had all rank 1 knew
    print(f"SIGTERM to {case}: {endings}")


def test_an_exception_marks_the_run_failed_with_the_error(tmp_path):
    proc = run_train_tiny("--output-dir", tmp_path, "--steps", 40, "--log-every", 5, "--warmup", 2,
                          "--fail-at", 13)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode != 0
    summary = read_json(tmp_path / "summary.json")
    assert summary["status"] == "failed", output
    assert summary["error"] == "RuntimeError: injected failure at step 13"
    assert summary["timing"]["last_step"] == 12  # every finished step is kept (one rank: no exchange to wait on)
    assert summary["timing"]["steps_measured"] == 10


def test_a_completed_run(tmp_path):
    proc = run_train_tiny("--output-dir", tmp_path, "--steps", 10, "--log-every", 3, "--warmup", 2)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, output
    summary = read_json(tmp_path / "summary.json")
    assert summary["status"] == "completed" and summary["error"] is None
    assert summary["timing"]["steps_measured"] == 8


@pytest.mark.slow
def test_a_rank_that_stops_making_progress_is_a_stall_with_its_stacks_and_the_run_says_so(tmp_path):
    """Two gloo ranks; rank 1 sleeps 4 s in step 12 (a hang that ends), rank 0 waits for it in the
    gradient all-reduce. The summary says stalled during the sleep; each rank's stacks are beside it,
    rank 1's naming the sleeping frame; the run completes with the stall recorded."""
    proc = run_train_tiny("--output-dir", tmp_path, "--devices", 2, "--steps", 16, "--log-every", 2, "--warmup", 1,
                          "--slow-rank", 1, "--stall-at", 12, "--stall-s", 4, "--stall-min-s", 1.0)
    stalled = None
    deadline = time.monotonic() + 90
    while stalled is None and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
        with contextlib.suppress(FileNotFoundError, json.JSONDecodeError):
            summary = read_json(tmp_path / "summary.json")
            stalled = summary if summary["status"] == "stalled" else None
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, output
    assert stalled is not None, output
    (ongoing,) = stalled["stalls"]
    assert ongoing["ongoing"] and ongoing["after_step"] == 11 and ongoing["seconds"] > 1.0
    assert ongoing["stacks"] == "stacks.rank0.txt"
    summary = read_json(tmp_path / "summary.json")
    assert summary["status"] == "completed" and summary["timing"]["last_step"] == 16
    (stall,) = summary["stalls"]
    assert not stall["ongoing"] and stall["after_step"] == 11 and 1.0 < stall["seconds"] < 4 + 5
    assert stall["since"] == ongoing["since"]
    sleeping = (tmp_path / "stacks.rank1.txt").read_text()
    assert "sleep_in_a_stalled_step" in sleeping and "training_step" in sleeping and "train_tiny.py" in sleeping
    assert "Current thread" in (tmp_path / "stacks.rank0.txt").read_text()  # every thread, the watch's own too
    for rank in (0, 1):
        assert output.count(f"rank {rank}: stalled: no step since step 11") == 1, output
        assert f"stacks.rank{rank}.txt beside the summary" in output
    assert "steps resumed after" in output
