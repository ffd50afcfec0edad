"""Memory and device telemetry per rank, read on log steps, and the summary's ``telemetry`` section.

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

import logging
import math
import os
import statistics
import threading
from collections.abc import Callable, Sequence
from importlib import metadata
from types import ModuleType
from typing import Any

import torch

log = logging.getLogger(__name__)

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
)
_INDEX = {name: i for i, name in enumerate(FIELDS)}
_MEMORY_FIELDS = FIELDS[:5]
_NVML_FIELDS = FIELDS[5:]

GIB = 1024**3
JOULES_PER_KWH = 3.6e6
NEAR_OOM_SHARE = 0.95  # reserved peak at or above this share of the device's memory: near OOM

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

NAN = float("nan")


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
        if entry.isdigit():
            finders.append((f"index {entry} (CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']}{order})",
                            lambda: pynvml.nvmlDeviceGetHandleByIndex(int(entry))))
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
    """One rank's memory and GPU readings for the log-step all-gather: ``sample()`` gives FIELDS."""

    FIELDS = FIELDS

    def __init__(self, device: torch.device, env: Any = os.environ) -> None:
        self.device = torch.device(device)
        self._memory_source, self._total_bytes = self._open_memory()
        self._nvml_source = self._not_cuda("NVML reads the GPU a rank uses")
        self._nvml_reader: NvmlReader | None = None
        if self._is_cuda:
            try:
                self._open_nvml(env)
            except Exception as error:  # telemetry must never stop training
                log.warning("NVML telemetry off: %s", error)
                self._nvml_source = f"unavailable: {_describe(error)}"

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

    def sample(self) -> list[float]:
        """FIELDS for this rank now; NaN where unavailable. Host-side reads only, never raises."""
        values = dict.fromkeys(FIELDS, NAN)
        if self._memory_source == "torch.cuda.memory_stats":
            values.update(self._memory_sample())
        if self._nvml_reader is not None:
            values.update(self._nvml_reader.sample())
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


# ---------------------------------------------------------------------------------------------
# Rank 0: the section from every rank's samples


_COUNTERS = ("mem_peak_allocated_bytes", "mem_peak_reserved_bytes", "alloc_retries", "ooms")
_READINGS = ("sm_clock_mhz", "mem_clock_mhz", "power_w", "temperature_c")  # averaged over log steps


class _RankSeries:
    """What one rank's samples add up to: maxima of counters, means of readings, the energy counter."""

    def __init__(self) -> None:
        self.memory = dict.fromkeys(_COUNTERS, NAN)  # maxima over every log step (peaks and counters only grow)
        self.total_bytes = NAN
        self.sums = {"all": dict.fromkeys(_READINGS, 0.0), "measured": dict.fromkeys(_READINGS, 0.0)}
        self.counts = {"all": dict.fromkeys(_READINGS, 0), "measured": dict.fromkeys(_READINGS, 0)}
        self.throttle = {"all": 0, "measured": 0}
        self.energy_first: tuple[int, float] | None = None  # (step, joules) at the first measured log step
        self.energy_last: tuple[int, float] | None = None
        self.energy_missing = False  # NaN at a measured log step after the first
        self.energy_reset: str | None = None

    def add(self, row: dict[str, float], step: int, measured: bool) -> None:
        for name in self.memory:
            if math.isfinite(row[name]):
                self.memory[name] = max(self.memory[name], row[name]) if math.isfinite(self.memory[name]) else row[name]
        if math.isfinite(row["mem_total_bytes"]):
            self.total_bytes = row["mem_total_bytes"]
        for kind in ("all", "measured") if measured else ("all",):
            for name in _READINGS:
                if math.isfinite(row[name]):
                    self.sums[kind][name] += row[name]
                    self.counts[kind][name] += 1
            if math.isfinite(row["throttle_reasons"]):
                self.throttle[kind] |= int(row["throttle_reasons"])
        if measured:
            self._add_energy(row["energy_j"], step)

    def _add_energy(self, joules: float, step: int) -> None:
        if self.energy_first is None:
            if math.isfinite(joules):
                self.energy_first = self.energy_last = (step, joules)
            return
        if not math.isfinite(joules):
            self.energy_missing = True
            return
        assert self.energy_last is not None
        if joules < self.energy_last[1] and self.energy_reset is None:
            self.energy_reset = (f"its counter went down from {self.energy_last[1]:.3f} J at step "
                                 f"{self.energy_last[0]} to {joules:.3f} J at step {step} "
                                 "(driver reloaded, or the counter reset or wrapped)")
        self.energy_last = (step, joules)

    def mean(self, name: str, kind: str) -> float:
        count = self.counts[kind][name]
        return self.sums[kind][name] / count if count else NAN


