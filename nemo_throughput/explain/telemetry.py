"""Memory and device telemetry per rank, read on a thread of the rank's own right after each log step
(explain.telemetry_stats makes the summary's ``telemetry`` section of every rank's samples).

The training thread never reads the device: at a log step it takes the readings the telemetry
thread finished last (those taken right after the previous log step, which say so in
``read_at_step``) and asks for new ones. NVML's energy counter alone takes 3 to 6 ms per read on an
H200; every other read takes microseconds. The energy counter is read at the log steps' ends (plus
the read's own milliseconds), so energy per token counts the steps between two reads exactly.

Every read here is host-side and never synchronizes the device:

- ``torch.cuda.memory_stats`` reads the caching allocator's counters, kept on the host.
- The device's total memory comes from ``torch.cuda.get_device_properties`` (cached by torch), not
  from ``torch.cuda.mem_get_info``: that calls ``cudaMemGetInfo``, which CUDA does not document as
  synchronizing but which creates a context when there is none and has been seen to wait
  (pytorch/pytorch#174625, #103584); a log step must not pay for that.
- NVML (``nvidia-ml-py``, ``import pynvml``) queries the driver, not the CUDA stream.

Any read may fail (no driver, NVML ``NotSupported`` on a part, a MIG instance): that field is NaN
and :meth:`DeviceTelemetry.sources` says why. Nothing raises into training.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from collections.abc import Callable, Iterator
from importlib import metadata
from types import ModuleType
from typing import Any

import torch

from nemo_throughput.text import package_logger
from nemo_throughput.values import whole_number

log = package_logger(__name__)

FIELDS: tuple[str, ...] = (
    "mem_peak_allocated_bytes",  # allocator peak since the process started (torch.cuda.memory_stats)
    "mem_peak_reserved_bytes",
    "mem_total_bytes",  # the device's memory (get_device_properties), for near-OOM
    "alloc_retries",  # cudaMalloc failures the allocator retried after freeing its cache
    "ooms",  # out-of-memory errors the allocator raised
    "sm_clock_mhz",
    "mem_clock_mhz",
    "power_w",
    "temperature_c",
    "throttle_reasons",  # NVML clocks-event reasons bitmask, as a float (exact below 2**53)
    "energy_j",  # NVML total energy counter: joules since the driver loaded
    "read_at_step",  # the log step right after which these were read (NaN: nothing read yet)
)
_INDEX = {name: i for i, name in enumerate(FIELDS)}
_MEMORY_FIELDS = FIELDS[:5]
_NVML_FIELDS = FIELDS[5:-1]


# NVML's clocks-event reasons (nvml.h nvmlClocksEventReason*; older names nvmlClocksThrottleReason*).
# tests/test_telemetry.py checks every bit against the installed pynvml's constants.
CLOCKS_EVENT_REASONS: dict[int, str] = {
    0x1: "GpuIdle",
    0x2: "ApplicationsClocksSetting",  # also named UserDefinedClocks
    0x4: "SwPowerCap",
    0x8: "HwSlowdown",
    0x10: "SyncBoost",
    0x20: "SwThermalSlowdown",
    0x40: "HwThermalSlowdown",
    0x80: "HwPowerBrakeSlowdown",
    0x100: "DisplayClockSetting",
    0x200: "BoardLimit",  # nvmlClocksThrottleReasonBoardLimit
    0x400: "Reliability",  # nvmlClocksThrottleReasonReliability
}

# The reasons that lower clocks below what the work asks for (not idle, not a setting): a throttled GPU.
SLOWDOWN_REASONS = ("SwPowerCap", "HwSlowdown", "SwThermalSlowdown", "HwThermalSlowdown", "HwPowerBrakeSlowdown")

NAN = float("nan")


def throttled(bitmask: float) -> bool | None:
    """Whether a clocks-event reasons mask (a float, as sampled) holds a slowdown; None: not read (NaN)."""
    if math.isnan(bitmask):
        return None
    return any(name in SLOWDOWN_REASONS for name in throttle_reason_names(int(bitmask)))


def throttle_reason_names(bitmask: int) -> list[str]:
    """NVML's names for the bits set in a clocks-event reasons mask; unknown bits as hex."""
    names = []
    bit = 1
    while bit <= bitmask:
        if bitmask & bit:
            names.append(CLOCKS_EVENT_REASONS.get(bit, f"0x{bit:x}"))
        bit <<= 1
    return names


# ---------------------------------------------------------------------------------------------
# NVML: initialised once per process, never shut down (other code in the process may use it too)

