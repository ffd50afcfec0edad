"""The fabric probe on CUDA: bf16 matmul on the GPU, and NCCL collectives when there are two GPUs or more."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import free_port
from nemo_throughput.explain.probe import OPS, bandwidths_gbps, run_probe

BIN = Path(sys.executable).parent


def test_probe_on_one_gpu_measures_a_bf16_matmul_and_skips_collectives(gpu_results):
    result = run_probe(matmul_budget_s=0.5)
    matmul = result["matmul_tflops"]
    assert result["device"] == f"cuda:{torch.cuda.current_device()}" and result["collectives"] == []
    assert (matmul["dtype"], matmul["n"]) == ("bfloat16", 8192) and matmul["per_rank"][0] > 0
    assert result["ranks"][0]["gpu_index"] is not None
    gpu_results["probe_matmul_bf16_tflops"] = {"device": torch.cuda.get_device_name(), "tflops": matmul["per_rank"][0]}


def test_probe_command_with_nccl_on_every_gpu(tmp_path, gpu_results):
    gpus = min(torch.cuda.device_count(), 8)
    if gpus < 2:
        pytest.skip(f"NCCL collectives need two GPUs; {gpus} here")
    output = tmp_path / "probe.json"
    result = subprocess.run([BIN / "torchrun", "--nproc-per-node", str(gpus), "--master-port", str(free_port()),
                             "-m", "nemo_throughput.cli", "probe", "--backend", "nccl", "--output", output],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    written = json.loads(output.read_text())
    assert (written["backend"], written["world_size"], written["skipped"]) == ("nccl", gpus, [])
    assert {row["op"] for row in written["collectives"]} == set(OPS)
    for row in written["collectives"]:
        ranks = 2 if row["op"] == "sendrecv" else gpus
        expected = bandwidths_gbps(row["op"], row["bytes"], row["time_us"] / 1e6, ranks)
        assert (row["algbw_gbps"], row["busbw_gbps"]) == pytest.approx(expected)
    assert len({place["gpu_index"] for place in written["ranks"]}) == gpus  # one GPU each
    gpu_results["probe_nccl"] = {"gpus": gpus, "collectives": written["collectives"],
                                 "matmul_tflops": written["matmul_tflops"]}
