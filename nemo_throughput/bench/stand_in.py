"""A stand-in for NVML (``pynvml``) whose energy counter is as slow to read as a real one: every
other read answers at once, ``nvmlDeviceGetTotalEnergyConsumption`` takes ``energy_read_s`` (5 ms:
NVML's took 3.3 to 5.5 ms per read on an H200, driver 580.159.04). It counts energy as a constant
power over time and records which threads read it. The bench's ``nemo-throughput-slow-nvml``
condition and the tests use it (explain.telemetry.nvml_stand_in) to show, without a GPU, that no
NVML read runs on the training thread."""

from __future__ import annotations

import threading
import time
from typing import Any

from nemo_throughput.explain.telemetry import NvmlReader


class SlowEnergyNvml:
    NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU = 0, 1, 0

    def __init__(self, energy_read_s: float = 0.005, power_w: float = 500.0) -> None:
        self.energy_read_s, self.power_w = energy_read_s, power_w
        self.readers: dict[str, int] = {}  # thread name -> reads
        self._lock = threading.Lock()
        self._started = time.monotonic()

    def reader(self) -> NvmlReader:
        """An NvmlReader over this stand-in (one GPU)."""
        return NvmlReader(self, handle=0)

    def _read(self) -> None:
        with self._lock:
            name = threading.current_thread().name
            self.readers[name] = self.readers.get(name, 0) + 1

    def nvmlDeviceGetClockInfo(self, handle: Any, clock: int) -> int:
        self._read()
        return 1980 if clock == self.NVML_CLOCK_SM else 2619

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        self._read()
        return int(self.power_w * 1000)  # milliwatts

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        self._read()
        return 60

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any) -> int:
        self._read()
        return 0

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        self._read()
        time.sleep(self.energy_read_s)
        return int(self.power_w * (time.monotonic() - self._started) * 1000)  # millijoules