_nvml_lock = threading.Lock()
_nvml_state: tuple[ModuleType | None, str] | None = None


def nvml() -> tuple[ModuleType | None, str]:
    """(pynvml or None, its source: "nvidia-ml-py <version>" or "unavailable: <why>"). Once per process."""
    global _nvml_state
    with _nvml_lock:
        if _nvml_state is None:
            _nvml_state = _init_nvml()
        return _nvml_state


def _init_nvml() -> tuple[ModuleType | None, str]:
    try:
        import pynvml
    except ImportError:
        return None, ("unavailable: nvidia-ml-py is not installed "
                      "(pip install 'nemo-throughput[telemetry]' for clocks, power and energy)")
    try:
        pynvml.nvmlInit()
    except Exception as error:  # NVMLError_LibraryNotFound, DriverNotLoaded, NoPermission, ...
        return None, f"unavailable: nvmlInit failed: {_describe(error)}"
    return pynvml, f"nvidia-ml-py {_version('nvidia-ml-py')}, driver {_driver_version(pynvml)}"


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "unknown"


def _driver_version(pynvml: ModuleType) -> str:
    try:
        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception as error:
        return f"unknown ({_describe(error)})"


def _describe(error: BaseException) -> str:
    text = str(error) or type(error).__name__
    return text if type(error).__name__ in text else f"{type(error).__name__}: {text}"


def _is_not_supported(error: BaseException) -> bool:
    """NVML says the part or the driver lacks this query: asking again will not help."""
    value = getattr(error, "value", None)
    return value in (3, 13)  # NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND


def nvml_handle(pynvml: ModuleType, device_index: int,
                env: dict[str, str] | os._Environ[str] = os.environ) -> tuple[Any, str]:
    """The NVML handle of the GPU torch calls ``cuda:<device_index>`` in this process, and how it was found.

    CUDA numbers the GPUs it can see (CUDA_VISIBLE_DEVICES, in CUDA_DEVICE_ORDER); NVML numbers all
    GPUs of the node in PCI order. Matching by UUID or PCI bus id from torch's device properties
    is exact; CUDA_VISIBLE_DEVICES is the fallback.
    """
    failures = []
    for how, find in _handle_finders(pynvml, device_index, env):
        try:
            return find(), how
        except Exception as error:
            failures.append(f"{how}: {_describe(error)}")
    raise LookupError("no NVML device matches cuda:" + str(device_index) + " (" + "; ".join(failures) + ")")


def _handle_finders(pynvml: ModuleType, device_index: int,
                    env: Any) -> list[tuple[str, Callable[[], Any]]]:
    finders: list[tuple[str, Callable[[], Any]]] = []
    properties = _device_properties(device_index)
    uuid = str(getattr(properties, "uuid", "") or "")
    if uuid:
        nvml_uuid = uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"
        finders.append((f"uuid {nvml_uuid}", lambda: pynvml.nvmlDeviceGetHandleByUUID(nvml_uuid)))
    bus = getattr(properties, "pci_bus_id", None)
    if bus is not None:
        pci = (f"{getattr(properties, 'pci_domain_id', 0):08x}:{bus:02x}:"
               f"{getattr(properties, 'pci_device_id', 0):02x}.0")
        finders.append((f"pci bus id {pci}", lambda: pynvml.nvmlDeviceGetHandleByPciBusId(pci)))
    visible = [part.strip() for part in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if part.strip()]
    # NVML counts in PCI order; CUDA does too only with CUDA_DEVICE_ORDER=PCI_BUS_ID
    order = "" if env.get("CUDA_DEVICE_ORDER") == "PCI_BUS_ID" else ", assuming CUDA's order is PCI order"
    if "CUDA_VISIBLE_DEVICES" not in env:
        finders.append((f"index {device_index} (CUDA_VISIBLE_DEVICES unset{order})",
                        lambda: pynvml.nvmlDeviceGetHandleByIndex(device_index)))
    elif device_index < len(visible):
        entry = visible[device_index]
        if (index := whole_number(entry)) is not None:
            finders.append((f"index {entry} (CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']}{order})",
                            lambda: pynvml.nvmlDeviceGetHandleByIndex(index)))
        else:
            finders.append((f"uuid prefix {entry} (CUDA_VISIBLE_DEVICES)",
                            lambda: _handle_by_uuid_prefix(pynvml, entry)))
    return finders


def _device_properties(device_index: int) -> Any:
    try:
        return torch.cuda.get_device_properties(device_index)
    except Exception:  # no CUDA here: the CUDA_VISIBLE_DEVICES fallback still applies
        return None


