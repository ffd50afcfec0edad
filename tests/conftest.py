import importlib.util
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_json(path):
    return json.loads(Path(path).read_text())


@pytest.fixture
def quiet_trainer_kwargs(tmp_path):
    return dict(accelerator="cpu", devices=1, default_root_dir=tmp_path, enable_progress_bar=False,
                enable_model_summary=False, enable_checkpointing=False)
