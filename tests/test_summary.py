"""The summary writer never leaves a half-written file, not even on a full disk (a real tmpfs); the
reader checks the schema; run facts refuse impossible values."""

import errno
import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from conftest import fill_up, read_json
from nemo_throughput.flops import ModelSpec
from nemo_throughput.run_facts import RunFacts
from nemo_throughput.summary import SCHEMA, SummaryFile, append_jsonl, read_summary, write_json_atomic


@pytest.mark.invalid_summaries  # the writer's test documents, not run summaries
def test_atomic_write_replaces_the_whole_file(tmp_path):
    path = tmp_path / "out" / "summary.json"
    write_json_atomic(path, {"schema": SCHEMA, "n": 1})
    write_json_atomic(path, {"schema": SCHEMA, "n": 2})
    assert read_summary(path) == {"schema": SCHEMA, "n": 2}
    assert os.listdir(path.parent) == ["summary.json"]


@pytest.mark.invalid_summaries  # the writer's test documents, not run summaries
def test_a_failed_write_leaves_the_previous_file_and_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "summary.json"
    write_json_atomic(path, {"schema": SCHEMA, "n": 1})
    with pytest.raises(ValueError):
        write_json_atomic(path, {"schema": SCHEMA, "n": float("nan")})  # not valid JSON

    def disk_full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)  # the failure happens after the temporary was written
    with pytest.raises(OSError, match="No space left"):
        write_json_atomic(path, {"schema": SCHEMA, "n": 3})
    assert read_summary(path)["n"] == 1
    assert os.listdir(tmp_path) == ["summary.json"]


def test_read_summary_names_the_file_and_the_problem(tmp_path):
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"schema": "nemo-throughput/summary/v0"}))
    with pytest.raises(ValueError, match=r"other.json: schema is 'nemo-throughput/summary/v0', this version "
                                         r"reads 'nemo-throughput/summary/v1'"):
        read_summary(other)
    broken = tmp_path / "broken.json"
    broken.write_text('{"schema": ')
    with pytest.raises(ValueError, match="broken.json: not a readable JSON summary"):
        read_summary(broken)
    with pytest.raises(ValueError, match=r"missing.json: not a readable JSON summary \(No such file or directory\)$"):
        read_summary(tmp_path / "missing.json")
    (tmp_path / "folder.json").mkdir()  # the error named the descriptor: "[Errno 21] Is a directory: 3"
    with pytest.raises(ValueError, match=r"folder.json: not a summary file \(a FIFO, device or directory"):
        read_summary(tmp_path / "folder.json")


def test_json_lines_append(tmp_path):
    path = tmp_path / "steps.jsonl"
    append_jsonl(path, [{"step": 1}, {"step": 2}])
    append_jsonl(path, [{"step": 3}])
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2, 3]


@pytest.mark.invalid_summaries  # the writer's test documents, not run summaries
def test_summary_file_writes_in_the_background_and_flushes_the_final_content(tmp_path, caplog):
    path = tmp_path / "run" / "summary.json"
    summary_file = SummaryFile(path)
    for n in range(200):  # faster than the disk: waiting requests are replaced, none is torn
        summary_file.update({"schema": SCHEMA, "status": "running", "n": n})
    summary_file.close({"schema": SCHEMA, "status": "completed", "n": 200})
    assert read_summary(path) == {"schema": SCHEMA, "status": "completed", "n": 200}
    assert not summary_file._worker.is_alive()

    blocked = SummaryFile(tmp_path / "file" / "summary.json")
    (tmp_path / "file").write_text("a file where the directory should be")
    with caplog.at_level("WARNING"):
        blocked.update({"schema": SCHEMA})
        deadline = time.monotonic() + 10
        while "could not write" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.01)  # the worker logs the failure and goes on
        assert "could not write" in caplog.text
        with pytest.raises(OSError):  # the final write reports it to the caller
            blocked.close({"schema": SCHEMA})


# ------------------------------------------------------------------ files a team can read, full disks


