"""The summary writer never leaves a half-written file; the reader checks the schema."""

import json
import os
import time

import pytest

from nemo_throughput.summary import SCHEMA, SummaryFile, append_jsonl, read_summary, write_json_atomic


def test_atomic_write_replaces_the_whole_file(tmp_path):
    path = tmp_path / "out" / "summary.json"
    write_json_atomic(path, {"schema": SCHEMA, "n": 1})
    write_json_atomic(path, {"schema": SCHEMA, "n": 2})
    assert read_summary(path) == {"schema": SCHEMA, "n": 2}
    assert os.listdir(path.parent) == ["summary.json"]


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
    with pytest.raises(ValueError, match="missing.json: not a readable JSON summary"):
        read_summary(tmp_path / "missing.json")


def test_json_lines_append(tmp_path):
    path = tmp_path / "steps.jsonl"
    append_jsonl(path, [{"step": 1}, {"step": 2}])
    append_jsonl(path, [{"step": 3}])
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2, 3]


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
