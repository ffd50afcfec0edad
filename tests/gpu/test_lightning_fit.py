"""A real Lightning fit on the GPU with ThroughputCallback: no host-device synchronization in its hooks
on non-log steps (torch.cuda.set_sync_debug_mode("error") around each of them), the ones on log steps
counted, a whole step as synchronized with the callback as without it, and MFU against the peak of
the device's own name."""

import importlib
import json

import pytest
import torch

from nemo_throughput import ThroughputCallback
from nemo_throughput.bench.harness import StepSyncs
from nemo_throughput.hardware import identify, peak_tflops

from .workloads import SyncGuard, fit, lightning_namespace

STEPS, LOG_EVERY, WARMUP = 40, 10, 5


def throughput_callback(tmp_path):
    return ThroughputCallback(log_every_n_steps=LOG_EVERY, warmup_steps=WARMUP, output_dir=str(tmp_path / "throughput"))


@pytest.fixture(scope="module")
def guarded_fit(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("guarded")
    ours = throughput_callback(tmp_path)
    guard = SyncGuard(ours)
    fit(tmp_path, [ours], STEPS)
    summary = json.loads(open(ours.summary_path).read())
    return ours, guard, summary


def test_no_synchronization_in_the_hooks_on_non_log_steps(guarded_fit, gpu_results):
    ours, guard, summary = guarded_fit
    non_log_steps = [s for s in range(1, STEPS + 1) if s % LOG_EVERY]
    assert guard.guarded_calls >= 4 * len(non_log_steps)  # every hook of every non-log step ran under "error"
    assert summary["status"] == "completed" and summary["timing"]["last_step"] == STEPS
    gpu_results["syncs_in_hooks"] = {"non_log_step_hook_calls_checked": guard.guarded_calls,
                                     "syncs_by_log_step": guard.syncs_by_log_step}
    assert sorted(guard.syncs_by_log_step) == list(range(LOG_EVERY, STEPS + 1, LOG_EVERY))
    # A log step may wait for the end of the previous step (an event) and read what it collected: no more.
    assert max(guard.syncs_by_log_step.values()) <= 2, guard.syncs_by_log_step


def test_whole_steps_synchronize_as_often_with_the_callback_as_without(tmp_path, gpu_results):
    """Lightning and the model synchronize on their own (logging a loss reads it); ours adds none."""
    pl = importlib.import_module(lightning_namespace())
    counts = {}
    for arm in ("without", "with"):
        step_syncs = StepSyncs()
        opener, closer = step_syncs.callbacks(pl.Callback)
        middle = [throughput_callback(tmp_path / arm)] if arm == "with" else []
        fit(tmp_path / arm, [opener, *middle, closer], STEPS)
        counts[arm] = step_syncs.by_step
    non_log = [s for s in range(WARMUP + 1, STEPS + 1) if s % LOG_EVERY]
    gpu_results["syncs_per_whole_step"] = counts
    assert sum(counts["with"][s] for s in non_log) == sum(counts["without"][s] for s in non_log), counts


def test_device_name_resolves_to_bf16_and_fp8_peaks(gpu_results):
    name = torch.cuda.get_device_name()
    accelerator = identify(name)
    gpu_results["device"] = {"name": name, "table_entry": accelerator.name if accelerator else None,
                             "bf16_tflops": peak_tflops(name, "bf16"), "fp8_tflops": peak_tflops(name, "fp8")}
    assert accelerator is not None, f"{name!r} matches no entry of nemo_throughput.hardware.ACCELERATORS"
    assert peak_tflops(name, "bf16") and peak_tflops(name, "fp8")


def test_fit_reports_mfu_against_the_table_peak(guarded_fit, gpu_results):
    ours, _, summary = guarded_fit
    hardware, throughput = summary["hardware"], summary["throughput"]
    gpu_results["fit_summary"] = {"hardware": hardware, "throughput": throughput,
                                  "step_time_s": summary["timing"]["step_time_s"]}
    assert hardware["gpu_name"] == torch.cuda.get_device_name()
    assert hardware["dtype"] == "bf16"
    assert hardware["peak_source"] == f"table:{identify(hardware['gpu_name']).name}"
    assert hardware["peak_tflops"] == peak_tflops(hardware["gpu_name"], "bf16")
    assert throughput["mfu"] is not None and 0 < throughput["mfu"] < 1
    assert summary["timing"]["steps_measured"] == STEPS - WARMUP