def _handle_by_uuid_prefix(pynvml: ModuleType, prefix: str) -> Any:
    """CUDA accepts a unique prefix of a UUID in CUDA_VISIBLE_DEVICES; NVML wants the whole UUID."""
    matches = []
    for index in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        uuid = pynvml.nvmlDeviceGetUUID(handle)
        uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
        if uuid.startswith(prefix):
            matches.append(handle)
    if len(matches) != 1:
        raise LookupError(f"{len(matches)} GPUs have a UUID starting with {prefix!r}")
    return matches[0]


# A stand-in for NVML that every DeviceTelemetry made while it is set reads, on any device.
_stand_in: Callable[[], NvmlReader] | None = None


@contextlib.contextmanager
def nvml_stand_in(make_reader: Callable[[], NvmlReader]) -> Iterator[None]:
    """Every :class:`DeviceTelemetry` made inside reads its NVML fields from ``make_reader()``, on any
    device: the bench's slow-NVML condition and the tests time and watch our reads without a GPU."""
    global _stand_in
    previous, _stand_in = _stand_in, make_reader
    try:
        yield
    finally:
        _stand_in = previous


def _nvml_readers(pynvml: ModuleType) -> dict[str, list[Callable[[Any], float]]]:
    """Per field, the NVML calls that give it, newest API first (a driver may lack the newer one)."""
    readers: dict[str, list[Callable[[Any], float]]] = {
        "sm_clock_mhz": [lambda h: pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)],
        "mem_clock_mhz": [lambda h: pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM)],
        "power_w": [lambda h: pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0],  # milliwatts
        "temperature_c": [lambda h: pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)],
        "throttle_reasons": [lambda h: pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(h)],
        "energy_j": [lambda h: pynvml.nvmlDeviceGetTotalEnergyConsumption(h) / 1000.0],  # millijoules, Volta+
    }
    if hasattr(pynvml, "nvmlDeviceGetTemperatureV"):
        readers["temperature_c"].insert(0, lambda h: pynvml.nvmlDeviceGetTemperatureV(h, pynvml.NVML_TEMPERATURE_GPU))
    if hasattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons"):
        readers["throttle_reasons"].insert(0, lambda h: pynvml.nvmlDeviceGetCurrentClocksEventReasons(h))
    return readers


class NvmlReader:
    """The NVML fields of one GPU. A field NVML refuses is NaN; one it does not support on this part
    or driver (NotSupported, FunctionNotFound) is not asked again."""

    def __init__(self, pynvml: ModuleType, handle: Any) -> None:
        self.handle = handle
        self.readers = _nvml_readers(pynvml)
        self.errors: dict[str, str] = {}  # field -> why its last read failed
        self.gave_up: set[str] = set()

    def sample(self) -> dict[str, float]:
        return {name: self._read(name) for name in _NVML_FIELDS}

    def _read(self, name: str) -> float:
        if name in self.gave_up:
            return NAN
        errors = []
        for read in self.readers[name]:
            try:
                value = float(read(self.handle))
            except Exception as error:
                errors.append(error)
                continue
            self.errors.pop(name, None)
            self.readers[name] = [read] + [r for r in self.readers[name] if r is not read]  # ask it first next time
            return value
        self.errors[name] = "; ".join(_describe(error) for error in errors)
        if all(_is_not_supported(error) for error in errors):
            self.gave_up.add(name)  # the part or driver lacks it: asking again will not help
        return NAN


