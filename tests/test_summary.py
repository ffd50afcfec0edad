"""The summary writer never leaves a half-written file; the reader checks the schema."""

import json
import os

import pytest

from nemo_throughput.summary import SCHEMA, append_jsonl, read_summary, write_json_atomic


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
