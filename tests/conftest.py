import errno
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from nemo_throughput.schemas import SUMMARY_SCHEMA_ID, validate_summary

TESTS = Path(__file__).parent

# The NeMo tier needs real NeMo, installed only in .venv-nemo (.ci/setup-nemo; .ci/test runs both).
collect_ignore = [] if importlib.util.find_spec("nemo") else ["nemo_tier"]
TRAIN_TINY = TESTS / "scripts" / "train_tiny.py"


def tiny_gpt_cfg(**overrides):
    """The demo GPT's model section at a size that trains a step in milliseconds."""
    cfg = OmegaConf.create({
        "micro_batch_size": 2, "global_batch_size": 4, "tensor_model_parallel_size": 1,
        "pipeline_model_parallel_size": 1, "encoder_seq_length": 16, "num_layers": 1, "hidden_size": 32,
        "ffn_hidden_size": 64, "num_attention_heads": 4, "num_query_groups": None, "activation": "gelu",
        "make_vocab_size_divisible_by": 128, "tokenizer": {"vocab_size": 100}, "optim": {"lr": 1e-3},
        "seed": 1,
    })
    return OmegaConf.merge(cfg, overrides)


def run_train_tiny(*args, timeout=120, **popen):
    """Run tests/scripts/train_tiny.py in a fresh interpreter (a real process, real signals)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, str(TRAIN_TINY), *map(str, args)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **popen)


def nemo_throughput_cli(*args, cwd=None, env=None, timeout=600):
    """Run the installed `nemo-throughput` command of this interpreter's environment."""
    command = [Path(sys.executable).parent / "nemo-throughput", *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout)


def prometheus_binary(name: str) -> str:
    """Debian's `prometheus` or `promtool` (the prometheus package ships both; .ci/setup-prometheus
    installs it): the test skips without it, or fails where NEMO_THROUGHPUT_REQUIRE_PROMETHEUS is set."""
    binary = shutil.which(name)
    if binary is None:
        if os.environ.get("NEMO_THROUGHPUT_REQUIRE_PROMETHEUS"):
            pytest.fail(f"{name} is required (NEMO_THROUGHPUT_REQUIRE_PROMETHEUS) but not installed: "
                        ".ci/setup-prometheus installs Debian's prometheus, which ships it")
        pytest.skip(f"{name} is not installed (Debian's prometheus package ships it: .ci/setup-prometheus)")
    return binary


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_json(path):
    """A JSON file; a run's summary among them must conform to the shipped schema (the test fails
    naming each field that does not)."""
    document = json.loads(Path(path).read_text())
    if isinstance(document, dict) and document.get("schema") == SUMMARY_SCHEMA_ID:
        assert_valid_summary(document, path)
    return document


def summary_of(out, name):
    """The summary `nemo-throughput import` wrote for the input named `name` under `out`."""
    return json.loads((out / name / "summary.json").read_text())


def import_error_line(err, file_name):
    """Every failure of `import` is one `nemo-throughput import: <file>: <what> (<what to do>)` line,
    never a traceback."""
    assert "Traceback" not in err
    line = err.strip().splitlines()[-1]
    assert line.startswith("nemo-throughput import: ") and file_name in line and line.endswith(")"), err
    return line

def assert_valid_summary(summary, where="summary"):
    """Fail naming each field of ``summary`` that breaks schemas/summary-v1.json."""
    problems = validate_summary(summary)
    assert not problems, f"{where} does not conform to {SUMMARY_SCHEMA_ID}:\n" + "\n".join(problems)
    return summary


@pytest.fixture(autouse=True)
def summaries_conform_to_the_schema(request):
    """Every run summary a test leaves in its tmp_path (written by the callback, an import, a
    subprocess) must conform to the shipped schema; tests that write broken summaries on purpose
    are marked `invalid_summaries`."""
    checked = "tmp_path" in request.fixturenames and not request.node.get_closest_marker("invalid_summaries")
    tmp_path = request.getfixturevalue("tmp_path") if checked else None  # kept until this fixture ends
    yield
    if tmp_path is None:
        return
    for path in sorted(tmp_path.rglob("summary*.json")):
        try:
            document = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # not a summary this test finished writing (a cut file is some tests' subject)
        if isinstance(document, dict) and document.get("schema") == SUMMARY_SCHEMA_ID:
            assert_valid_summary(document, path)


@pytest.fixture
def quiet_trainer_kwargs(tmp_path):
    return dict(accelerator="cpu", devices=1, default_root_dir=tmp_path, enable_progress_bar=False,
                enable_model_summary=False, enable_checkpointing=False)


@pytest.fixture
def tiny_filesystem(tmp_path):
    """A real 64 KiB file system (tmpfs), to fill up; skipped where mounting is not allowed."""
    mount_point = tmp_path / "tiny"
    mount_point.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount_point)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=True)


def fill_up(directory: Path) -> None:
    """Write a filler file until the file system has no byte left."""
    with open(directory / "filler", "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"x" * 4096)
        except OSError as error:
            assert error.errno == errno.ENOSPC
        try:
            while True:
                f.write(b"x")
        except OSError as error:
            assert error.errno == errno.ENOSPC