class TelemetryStats:
    """Rank 0's running view of every rank's telemetry; :meth:`section` is the summary's ``telemetry``."""

    def __init__(self, places: list[dict[str, Any]], sources: dict[str, Any]) -> None:
        self.places = places
        self.sources = sources
        self._ranks = [_RankSeries() for _ in places]
        self._log_steps = {"all": 0, "measured": 0}
        self._any_value = False

    def add(self, samples: torch.Tensor, step: int, measured: bool) -> None:
        """Every rank's FIELDS ``[ranks, len(FIELDS)]`` at log step ``step`` (measured: counted in throughput)."""
        if samples.dim() != 2 or samples.shape != (len(self._ranks), len(FIELDS)):
            raise ValueError(f"telemetry samples must be [ranks={len(self._ranks)}, fields={len(FIELDS)}], "
                             f"got {list(samples.shape)} (sample with DeviceTelemetry.sample() on every rank)")
        rows = samples.to(torch.float64).tolist()
        self._any_value = self._any_value or any(math.isfinite(v) for row in rows for v in row)
        self._log_steps["all"] += 1
        self._log_steps["measured"] += int(measured)
        for series, row in zip(self._ranks, rows, strict=True):
            series.add(dict(zip(FIELDS, row, strict=True)), step, measured)

    def section(self, tokens_per_step: int | None) -> dict[str, Any] | None:
        """The ``telemetry`` section; None when no rank had any reading."""
        if not self._any_value:
            return None
        energy, energy_note = self._energy(tokens_per_step)
        return {"sources": self.sources, "memory": self._memory(), "device": self._device(),
                "energy": energy, "energy_note": energy_note}

    # -- memory ------------------------------------------------------------------------------

    def _memory(self) -> dict[str, Any]:
        def per_rank(name: str, scale: float = 1.0) -> list[float]:
            return [s.memory[name] / scale for s in self._ranks]

        return {
            "peak_allocated_gib": stat(per_rank("mem_peak_allocated_bytes", GIB), self.places),
            "peak_reserved_gib": stat(per_rank("mem_peak_reserved_bytes", GIB), self.places),
            "alloc_retries": stat(per_rank("alloc_retries"), self.places),
            "ooms": stat(per_rank("ooms"), self.places),
            "near_oom_ranks": self.near_oom_ranks(),
        }

    def near_oom_ranks(self) -> list[int]:
        """Ranks whose reserved peak came within 5 % of the device's memory, or whose allocator
        had to retry (free its cache and call cudaMalloc again) or raised an OOM."""
        ranks = []
        for rank, s in enumerate(self._ranks):
            reserved, total = s.memory["mem_peak_reserved_bytes"], s.total_bytes
            full = math.isfinite(reserved) and math.isfinite(total) and total > 0 and reserved >= NEAR_OOM_SHARE * total
            failed = any(math.isfinite(s.memory[k]) and s.memory[k] > 0 for k in ("alloc_retries", "ooms"))
            if full or failed:
                ranks.append(self.places[rank]["rank"])
        return ranks

    # -- device ------------------------------------------------------------------------------

    def _device(self) -> dict[str, Any]:
        kind = "measured" if self._log_steps["measured"] else "all"
        result: dict[str, Any] = {name: stat([s.mean(name, kind) for s in self._ranks], self.places)
                                  for name in _READINGS}
        seen: dict[str, list[int]] = {}
        for rank, s in enumerate(self._ranks):
            for name in throttle_reason_names(s.throttle[kind]):
                seen.setdefault(name, []).append(self.places[rank]["rank"])
        result["throttle_reasons"] = seen
        result["log_steps"] = self._log_steps[kind]
        result["over"] = "measured log steps" if kind == "measured" else "all log steps (none measured yet)"
        return result

    # -- energy ------------------------------------------------------------------------------

    def _energy(self, tokens_per_step: int | None) -> tuple[dict[str, Any] | None, str | None]:
        """(energy, None), or (None, why not), or (energy, what is missing from it)."""
        counted = [r for r, s in enumerate(self._ranks) if s.energy_first is not None]
        if not counted:
            return None, ("no rank had the NVML energy counter at a measured log step "
                          f"(nvml: {self.sources.get('nvml', 'unknown')})")
        for rank in counted:
            if self._ranks[rank].energy_reset:
                return None, f"rank {self._place_text(rank)}: {self._ranks[rank].energy_reset}"
        complete = [r for r in counted if not self._ranks[r].energy_missing]
        first_steps = {self._ranks[r].energy_first[0] for r in complete}  # type: ignore[index]
        last_steps = {self._ranks[r].energy_last[0] for r in complete}  # type: ignore[index]
        if not complete or len(first_steps) != 1 or len(last_steps) != 1:
            return None, "the ranks' energy counters were read at different log steps (a rank lost its NVML reading)"
        first, last = first_steps.pop(), last_steps.pop()
        if last <= first:
            return None, f"needs two measured log steps; the counter was read only at step {first}"
        steps = last - first
        joules = sum(self._ranks[r].energy_last[1] - self._ranks[r].energy_first[1]  # type: ignore[index]
                     for r in complete)
        missing = [self.places[r]["rank"] for r in range(len(self._ranks)) if r not in complete]
        every_rank = not missing
        tokens = steps * tokens_per_step if tokens_per_step and every_rank else None
        energy = {
            "joules": joules, "steps": steps, "first_step": first, "last_step": last,
            "joules_per_step": joules / steps,
            "joules_per_token": joules / tokens if tokens and joules > 0 else None,
            "tokens_per_kwh": tokens / (joules / JOULES_PER_KWH) if tokens and joules > 0 else None,
            "ranks": len(complete),
        }
        note = None
        if missing:
            note = (f"ranks {missing} had no energy counter: joules cover {len(complete)} of {len(self._ranks)} GPUs, "
                    "so no per-token figures")
        return energy, note

    def _place_text(self, rank: int) -> str:
        place = self.places[rank]
        return f"{place['rank']} ({place['host']}, GPU {place['gpu_index']})"


def stat(values: Sequence[float], places: list[dict[str, Any]]) -> dict[str, Any] | None:
    """min / median / max over ranks of the finite values, with the place of the extremes; None if none."""
    finite = [(v, r) for r, v in enumerate(values) if math.isfinite(v)]
    if not finite:
        return None
    low = min(finite, key=lambda item: item[0])  # ties: the lowest rank
    high = max(finite, key=lambda item: (item[0], -item[1]))
    return {"min": low[0], "median": statistics.median(v for v, _ in finite), "max": high[0],
            "min_at": _place(places[low[1]]), "max_at": _place(places[high[1]])}


def _place(place: dict[str, Any]) -> dict[str, Any]:
    return {"rank": place["rank"], "host": place["host"], "gpu_index": place["gpu_index"]}
