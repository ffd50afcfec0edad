"""Memory and device telemetry (nemo_throughput/explain/telemetry.py).

The real pynvml and torch.cuda run here: this machine has no NVIDIA driver, so they must report
themselves unavailable, give NaN and raise nothing. A fake NVML stands in only where a GPU would
be needed: the decoding of clocks, power, throttle reasons and the energy counter. The arithmetic
of the section (extremes and their places, near-OOM, energy per token) runs on several ranks.
"""

import json
import math

import pytest
import torch

from nemo_throughput.explain import telemetry
from nemo_throughput.explain.telemetry import (
    CLOCKS_EVENT_REASONS,
    FIELDS,
    DeviceTelemetry,
    NvmlReader,
    memory_fields,
    nvml,
    nvml_handle,
    throttle_reason_names,
)
from nemo_throughput.explain.telemetry_stats import GIB, TelemetryStats

NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without a GPU")
NAN = float("nan")


def all_nan(values):
    return all(math.isnan(v) for v in values)


# ---------------------------------------------------------------------------------------------
# real torch.cuda and pynvml on a machine without a GPU


@NO_CUDA
def test_real_nvml_without_a_driver_is_unavailable_and_raises_nothing():
    module, source = nvml()
    assert module is None
    assert source.startswith("unavailable: nvmlInit failed:") and "NVML" in source
    assert nvml() == (module, source)  # initialised once per process: the same answer, no second nvmlInit


def test_cpu_device_gives_nan_for_every_field_and_says_why():
    device = DeviceTelemetry(torch.device("cpu"))
    sample = device.sample(10)
    assert len(sample) == len(FIELDS) == len(DeviceTelemetry.FIELDS)
    assert all_nan(sample)
    sources = device.sources()
    assert sources["memory"].startswith("unavailable: device is cpu")
    assert sources["nvml"].startswith("unavailable: device is cpu")


@NO_CUDA
def test_cuda_device_on_a_machine_without_cuda_gives_nan_and_says_why():
    device = DeviceTelemetry(torch.device("cuda"))
    assert all_nan(device.sample(10))
    for source in device.sources().values():
        assert "torch.cuda.is_available() is False" in source


@NO_CUDA
def test_real_memory_stats_without_cuda_read_as_unavailable():
    stats = torch.cuda.memory_stats()  # the real call: an empty dict when CUDA never started
    assert stats == {}
    assert all_nan(memory_fields(stats).values())


def test_memory_fields_take_the_allocator_peaks_and_counters():
    stats = {"allocated_bytes.all.peak": 3 * GIB, "reserved_bytes.all.peak": 4 * GIB, "num_alloc_retries": 2,
             "num_ooms": 0, "allocated_bytes.all.current": 1}
    assert memory_fields(stats) == {"mem_peak_allocated_bytes": 3.0 * GIB, "mem_peak_reserved_bytes": 4.0 * GIB,
                                    "alloc_retries": 2.0, "ooms": 0.0}


def test_throttle_reason_names_are_nvmls_own_constants():
    pynvml = pytest.importorskip("pynvml")
    for prefix in ("nvmlClocksEventReason", "nvmlClocksThrottleReason"):
        for name in dir(pynvml):
            if not name.startswith(prefix) or name.endswith(("All", "None")):
                continue
            bit = getattr(pynvml, name)
            assert bit in CLOCKS_EVENT_REASONS, name
            aliases = {CLOCKS_EVENT_REASONS[bit]} | ({"UserDefinedClocks"} if bit == 0x2 else set())
            assert name.removeprefix(prefix) in aliases, name
    assert throttle_reason_names(0) == []
    assert throttle_reason_names(0x1 | 0x4 | 0x40) == ["GpuIdle", "SwPowerCap", "HwThermalSlowdown"]
    assert throttle_reason_names(0x800) == ["0x800"]  # a bit newer than this table: kept, not dropped


# ---------------------------------------------------------------------------------------------
# a fake NVML: only what decoding needs, with NVML's units (MHz, mW, °C, mJ) and its error codes


class FakeNvmlError(Exception):
    def __init__(self, value):
        super().__init__({3: "Not Supported", 13: "Function Not Found", 15: "GPU is lost"}[value])
        self.value = value