class DeviceTelemetry:
    """One rank's memory and GPU readings for the log-step all-gather: ``sample(step)`` gives FIELDS.

    The reads run on a thread of this rank's own ("nemo-throughput-telemetry", started where there
    is anything to read); ``sample`` takes its latest readings and asks for new ones, and never
    waits."""

    FIELDS = FIELDS

    def __init__(self, device: torch.device, env: Any = os.environ) -> None:
        self.device = torch.device(device)
        self._memory_source, self._total_bytes = self._open_memory()
        self._nvml_source = self._not_cuda("NVML reads the GPU a rank uses")
        self._nvml_reader = _stand_in() if _stand_in is not None else None
        if self._nvml_reader is not None:
            self._nvml_source = "stand-in for NVML"
        elif self._is_cuda:
            try:
                self._open_nvml(env)
            except Exception as error:  # telemetry must never stop training
                log.warning("NVML telemetry off: %s", error)
                self._nvml_source = f"unavailable: {_describe(error)}"
        self._latest = [NAN] * len(FIELDS)  # the telemetry thread's last readings (replaced whole)
        self._asked: int | None = None  # the log step whose readings are asked for
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None
        if self._memory_source == "torch.cuda.memory_stats" or self._nvml_reader is not None:
            self._thread = threading.Thread(target=self._serve, name="nemo-throughput-telemetry", daemon=True)
            self._thread.start()

    @property
    def _is_cuda(self) -> bool:
        return self.device.type == "cuda" and torch.cuda.is_available()

    def _device_index(self) -> int:
        return self.device.index if self.device.index is not None else torch.cuda.current_device()

    def _not_cuda(self, what: str) -> str:
        if self.device.type != "cuda":
            return f"unavailable: device is {self.device.type} ({what})"
        return f"unavailable: torch.cuda.is_available() is False: CPU-only torch or no GPU visible ({what})"

    def _open_memory(self) -> tuple[str, float]:
        if not self._is_cuda:
            return self._not_cuda("allocator statistics exist for CUDA devices"), NAN
        try:
            total = float(torch.cuda.get_device_properties(self._device_index()).total_memory)
        except Exception as error:
            log.debug("no device total memory: %s", error)
            total = NAN
        return "torch.cuda.memory_stats", total

    def _open_nvml(self, env: Any) -> None:
        pynvml, source = nvml()
        if pynvml is None:
            self._nvml_source = source
            return
        try:
            handle, how = nvml_handle(pynvml, self._device_index(), env)
        except LookupError as error:
            self._nvml_source = f"unavailable: {error}"
            return
        self._nvml_reader = NvmlReader(pynvml, handle)
        self._nvml_source = f"{source}; device by {how}"

    def sources(self) -> dict[str, Any]:
        """Where the readings come from, or why a group is unavailable; per-field NVML failures."""
        result: dict[str, Any] = {"memory": self._memory_source, "nvml": self._nvml_source}
        if self._nvml_reader is not None and self._nvml_reader.errors:
            result["nvml_fields"] = dict(sorted(self._nvml_reader.errors.items()))
        return result

    def sample(self, step: int) -> list[float]:
        """FIELDS as last read (NaN where unavailable, or before the first reading), and the readings
        right after log step ``step`` asked for. On the training thread: reads nothing, never waits."""
        latest = self._latest
        if self._thread is not None:
            with self._wake:
                self._asked = step
                self._wake.notify()
        return list(latest)

    def sample_now(self, step: int, timeout_s: float = 1.0) -> list[float]:
        """FIELDS read after step ``step`` (the run's last), waiting for them at most ``timeout_s``;
        the latest readings where they do not come in time."""
        self.sample(step)
        deadline = time.monotonic() + timeout_s
        with self._wake:
            while self._thread is not None and self._latest[-1] != step and time.monotonic() < deadline:
                self._wake.wait(max(0.0, deadline - time.monotonic()))
        return list(self._latest)

    def close(self) -> None:
        """End the telemetry thread (a later sample reads nothing new)."""
        thread, self._thread = self._thread, None
        if thread is not None:
            with self._wake:
                self._asked = -1
                self._wake.notify_all()

    def _serve(self) -> None:
        while True:
            with self._wake:
                while self._asked is None:
                    self._wake.wait()
                step, self._asked = self._asked, None
            if step < 0 or self._thread is None:
                return
            values = self._read(step)
            with self._wake:
                self._latest = values
                self._wake.notify_all()

    def _read(self, step: int) -> list[float]:
        """FIELDS now: the allocator's counters and NVML's readings (the telemetry thread's work)."""
        values = dict.fromkeys(FIELDS, NAN)
        if self._memory_source == "torch.cuda.memory_stats":
            values.update(self._memory_sample())
        if self._nvml_reader is not None:
            values.update(self._nvml_reader.sample())
        values["read_at_step"] = float(step)
        return [values[name] for name in FIELDS]

    def _memory_sample(self) -> dict[str, float]:
        try:
            stats = torch.cuda.memory_stats(self.device)
        except Exception as error:  # never into training
            log.debug("torch.cuda.memory_stats failed: %s", error)
            return {}
        return {**memory_fields(stats), "mem_total_bytes": self._total_bytes}


def memory_fields(stats: dict[str, Any]) -> dict[str, float]:
    """The allocator's peaks and failure counters from ``torch.cuda.memory_stats()``; NaN if absent."""
    keys = {"mem_peak_allocated_bytes": "allocated_bytes.all.peak",
            "mem_peak_reserved_bytes": "reserved_bytes.all.peak",
            "alloc_retries": "num_alloc_retries", "ooms": "num_ooms"}
    return {field: float(stats[key]) if key in stats else NAN for field, key in keys.items()}
