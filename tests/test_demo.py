"""The README's demo command, end to end: 2 gloo ranks, +callbacks=throughput, a summary, and a clean console."""

import json
import re
from collections import Counter

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
