"""The README's demo command, end to end: 2 gloo ranks, +callbacks=throughput, a summary, and a clean console."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from conftest import nemo_throughput_cli


def repeated_lines(text: str) -> list[str]:
    """Lines printed more than once, leaving out blank and punctuation-only lines (rules, separators)."""
    counts = Counter(line for line in text.splitlines() if re.search(r"\w", line))
    return [line for line, count in counts.items() if count > 1]


@pytest.mark.slow
def test_demo_trains_two_ranks_and_prints_only_progress_warnings_and_the_headline(tmp_path):
    # A working directory whose name Hydra would otherwise read as a list (",") or cut (" "), holding
    # a module that `python -m` would import before the real one: the demo must still work there.
    cwd = tmp_path / "bench runs, v1"
    cwd.mkdir()
    (cwd / "hydra.py").write_text("raise SystemExit('imported hydra.py from the working directory')\n")
    result = nemo_throughput_cli("demo", "--steps", "20", cwd=cwd, timeout=120)
    console = result.stdout + result.stderr
    assert result.returncode == 0, console
    (output_dir,) = (cwd / "nemo_throughput_runs").iterdir()
    summary_path = output_dir / "throughput" / "summary.json"
    summary = json.loads(summary_path.read_text())
    assert summary["status"] == "completed"
    assert summary["hardware"]["num_gpus"] == 2 and summary["parallel"]["data"] == 2
    assert summary["timing"]["steps_measured"] == 10  # 20 steps, 10 warm-up
    assert summary["batch"]["global_batch_size"] == 16 and summary["batch"]["micro_batch_size"] == 4

    # What the user should see: the command, our progress (rank 0 once), real warnings, the headline.
    assert result.stdout.startswith("$ ")
    assert console.count("[throughput] steps 10-19") == 1
    assert "WARNING: No peak FLOPs known for device 'cpu'" in console  # a real warning still shows
    assert f"tokens/s       {summary['throughput']['tokens_per_s']:,.0f}" in result.stdout
    assert f"summary: {summary_path}" in result.stdout
    assert f"log: {output_dir / 'train.log'}" in result.stdout
    # ... and nothing twice, no third-party deprecations or tips, no Lightning INFO chatter.
    assert repeated_lines(console) == []
    assert "LeafSpec" not in console and "deprecated" not in console.lower()
    assert "litlogger" not in console.lower()
    assert "GPU available" not in console
    assert "srun" not in console  # Lightning's hint to use srun, where Slurm's tools are installed

    # Nothing is lost: each rank's log file keeps every line, once, ours included.
    rank0_log = (output_dir / "train.log").read_text()
    assert rank0_log.count("GPU available: False") == 1 and rank0_log.count("[throughput] steps 10-19") == 1
    assert "Initializing distributed: GLOBAL_RANK: 1" in (output_dir / "train_ddp_process_1.log").read_text()


@pytest.mark.slow
def test_demo_with_an_impossible_batch_shows_the_error_and_says_where_the_log_is(tmp_path):
    result = nemo_throughput_cli("demo", "--output-dir", tmp_path, "model.global_batch_size=15", cwd=tmp_path,
                                 timeout=120)
    assert result.returncode != 0
    assert "global_batch_size=15 is not a multiple of micro_batch_size x data-parallel size = 8" in result.stderr
    assert "training exited with 1 and wrote no summary" in result.stderr


@pytest.mark.parametrize("unpassable", ["${oc.env:HOME}", 'say "hi"'])
def test_demo_refuses_an_output_dir_hydra_would_change(tmp_path, unpassable):
    result = nemo_throughput_cli("demo", "--output-dir", tmp_path / unpassable, cwd=tmp_path, timeout=120)
    assert result.returncode == 2
    assert "cannot be passed to Hydra unchanged; choose another --output-dir" in result.stderr
    assert result.stdout == ""  # refused before anything ran


@pytest.mark.parametrize(("override", "option"), [("callbacks.throughput.output_dir=elsewhere", "--output-dir"),
                                                  ("trainer.devices=1", "--devices")])
def test_demo_refuses_overrides_of_what_its_options_set(tmp_path, override, option):
    result = nemo_throughput_cli("demo", "--output-dir", tmp_path, override, cwd=tmp_path, timeout=120)
    assert result.returncode == 2
    assert f"use {option} instead of the override {override!r}" in result.stderr
    assert result.stdout == ""


def test_demo_refuses_more_ranks_than_the_machine_can_start_before_starting_any(tmp_path):
    """Each rank is a process importing torch: `--devices 100000` started them until memory ran out."""
    too_many = 4 * os.cpu_count() + 1
    result = nemo_throughput_cli("demo", "--devices", too_many, "--output-dir", tmp_path / "run", cwd=tmp_path,
                                 timeout=120)
    assert result.returncode == 2 and result.stdout == "" and not (tmp_path / "run").exists()
    assert result.stderr == (f"nemo-throughput demo: --devices {too_many}: at most {too_many - 1} gloo ranks here "
                             f"(4 per CPU, {os.cpu_count()} CPUs): each rank is a process of its own\n")


def test_demo_refuses_an_output_dir_under_a_file_or_holding_an_earlier_run(tmp_path):
    (tmp_path / "a-file").write_text("")
    earlier = tmp_path / "earlier"
    (earlier / "throughput").mkdir(parents=True)
    (earlier / "throughput" / "summary.json").write_text("{}")
    for output_dir, message in ((tmp_path / "a-file" / "run", "is a file, not a directory"),
                                (earlier, "holds an earlier run; choose a new directory")):
        result = nemo_throughput_cli("demo", "--output-dir", output_dir, cwd=tmp_path, timeout=120)
        assert result.returncode == 2 and message in result.stderr
        assert result.stdout == ""  # refused before anything ran


@pytest.mark.slow
def test_a_setup_failure_ends_the_demo_with_one_line_not_a_traceback(tmp_path):
    result = nemo_throughput_cli("demo", "--steps", "3", "--output-dir", tmp_path / "run",
                                 "callbacks.throughput.profile_mode=nsys", "callbacks.throughput.profile_steps=[2,2]",
                                 cwd=tmp_path, timeout=180)
    assert result.returncode != 0
    said = [line for line in result.stderr.splitlines() if "needs a CUDA device" in line]
    assert said == ["nemo-throughput: profile_mode 'nsys' needs a CUDA device (Nsight Systems traces CUDA), got cpu; "
                    "use profile_mode 'torch' on this device"]  # once, from rank 0
    logs = "".join(path.read_text() for path in (tmp_path / "run").glob("*.log"))
    assert "Traceback" not in result.stdout + result.stderr + logs and "HYDRA_FULL_ERROR" not in result.stderr


@pytest.mark.slow
def test_sigterm_to_the_demo_reaches_its_ranks_and_says_the_run_was_interrupted(tmp_path):
    summary = tmp_path / "run" / "throughput" / "summary.json"
    demo = subprocess.Popen([Path(sys.executable).parent / "nemo-throughput", "demo", "--steps", "100000",
                             "--output-dir", tmp_path / "run"], cwd=tmp_path, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (summary.exists() and '"status": "running"' in summary.read_text()):
            assert demo.poll() is None and time.monotonic() < deadline, "the demo never started training"
            time.sleep(0.5)
        demo.send_signal(signal.SIGTERM)  # to the demo alone, as `kill <pid>` or a job manager does
        output, _ = demo.communicate(timeout=120)
        assert demo.returncode == 128 + signal.SIGTERM, output
        assert json.loads(summary.read_text())["status"] == "interrupted"
        assert "interrupted" in output  # the headline of this run
        assert not group_alive_after(demo.pid, 30), "a rank outlived the demo"  # orphaned ranks run for ever
    finally:
        try:
            os.killpg(demo.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def group_alive_after(pgid: int, seconds: float) -> bool:
    """Whether any process of the group is still there after `seconds` (the ranks' own shutdown takes a moment)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        time.sleep(0.2)
    return True


def test_the_headline_prints_a_run_s_names_without_their_terminal_escapes(tmp_path):
    """The run's name and label come from settings a user types (or a variable): the headline never
    hands their escape sequences to the terminal."""
    from test_report import write_run

    from nemo_throughput.demo.command import headline
    from nemo_throughput.summary import read_summary

    path = write_run(tmp_path / "run" / "summary.json", label="\x1b]0;owned\x07bare\x1b[31m-metal", step_times=[1.0])
    text = headline(read_summary(path))
    assert "\x1b" not in text and "\x07" not in text and "[bare-metal]" in text.splitlines()[0]