class FakeNvml:
    NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU = 1, 2, 0

    def __init__(self, uuids, energy_mj=None, throttle=0x4, missing=()):
        self.uuids = uuids
        self.energy_mj = energy_mj if energy_mj is not None else [1_000_000.0] * len(uuids)
        self.throttle = throttle
        self.missing = set(missing)  # functions this "part" does not support
        self.calls = []

    def _call(self, name, value):
        self.calls.append(name)
        if name in self.missing:
            raise FakeNvmlError(3)
        return value

    def nvmlDeviceGetCount(self):
        return len(self.uuids)

    def nvmlDeviceGetHandleByIndex(self, index):
        if index >= len(self.uuids):
            raise FakeNvmlError(3)
        return index

    def nvmlDeviceGetUUID(self, handle):
        return self.uuids[handle]

    def nvmlDeviceGetClockInfo(self, handle, clock):
        return self._call("clock", {1: 1980, 2: 2619}[clock] - handle)

    def nvmlDeviceGetPowerUsage(self, handle):
        return self._call("power", 512_345 + handle)

    def nvmlDeviceGetTemperatureV(self, handle, sensor):
        raise FakeNvmlError(13)  # an older driver: only the deprecated call works

    def nvmlDeviceGetTemperature(self, handle, sensor):
        return self._call("temperature", 61 + handle)

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle):
        return self._call("throttle", self.throttle)

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        return self._call("energy", self.energy_mj[handle])


def fields(sample_dict):
    return [sample_dict.get(name, NAN) for name in FIELDS]


def test_nvml_reader_converts_nvml_units():
    fake = FakeNvml(["GPU-a"], energy_mj=[123_456_789.0], throttle=0x4 | 0x40)
    values = NvmlReader(fake, 0).sample()
    assert values == {"sm_clock_mhz": 1980.0, "mem_clock_mhz": 2619.0, "power_w": 512.345, "temperature_c": 61.0,
                      "throttle_reasons": 68.0, "energy_j": 123_456.789}


def test_nvml_field_a_part_does_not_support_is_nan_with_the_reason_and_not_asked_again():
    fake = FakeNvml(["GPU-a"], missing={"energy", "power"})
    reader = NvmlReader(fake, 0)
    first = reader.sample()
    assert math.isnan(first["energy_j"]) and math.isnan(first["power_w"])
    assert first["sm_clock_mhz"] == 1980.0
    assert reader.errors == {"energy_j": "FakeNvmlError: Not Supported", "power_w": "FakeNvmlError: Not Supported"}
    asked = fake.calls.count("energy")
    reader.sample()
    assert fake.calls.count("energy") == asked  # NotSupported: not asked again


