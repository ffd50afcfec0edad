"""Rank 0's side of telemetry: every rank's samples (explain.telemetry's FIELDS, gathered on log
steps) turned into the summary's ``telemetry`` section: memory peaks and near-OOM ranks, clocks,
power, temperature and throttling per rank (min / median / max, with the rank, host and GPU of each
extreme), and energy per step and per token from the NVML energy counter."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from typing import Any

import torch

from nemo_throughput.explain.telemetry import FIELDS, NAN, throttle_reason_names, throttled

GIB = 1024**3
JOULES_PER_KWH = 3.6e6
NEAR_OOM_SHARE = 0.95  # reserved peak at or above this share of the device's memory: near OOM

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

    def add(self, row: dict[str, float], step: int, measured: bool, bounds_measured: bool) -> None:
        """One rank's readings taken after log step ``step``; ``measured``: that step counts in
        throughput; ``bounds_measured``: the steps after it do (its energy reading may open the count)."""
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
        if bounds_measured:
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
        self.latest: list[dict[str, float]] = []  # every rank's FIELDS at the latest log step

    def add(self, samples: torch.Tensor, step: int, is_measured: Callable[[int], bool]) -> None:
        """Every rank's FIELDS ``[ranks, len(FIELDS)]`` sent at log step ``step``. Each row was read right
        after its ``read_at_step`` (the previous log step; NaN: at ``step`` itself). ``is_measured``:
        whether a step counts in throughput. The energy counter counts from the first reading after
        which the steps are measured."""
        if samples.dim() != 2 or samples.shape != (len(self._ranks), len(FIELDS)):
            raise ValueError(f"telemetry samples must be [ranks={len(self._ranks)}, fields={len(FIELDS)}], "
                             f"got {list(samples.shape)} (sample with DeviceTelemetry.sample() on every rank)")
        rows = samples.to(torch.float64).tolist()
        self._any_value = self._any_value or any(math.isfinite(v) for row in rows for v in row)
        self.latest = [dict(zip(FIELDS, row, strict=True)) for row in rows]
        self._log_steps["all"] += 1
        self._log_steps["measured"] += int(is_measured(step))
        for series, row in zip(self._ranks, self.latest, strict=True):
            # A rank whose telemetry thread fell behind sent older readings: each row counts as read.
            read = int(row["read_at_step"]) if math.isfinite(row["read_at_step"]) else step
            series.add(row, read, is_measured(read), is_measured(read + 1))

    def live(self, tokens_per_step: float | None) -> dict[str, float | None]:
        """The loggers' telemetry keys (progress.LOGGED_METRICS): the latest log step's readings over
        ranks (min / median / max), the ranks throttled then, and the run's energy so far per token."""
        values: dict[str, float | None] = {}
        for key, field, scale in (("memory_reserved_gib", "mem_peak_reserved_bytes", GIB),
                                  ("power_w", "power_w", 1.0), ("sm_clock_mhz", "sm_clock_mhz", 1.0)):
            spread = stat([row[field] / scale for row in self.latest], self.places) if self.latest else None
            values.update({f"{key}_{name}": spread[name] if spread else None for name in ("min", "median", "max")})
        read = [state for row in self.latest if (state := throttled(row["throttle_reasons"])) is not None]
        values["throttled_ranks"] = sum(read) if read else None
        energy, _ = self._energy(tokens_per_step) if self._any_value else (None, None)
        values.update({key: (energy or {}).get(key) for key in ("joules_per_token", "tokens_per_kwh")})
        return values

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