@pytest.mark.invalid_summaries  # the writer's test documents, not run summaries
def test_files_are_written_with_the_users_umask_like_any_log(tmp_path):
    old = os.umask(0o027)
    try:
        write_json_atomic(tmp_path / "summary.json", {"schema": SCHEMA})
        append_jsonl(tmp_path / "steps.jsonl", [{"step": 1}])
    finally:
        os.umask(old)
    assert (tmp_path / "summary.json").stat().st_mode & 0o777 == 0o640
    assert (tmp_path / "steps.jsonl").stat().st_mode & 0o777 == 0o640


@pytest.mark.invalid_summaries  # the writer's test documents, not run summaries
def test_on_a_full_disk_the_summary_keeps_its_last_good_version(tiny_filesystem):
    path = tiny_filesystem / "summary.json"
    write_json_atomic(path, {"schema": SCHEMA, "n": 1})
    fill_up(tiny_filesystem)
    with pytest.raises(OSError) as raised:
        write_json_atomic(path, {"schema": SCHEMA, "n": 2, "padding": "y" * 10_000})
    assert raised.value.errno == errno.ENOSPC
    assert read_summary(path)["n"] == 1
    assert sorted(os.listdir(tiny_filesystem)) == ["filler", "summary.json"]


def test_on_a_full_disk_steps_jsonl_never_keeps_a_half_line(tiny_filesystem):
    path = tiny_filesystem / "steps.jsonl"
    append_jsonl(path, [{"step": 1}, {"step": 2}])
    fill_up(tiny_filesystem)
    filler = tiny_filesystem / "filler"
    os.truncate(filler, filler.stat().st_size - 4096)  # room for part of the next interval
    with pytest.raises(OSError) as raised:
        append_jsonl(path, [{"step": n, "padding": "z" * 500} for n in range(3, 30)])
    assert raised.value.errno == errno.ENOSPC
    assert path.read_text() == '{"step": 1}\n{"step": 2}\n'  # the interval is all in or all out


def facts(**changes):
    spec = ModelSpec(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=128, vocab_size=256)
    values = dict(name="run", label="bare-metal", global_batch_size=8, micro_batch_size=1, seq_length=128,
                  model_name="gpt", model_spec=spec, flops_formula="megatron", flops_per_sample=1e9,
                  gpu_name="cpu", num_gpus=8, num_nodes=1, dtype="bf16", peak_tflops=989.5, peak_source="user")
    return RunFacts(**(values | changes))


@pytest.mark.parametrize("changes, message", [
    ({"num_gpus": 0}, "num_gpus must be a positive integer, got 0"),
    ({"num_nodes": 0}, "num_nodes must be a positive integer, got 0"),
    ({"num_nodes": 9}, "num_nodes 9 is more than num_gpus 8: every node runs at least one GPU"),
    ({"global_batch_size": 0}, "global_batch_size must be a positive integer, got 0"),
    ({"global_batch_size": -128}, "global_batch_size must be a positive integer, got -128"),
    ({"micro_batch_size": 0}, "micro_batch_size must be a positive integer, got 0"),
    ({"seq_length": 0}, "seq_length must be a positive integer, got 0"),
    ({"peak_tflops": 0}, "peak_tflops must be a positive number"),
    ({"peak_tflops": -989.5}, "peak_tflops must be a positive number"),
    ({"flops_per_sample": 0.0}, "flops_per_sample must be a positive number"),
    ({"flops_per_sample": float("inf")}, "flops_per_sample must be a positive number"),
    ({"label": 123}, r"label must be a string, got 123 \(int\)"),
    ({"name": ""}, "name must be a non-empty string"),
    ({"flops_formula": "palm"}, "flops_formula"),
])
def test_run_facts_reject_impossible_values_naming_them(changes, message):
    with pytest.raises(ValueError, match=message):
        facts(**changes)