def test_nvml_device_follows_cuda_visible_devices():
    fake = FakeNvml(["GPU-1111-aaaa", "GPU-2222-bbbb", "GPU-3333-cccc", "GPU-4444-dddd"])
    handle, how = nvml_handle(fake, 1, {"CUDA_VISIBLE_DEVICES": "3,2"})
    assert handle == 2 and "index 2" in how and "PCI order" in how
    handle, how = nvml_handle(fake, 0, {"CUDA_VISIBLE_DEVICES": "GPU-3333", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
    assert handle == 2 and "uuid prefix GPU-3333" in how
    handle, how = nvml_handle(fake, 3, {})
    assert handle == 3 and "unset" in how
    with pytest.raises(LookupError, match="no NVML device matches cuda:0"):
        nvml_handle(fake, 0, {"CUDA_VISIBLE_DEVICES": "GPU-9"})


# ---------------------------------------------------------------------------------------------
# rank 0's arithmetic over several ranks

PLACES = [{"rank": 0, "host": "node-a", "gpu_index": 0}, {"rank": 1, "host": "node-a", "gpu_index": 1},
          {"rank": 2, "host": "node-b", "gpu_index": 0}]
SOURCES = {"memory": "torch.cuda.memory_stats", "nvml": "nvidia-ml-py 13.x (fake)"}
TOTAL = 80 * GIB


def row(alloc_gib=10.0, reserved_gib=12.0, retries=0, ooms=0, sm=1980, mem=2619, power=500.0, temp=60.0,
        throttle=0, energy_j=1000.0, total=TOTAL):
    values = {"mem_peak_allocated_bytes": alloc_gib * GIB, "mem_peak_reserved_bytes": reserved_gib * GIB,
              "mem_total_bytes": total, "alloc_retries": retries, "ooms": ooms, "sm_clock_mhz": sm,
              "mem_clock_mhz": mem, "power_w": power, "temperature_c": temp, "throttle_reasons": throttle,
              "energy_j": energy_j}
    return fields(values)


def samples(*rows):
    return torch.tensor(rows, dtype=torch.float64)


def three_rank_run(energy_at_last=(1000.0 + 20 * 400.0, 2000.0 + 20 * 500.0, 3000.0 + 20 * 600.0)):
    stats = TelemetryStats(PLACES, SOURCES)
    # warm-up log step: counts for memory peaks, not for clocks, power or energy
    stats.add(samples(row(power=100.0, energy_j=0.0), row(power=100.0, energy_j=0.0), row(power=100.0, energy_j=0.0)),
              step=10, is_measured=lambda step: False)
    stats.add(samples(row(energy_j=1000.0), row(energy_j=2000.0), row(energy_j=3000.0, sm=1700, throttle=0x4)),
              step=20, is_measured=lambda step: True)
    stats.add(samples(row(alloc_gib=11.0, power=400.0, energy_j=1000.0 + 10 * 400.0),
                      row(alloc_gib=30.0, reserved_gib=77.0, power=500.0, energy_j=2000.0 + 10 * 500.0),
                      row(alloc_gib=9.0, retries=3, sm=1500, power=600.0, throttle=0x40 | 0x4, temp=83.0,
                          energy_j=3000.0 + 10 * 600.0)),
              step=30, is_measured=lambda step: True)
    stats.add(samples(row(alloc_gib=11.0, power=400.0, energy_j=energy_at_last[0]),
                      row(alloc_gib=30.0, reserved_gib=77.0, power=500.0, energy_j=energy_at_last[1]),
                      row(alloc_gib=9.0, retries=3, sm=1500, power=600.0, throttle=0x4, temp=83.0,
                          energy_j=energy_at_last[2])),
              step=40, is_measured=lambda step: True)
    return stats


def test_extremes_name_the_rank_host_and_gpu():
    section = three_rank_run().section(tokens_per_step=4096)
    memory = section["memory"]
    assert memory["peak_allocated_gib"] == {"min": 10.0, "median": 11.0, "max": 30.0,
                                            "min_at": PLACES[2], "max_at": PLACES[1]}
    # rank 2 peaked at 10 GiB in warm-up before its 9 GiB samples: peaks are maxima over all log steps
    assert memory["alloc_retries"]["max"] == 3 and memory["alloc_retries"]["max_at"] == PLACES[2]
    assert memory["ooms"]["max"] == 0
    device = section["device"]
    assert device["log_steps"] == 3 and device["over"] == "measured log steps"
    assert device["sm_clock_mhz"]["min"] == pytest.approx((1700 + 1500 + 1500) / 3)
    assert device["sm_clock_mhz"]["min_at"] == PLACES[2]
    assert device["power_w"]["max"] == pytest.approx((500 + 600 + 600) / 3)  # warm-up's 100 W left out
    assert device["temperature_c"]["max_at"] == {"rank": 2, "host": "node-b", "gpu_index": 0}
    assert device["throttle_reasons"] == {"SwPowerCap": [2], "HwThermalSlowdown": [2]}
    assert section["sources"] == SOURCES
    json.dumps(section, allow_nan=False)  # the summary is strict JSON


def test_near_oom_ranks_by_reserved_share_or_allocator_retries():
    section = three_rank_run().section(tokens_per_step=4096)
    assert section["memory"]["near_oom_ranks"] == [1, 2]  # 77 of 80 GiB reserved; 3 cudaMalloc retries


def test_energy_is_the_counters_difference_summed_over_ranks_per_step_and_token():
    energy = three_rank_run().section(tokens_per_step=4096)["energy"]
    joules = 20 * 400.0 + 20 * 500.0 + 20 * 600.0  # from the first measured log step (20) to the last (40)
    assert energy == {"joules": pytest.approx(joules), "steps": 20, "first_step": 20, "last_step": 40,
                      "joules_per_step": pytest.approx(joules / 20),
                      "joules_per_token": pytest.approx(joules / (20 * 4096)),
                      "tokens_per_kwh": pytest.approx(20 * 4096 / (joules / 3.6e6)), "ranks": 3}


def test_energy_without_tokens_per_step_has_no_per_token_figures():
    energy = three_rank_run().section(tokens_per_step=None)["energy"]
    assert energy["joules_per_step"] == pytest.approx(1500.0)
    assert energy["joules_per_token"] is None and energy["tokens_per_kwh"] is None


def test_a_counter_that_goes_down_gives_no_energy_and_names_the_rank():
    section = three_rank_run(energy_at_last=(9000.0, 5.0, 15000.0)).section(tokens_per_step=4096)
    assert section["energy"] is None
    assert section["energy_note"].startswith("rank 1 (node-a, GPU 1): its counter went down")
    assert "step 40" in section["energy_note"]


def test_a_rank_without_the_counter_leaves_the_joules_of_the_others_and_no_per_token():
    stats = TelemetryStats(PLACES, SOURCES)
    stats.add(samples(row(energy_j=100.0), row(energy_j=NAN), row(energy_j=300.0)), step=5, is_measured=lambda step: True)
    stats.add(samples(row(energy_j=150.0), row(energy_j=NAN), row(energy_j=400.0)), step=10, is_measured=lambda step: True)
    section = stats.section(tokens_per_step=1000)
    assert section["energy"]["joules"] == pytest.approx(150.0) and section["energy"]["ranks"] == 2
    assert section["energy"]["joules_per_token"] is None
    assert "ranks [1] had no energy counter" in section["energy_note"]


def test_one_measured_log_step_is_not_enough_for_energy():
    stats = TelemetryStats(PLACES, SOURCES)
    stats.add(samples(row(), row(), row()), step=10, is_measured=lambda step: False)
    stats.add(samples(row(), row(), row()), step=20, is_measured=lambda step: True)
    section = stats.section(tokens_per_step=1000)
    assert section["energy"] is None and "needs two measured log steps" in section["energy_note"]
    assert section["device"]["log_steps"] == 1


def test_nothing_available_on_any_rank_gives_no_section():
    stats = TelemetryStats(PLACES, {"memory": "unavailable: device is cpu", "nvml": "unavailable: device is cpu"})
    nan_rows = torch.full((3, len(FIELDS)), NAN, dtype=torch.float64)
    stats.add(nan_rows, step=10, is_measured=lambda step: True)
    stats.add(nan_rows, step=20, is_measured=lambda step: True)
    assert stats.section(tokens_per_step=1000) is None


def test_cpu_samples_of_real_ranks_give_no_section():
    devices = [DeviceTelemetry(torch.device("cpu")) for _ in PLACES]
    stats = TelemetryStats(PLACES, devices[0].sources())
    stats.add(torch.tensor([d.sample(1) for d in devices], dtype=torch.float64), step=1, is_measured=lambda step: True)
    assert stats.section(tokens_per_step=1) is None


def test_memory_only_ranks_give_memory_and_no_device_or_energy():
    stats = TelemetryStats(PLACES[:2], SOURCES)
    only_memory = [row()[:5] + [NAN] * (len(FIELDS) - 5), row(alloc_gib=20.0)[:5] + [NAN] * (len(FIELDS) - 5)]
    stats.add(samples(*only_memory), step=20, is_measured=lambda step: True)
    stats.add(samples(*only_memory), step=30, is_measured=lambda step: True)
    section = stats.section(tokens_per_step=1000)
    assert section["memory"]["peak_allocated_gib"]["max_at"] == PLACES[1]
    assert section["device"]["power_w"] is None and section["device"]["throttle_reasons"] == {}
    assert section["energy"] is None and "no rank had the NVML energy counter" in section["energy_note"]


def test_samples_of_the_wrong_shape_are_refused_with_what_to_do():
    stats = TelemetryStats(PLACES, SOURCES)
    with pytest.raises(ValueError, match=r"\[ranks=3, fields=12\], got \[2, 12\]"):
        stats.add(torch.zeros(2, len(FIELDS), dtype=torch.float64), step=1, is_measured=lambda step: True)


# ---------------------------------------------------------------------------------------------
# the telemetry thread: NVML is never read on the training thread


def test_readings_come_from_the_telemetry_thread_one_log_step_late_and_sample_never_waits():
    from nemo_throughput.bench.stand_in import SlowEnergyNvml

    nvml_stand_in = SlowEnergyNvml(energy_read_s=0.2)
    with telemetry.nvml_stand_in(nvml_stand_in.reader):
        device = DeviceTelemetry(torch.device("cpu"))
    assert device.sources()["nvml"] == "stand-in for NVML"
    first = dict(zip(FIELDS, device.sample(10), strict=True))  # nothing read yet; asks for readings after step 10
    assert all_nan(list(first.values()))
    assert nvml_stand_in.readers.get("MainThread") is None  # the 0.2 s read did not run here
    after_10 = dict(zip(FIELDS, device.sample_now(20, timeout_s=0.0), strict=True))  # not waited for
    final = dict(zip(FIELDS, device.sample_now(30, timeout_s=5.0), strict=True))
    assert final["read_at_step"] == 30 and final["power_w"] == 500.0 and final["energy_j"] > 0
    assert math.isnan(after_10["read_at_step"]) or after_10["read_at_step"] == 10
    device.close()
    assert set(nvml_stand_in.readers) == {"nemo-throughput-telemetry"}


def test_a_fit_reads_nvml_on_the_telemetry_thread_only_and_counts_energy_between_log_steps(
        tmp_path, quiet_trainer_kwargs):
    """A real Lightning fit whose NVML energy read takes 5 ms: no NVML call on the training thread,
    and the energy per token pairs each reading with the log step it was taken after."""
    import pytorch_lightning as pl

    from conftest import tiny_gpt_cfg
    from nemo_throughput import ThroughputCallback
    from nemo_throughput.bench.stand_in import SlowEnergyNvml
    from nemo_throughput.demo.gpt import DemoGPT

    nvml_stand_in = SlowEnergyNvml(energy_read_s=0.005)
    callback = ThroughputCallback(output_dir=str(tmp_path / "throughput"), log_every_n_steps=4, warmup_steps=4)
    trainer = pl.Trainer(max_steps=14, callbacks=[callback], logger=False, **quiet_trainer_kwargs)
    with telemetry.nvml_stand_in(nvml_stand_in.reader):
        trainer.fit(DemoGPT(tiny_gpt_cfg(global_batch_size=2)))
    summary = json.loads(open(callback.summary_path).read())
    assert set(nvml_stand_in.readers) == {"nemo-throughput-telemetry"}  # never the training thread
    section = summary["telemetry"]
    assert section["sources"]["nvml"] == "stand-in for NVML" and section["device"]["power_w"]["max"] == 500.0
    energy = section["energy"]
    # Read after log step 4 (the warm-up's end: steps 5.. are measured) up to after the run's last step.
    last = summary["timing"]["last_step"]
    assert (energy["first_step"], energy["last_step"], energy["steps"]) == (4, last, last - 4) and last > 8
    assert energy["joules"] > 0 and energy["joules_per_token"] == pytest.approx(
        energy["joules"] / ((last - 4) * summary["batch"]["tokens_per_step"]))


# ---------------------------------------------------------------------------------------------
# the real thing, on a GPU (skipped without one)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_real_gpu_sample_reads_memory_without_a_device_sync():
    device = DeviceTelemetry(torch.device("cuda", torch.cuda.current_device()))
    x = torch.randn(4096, 4096, device="cuda")
    y = x @ x  # work in flight while sampling
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")  # any synchronizing call in the reads raises
    try:
        values = dict(zip(FIELDS, device.sample_now(1), strict=True))
    finally:
        torch.cuda.set_sync_debug_mode(previous)
    del y
    assert device.sources()["memory"] == "torch.cuda.memory_stats"
    assert values["mem_peak_allocated_bytes"] >= 2 * 4096 * 4096 * 4
    assert values["mem_total_bytes"] == torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    source = device.sources()["nvml"]
    assert source.startswith(("nvidia-ml-py", "unavailable:"))
    if source.startswith("nvidia-ml-py"):
        assert source.startswith(telemetry.nvml()[1]) and "; device by " in source
        assert values["sm_clock_mhz"] > 0 and values["temperature_c"] > 0
