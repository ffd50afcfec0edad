"""A torch.profiler trace of a Lightning fit: on non-log steps ThroughputCallback's hooks make no CUDA
call but event records (no kernel launch, no memcpy or memset, no synchronization)."""

import gzip
import os
import shutil
from pathlib import Path

from torch.profiler import ProfilerActivity, profile

from nemo_throughput import ThroughputCallback

from .workloads import cuda_calls_in_hooks, fit, label_step_hooks

STEPS, LOG_EVERY = 30, 10


def test_hooks_add_no_kernel_memcpy_or_sync_on_non_log_steps(tmp_path, gpu_results):
    ours = ThroughputCallback(log_every_n_steps=LOG_EVERY, warmup_steps=2, output_dir=str(tmp_path / "throughput"))
    label_step_hooks(ours)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fit(tmp_path, [ours], STEPS)
    found = cuda_calls_in_hooks(list(prof.events()), LOG_EVERY)
    gpu_results["profiler_trace"] = found
    folder = os.environ.get("NEMO_THROUGHPUT_GPU_RESULTS") or os.environ.get("OUT")
    if folder:
        trace = tmp_path / "trace.json"
        prof.export_chrome_trace(str(trace))
        Path(folder).mkdir(parents=True, exist_ok=True)
        with open(trace, "rb") as raw, gzip.open(Path(folder) / "profiler_trace.json.gz", "wb") as packed:
            shutil.copyfileobj(raw, packed)
    assert found["cuda_calls_in_trace"], "the trace holds no CUDA runtime call at all: was CUDA activity recorded?"
    assert found["hook_ranges"] >= 4 * STEPS - 4  # every hook of every step is in the trace
    assert found["calls_in_hooks_on_non_log_steps"] == {}, found["calls_in_hooks_on_non_log_steps"]
