"""The profile_steps window on a GPU: kernels on the device timeline split into compute, NCCL
communication and idle (the CPU tests cover the arithmetic on hand-built kernel events)."""

import math

import pytest
import torch

from nemo_throughput.explain.profiler import FIELDS, ProfileWindow


def _train(window: ProfileWindow, device: torch.device, steps: int = 4) -> None:
    model = torch.nn.Linear(2048, 2048, device=device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(512, 2048, device=device)
    for step in range(1, steps + 1):
        window.step_start(step)
        model(x).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        window.step_end(step)


def test_torch_window_breaks_down_kernel_time(tmp_path, gpu_results):
    device = torch.device("cuda", torch.cuda.current_device())
    window = ProfileWindow(2, 3, "torch", device, str(tmp_path / "rank0.json"))
    _train(window, device)
    parts = dict(zip(FIELDS, window.result(), strict=True))
    gpu_results["profile_window_single_gpu"] = parts
    assert parts["steps"] == 2 and parts["compute_s"] > 0 and parts["communication_s"] == 0
    assert parts["idle_s"] >= 0
    assert parts["compute_s"] + parts["exposed_communication_s"] + parts["idle_s"] == pytest.approx(parts["window_s"])
    assert (tmp_path / "rank0.json").stat().st_size > 0
    assert not torch.autograd._profiler_enabled()


def test_nsys_window_times_the_steps_only():
    device = torch.device("cuda", torch.cuda.current_device())
    window = ProfileWindow(2, 3, "nsys", device, None)
    _train(window, device)
    result = window.result()
    assert result[0] > 0 and result[1] == 2 and all(math.isnan(x) for x in result[2:])