def test_a_full_disk_at_set_up_stops_the_run_before_training(tiny_filesystem, quiet_trainer_kwargs):
    import pytorch_lightning as pl

    from conftest import tiny_gpt_cfg
    from nemo_throughput import ThroughputCallback
    from nemo_throughput.demo.gpt import DemoGPT

    fill_up(tiny_filesystem)
    trainer = pl.Trainer(max_steps=4, callbacks=[ThroughputCallback(output_dir=str(tiny_filesystem / "run"))],
                         logger=False, **quiet_trainer_kwargs)
    with pytest.raises(OSError, match=f"cannot write to the output directory {tiny_filesystem / 'run'}.*No space"):
        trainer.fit(DemoGPT(tiny_gpt_cfg()))
    assert trainer.global_step == 0


def wait_for_measured_steps(path: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if read_summary(path)["timing"]["steps_measured"]:
                return
        except ValueError:
            pass  # not written yet
        time.sleep(0.01)
    raise AssertionError(f"{path} has no measured step after 60 s")


def test_a_disk_that_fills_up_mid_run_leaves_the_last_good_summary_and_whole_lines(tiny_filesystem,
                                                                                   quiet_trainer_kwargs):
    import pytorch_lightning as pl

    from conftest import tiny_gpt_cfg
    from nemo_throughput import ThroughputCallback
    from nemo_throughput.demo.gpt import DemoGPT

    class FillsTheDiskAtStep8(DemoGPT):
        def training_step(self, batch, batch_idx):
            if self.trainer.global_step == 7 and not (tiny_filesystem / "filler").exists():
                wait_for_measured_steps(out / "summary.json")  # the background writer's summary of step 6
                fill_up(tiny_filesystem)
            return super().training_step(batch, batch_idx)

    # 32 steps of rows after the disk is full: more than the slack of the file's last page
    out = tiny_filesystem / "run"
    callback = ThroughputCallback(output_dir=str(out), log_every_n_steps=2, warmup_steps=1, per_step_jsonl=True)
    trainer = pl.Trainer(max_steps=40, callbacks=[callback], logger=False, **quiet_trainer_kwargs)
    handler = signal.getsignal(signal.SIGTERM)
    try:
        trainer.fit(FillsTheDiskAtStep8(tiny_gpt_cfg(global_batch_size=2)))
    except OSError as error:  # the final summary cannot be written either: the run may fail for it
        assert error.errno == errno.ENOSPC
    assert trainer.global_step == 40  # a full disk did not stop the training
    # and nothing of the run's is left running in the process: no thread, the SIGTERM handler and
    # the interpreter's wakeup fd given back
    assert not [thread.name for thread in threading.enumerate() if thread.name.startswith("nemo-throughput")]
    assert signal.getsignal(signal.SIGTERM) == handler and signal.set_wakeup_fd(-1) == -1
    summary = read_summary(out / "summary.json")  # whole, readable
    assert summary["status"] == "running" and 1 <= summary["timing"]["steps_measured"] < 39
    rows = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]  # no half line
    assert [r["step"] for r in rows] == list(range(1, len(rows) + 1)) and len(rows) < 40
    assert (out / "steps.jsonl").read_text().endswith("\n")


def test_a_summary_written_now_is_never_replaced_by_an_older_one_the_worker_held(tmp_path):
    """At SIGTERM the interrupted summary is written on the watch's thread (a kill may follow): a
    running one the background writer had taken, or had still waiting, is never written after it."""
    for attempt in range(50):
        path = tmp_path / f"summary{attempt}.json"
        file = SummaryFile(path)
        file.update({"status": "running", "attempt": attempt})
        if attempt % 2:
            time.sleep(0.0005)  # the worker may be writing it by now
        file.write_now({"status": "interrupted", "attempt": attempt})
        assert read_json(path)["status"] == "interrupted"  # written before write_now returned
        time.sleep(0.002)  # whatever the worker held is done
        assert read_json(path)["status"] == "interrupted", attempt
        file.close({"status": "interrupted", "attempt": attempt, "final": True})
