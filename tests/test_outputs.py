"""The one rule for output paths, on real files and directories."""

import json
import os

import pytest

from nemo_throughput.outputs import OutputPathError, check_output_dir, check_output_file


@pytest.fixture
def a_file(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("x")
    return path


def refused(check, *args, **kwargs) -> str:
    with pytest.raises(OutputPathError) as error:
        check(*args, **kwargs)
    return str(error.value)


def test_a_new_file_in_an_existing_directory_is_fine(tmp_path):
    assert check_output_file(tmp_path / "report.md", "--output") == tmp_path / "report.md"


def test_an_existing_file_that_is_not_a_summary_may_be_replaced(a_file):
    assert check_output_file(a_file, "--output") == a_file


def test_file_refusals_name_the_option_and_the_path(tmp_path, a_file):
    assert refused(check_output_file, tmp_path, "--output") == f"--output {tmp_path} is a directory; give a file name"
    assert "does not exist; create it first" in refused(check_output_file, tmp_path / "no" / "r.md", "--output")
    assert not (tmp_path / "no").exists()  # nothing created for a typo
    assert refused(check_output_file, a_file / "r.md", "--plot") == f"--plot {a_file / 'r.md'}: {a_file} is a file, " \
                                                                   "not a directory"


def test_a_file_the_command_reads_is_refused_by_any_name_that_reaches_it(tmp_path, a_file):
    (tmp_path / "link.txt").symlink_to(a_file)
    other_spelling = tmp_path / "." / "notes.txt"
    for path in (other_spelling, tmp_path / "link.txt"):
        assert "is one of the files this command reads" in refused(check_output_file, path, "--output", reads=[a_file])


def test_a_runs_summary_is_never_overwritten(tmp_path):
    summary = tmp_path / "anything.json"
    summary.write_text(json.dumps({"schema": "nemo-throughput/summary/v1", "run": {}}, indent=2))
    assert "is a run's summary" in refused(check_output_file, summary, "--output")


def test_directories_may_be_new_and_deep_but_never_under_a_file(tmp_path, a_file):
    assert check_output_dir(tmp_path / "a" / "b", "--output-dir") == tmp_path / "a" / "b"
    assert not (tmp_path / "a").exists()  # checked, not created
    assert check_output_dir(tmp_path, "--output-dir") == tmp_path
    assert refused(check_output_dir, a_file, "--output-dir") == f"--output-dir {a_file} is a file, not a directory"
    assert "is a file, not a directory" in refused(check_output_dir, a_file / "deeper" / "dir", "--output-dir")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_an_unwritable_directory_is_refused(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    assert "cannot be written" in refused(check_output_dir, locked / "new", "--output-dir")
    assert "cannot be written" in refused(check_output_file, locked / "r.md", "--output")


def test_terminal_escapes_in_a_name_never_reach_the_message(tmp_path):
    path = tmp_path / "\x1b[31mred\x1b[0m"
    path.mkdir()
    message = refused(check_output_file, path, "--output")
    assert "\x1b" not in message and "red" in message
