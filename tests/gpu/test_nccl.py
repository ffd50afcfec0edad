"""NCCL aggregation at world size 1 through the same code path as many ranks (in a process of its own)."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parent / "nccl_world_of_one.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_nccl_exchange_and_a_ddp_fit_at_world_size_one(tmp_path, gpu_results):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    result = subprocess.run([sys.executable, str(SCRIPT), str(free_port()), str(tmp_path)], capture_output=True,
                            text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    found = json.loads(result.stdout.strip().splitlines()[-1])
    gpu_results["nccl_world_of_one"] = found
    exchange, lightning = found["exchange"], found["lightning"]
    assert exchange["backend"] == "nccl" and exchange["nccl"] and exchange["world_size"] == 1
    assert exchange["first_interval_equal"] and exchange["second_interval_equal"] and exchange["result_pinned"]
    assert exchange["alone_equal"]  # a world of one: the local path, no collective
    assert exchange["final_steps"] == [11.0 + i for i in range(10)] + [21.0, 22.0, 23.0]
    assert exchange["final_missing"] is None
    assert lightning["status"] == "completed" and lightning["exchange_was_nccl"]
    assert lightning["last_step"] == 20 and lightning["steps_measured"] == 18 and lightning["num_gpus"] == 1
    assert lightning["guarded_calls"] >= 4 * 16  # non-log steps: 20 minus the 4 log steps
    assert lightning["mfu"] is not None
