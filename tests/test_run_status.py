"""Summary status when a run completes, raises, or is stopped by SIGTERM (Slurm's time limit) or
SIGINT; the summary on disk is valid JSON at every moment."""

import json
import signal
import threading
import time

import pytest

from conftest import read_json, run_train_tiny

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
