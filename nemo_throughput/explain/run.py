"""What the callback collects to explain its numbers, in one place: the start-up probe, the
per-rank telemetry sampled on log steps, the profiled window and the network facts.

Per-rank values travel to rank 0 as one fixed-length vector per rank appended to each log
step's all-gather (``Exchange(extras_width=...)``), so explaining adds no collective to training.
This module owns that vector's whole layout, the goodput % (rank 0's, for the loggers of every
rank) included:

    [sample step, goodput %, telemetry FIELDS..., profile window FIELDS...]     (NaN: unknown)
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any

import torch

from nemo_throughput.config import ThroughputConfig
from nemo_throughput.explain.network import network_section
from nemo_throughput.explain.probe import run_probe
from nemo_throughput.explain.profiler import ProfileWindow, communication_section
from nemo_throughput.explain.telemetry import DeviceTelemetry
from nemo_throughput.explain.telemetry_stats import TelemetryStats
from nemo_throughput.text import package_logger

log = package_logger(__name__)

TRACES_DIR = "traces"


class RunExplanation:
    """Owned by the callback on every rank; rank 0 also turns what arrives into summary sections."""

    def __init__(self, config: ThroughputConfig, device: torch.device, rank: int, places: list[dict[str, Any]],
                 output_dir: str, rank_records: list[dict[str, Any]], backend: str | None) -> None:
        self.places = places
        # A collective: every rank runs it (the places are known: no gather of them again).
        self.probe = run_probe(device=device, places=places) if config.probe else None
        self._rank_records, self._backend = rank_records, backend
        self.network = network_section(rank_records, backend)
        self.telemetry = DeviceTelemetry(device) if config.telemetry else None
        self._telemetry_stats = TelemetryStats(places, self.telemetry.sources()) if self.telemetry else None
        self.window: ProfileWindow | None = None
        self._window_steps, self._window_mode = config.profile_steps, config.profile_mode
        self._traces: list[str] = []
        self._communication: dict[str, Any] | None = None
        if config.profile_steps is not None:
            trace = None
            if rank in config.profile_trace_ranks:
                trace = os.path.join(TRACES_DIR, f"rank{rank}.json")
                os.makedirs(os.path.join(output_dir, TRACES_DIR), exist_ok=True)
            # Every rank knows which ranks write traces: the list in the summary needs no exchange.
            self._traces = [os.path.join(TRACES_DIR, f"rank{r}.json") for r in config.profile_trace_ranks
                            if r < len(places)]
            self.window = ProfileWindow(*config.profile_steps, mode=config.profile_mode, device=device,
                                        trace_path=os.path.join(output_dir, trace) if trace else None)
        self._telemetry_width = len(DeviceTelemetry.FIELDS) if self.telemetry else 0
        self._window_width = len(ProfileWindow.FIELDS) if self.window else 0

    @property
    def width(self) -> int:
        """Length of the per-rank vector each log step's all-gather carries."""
        return 2 + self._telemetry_width + self._window_width

    def step_start(self, step: int) -> None:
        """Step ``step`` (1-based) starts: a profile window over it opens or goes on."""
        if self.window is not None and self.window.contains(step):
            self.window.step_start(step)

    def step_end(self, step: int) -> bool:
        """Step ``step`` ended; True when it closed the profile window (stopping the profiler and
        reading its trace took time that is no step's)."""
        if self.window is None or not self.window.contains(step):
            return False
        self.window.step_end(step)
        return step == self.window.last_step

    def close(self) -> None:
        """End a profile window that training left early (it waits for the device)."""
        if self.window is not None:
            self.window.close()

    def sample(self, step: int, goodput_pct: float, final: bool = False) -> list[float]:
        """This rank's vector at log step ``step``: no device read, no sync (the telemetry thread
        reads). ``goodput_pct``: the run's goodput so far as rank 0 knows it (NaN: none yet, or not
        rank 0). ``final``: the run's last vector, with telemetry read after ``step`` (waited for,
        briefly); the telemetry thread ends."""
        values = [float(step), goodput_pct]
        if self.telemetry and final:
            values += self.telemetry.sample_now(step)
            self.telemetry.close()
        elif self.telemetry:
            values += self.telemetry.sample(step)
        if self.window:
            values += self.window.result() or [math.nan] * self._window_width
        return values

    def absorb(self, extras: torch.Tensor, is_measured: Callable[[int], bool]) -> float | None:
        """Take every rank's vector ``[ranks, width]`` (rank 0 builds the sections from it); returns
        the goodput % rank 0 sent (NaN: it had none), None where nothing was sent (a final exchange
        that did not complete). ``is_measured``: whether a step counts in the statistics."""
        if extras.shape[1] != self.width or bool(extras[:, 0].isnan().any()):
            return None
        step, goodput_pct = int(extras[0, 0]), float(extras[0, 1])
        telemetry = extras[:, 2:2 + self._telemetry_width]
        window = extras[:, 2 + self._telemetry_width:]
        if self._telemetry_stats is not None:
            self._telemetry_stats.add(telemetry, step, is_measured)
        if self.window is not None and self._communication is None and _window_closed(window):
            self._communication = communication_section(window, self.places, self._window_steps,
                                                        self._window_mode, self._traces)
        return goodput_pct

    def live(self, tokens_per_step: float | None) -> dict[str, float | None]:
        """The loggers' telemetry keys as of the latest log step absorbed (TelemetryStats.live); {} without."""
        return self._telemetry_stats.live(tokens_per_step) if self._telemetry_stats else {}

    @property
    def latest_telemetry(self) -> list[dict[str, float]]:
        """Every rank's telemetry FIELDS at the latest log step absorbed ([] before one, or without)."""
        return self._telemetry_stats.latest if self._telemetry_stats else []

    def sections(self, tokens_per_step: int | None, final: bool = False) -> dict[str, Any]:
        """The summary's explaining sections, as of what rank 0 has absorbed. ``final`` reads the
        network again: NCCL writes which transport it chose at the first collectives, not at set-up."""
        if final:
            self.network = network_section(self._rank_records, self._backend)
        return {
            "telemetry": self._telemetry_stats.section(tokens_per_step) if self._telemetry_stats else None,
            "communication": self._communication,
            "network": self.network,
            "probe": self.probe,
        }


def _window_closed(window: torch.Tensor) -> bool:
    """Some rank's profile window FIELDS are in: timed, or saying why not."""
    return not bool(window[:, 0].isnan().all() and window[:, -1].isnan().all())
