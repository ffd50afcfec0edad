"""Time to target, the MLPerf way: a run clock from before any data is touched until the monitored
metric first reaches its target.

MLPerf Training scores a run by the time from ``run_start`` to ``run_stop``: the clock starts
after initialisation, before the first batch is read; evaluation time counts (it is part of
training to quality); it stops when the quality target is first reached. The callback starts
the clock at the end of its set-up (Lightning calls it before any data loader is created or
read), and checks ``trainer.callback_metrics`` after each validation and on log steps.

With ``mllog`` on, rank 0 also writes ``:::MLLOG`` lines through mlperf-logging's own ``mllog``
(run_start, eval_accuracy, run_stop with its status), to stdout and to ``mlperf.log`` in the
output directory, so that MLPerf's tools (and ``nemo-throughput import --format mlperf``) read them.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from nemo_throughput.text import package_logger, printable
from nemo_throughput.values import is_number

log = package_logger(__name__)

MODES = ("min", "max")
REACHED, NOT_REACHED = "target_reached", "target_not_reached"
MLLOG_FILE = "mlperf.log"


@dataclass(frozen=True)
class Target:
    """The quality a run trains to: ``metric`` (a key of trainer.callback_metrics) reaching
    ``value`` from below (``mode: max``, e.g. accuracy) or from above (``mode: min``, e.g. loss)."""

    metric: str
    value: float
    mode: str
    stop: bool = False  # end training when reached (trainer.should_stop), as an MLPerf run does

    def reached(self, observed: float) -> bool:
        return observed <= self.value if self.mode == "min" else observed >= self.value

    def to_dict(self) -> dict[str, Any]:
        return {"metric": self.metric, "value": self.value, "mode": self.mode, "stop": self.stop}


def checked_target(value: Any) -> dict[str, Any] | None:
    """The ``target`` setting as a plain dict, each key checked; None when not set."""
    if value is None:
        return None
    example = "with Hydra: callbacks.throughput.target={metric:val_loss,value:2.5,mode:min}"
    if not isinstance(value, Mapping):
        raise ValueError(f"target must be a mapping {{metric, value, mode}}, got {value!r} "
                         f"({type(value).__name__}); {example}")
    unknown = sorted(set(value) - {"metric", "value", "mode", "stop"})
    missing = [key for key in ("metric", "value", "mode") if value.get(key) is None]
    if unknown or missing:
        raise ValueError(f"target needs metric, value and mode (and may have stop); got unknown {unknown}, "
                         f"missing {missing}; {example}")
    metric, number, mode, stop = value["metric"], value["value"], value["mode"], value.get("stop", False)
    if not isinstance(metric, str) or not metric:
        raise ValueError(f"target.metric must be the name of a logged metric (a key of trainer.callback_metrics), "
                         f"got {metric!r}")
    if not is_number(number) or not math.isfinite(number):
        raise ValueError(f"target.value must be a finite number, got {number!r} ({type(number).__name__})")
    if mode not in MODES:
        raise ValueError(f"target.mode must be min (a loss: reached at or below the value) or max (an accuracy: "
                         f"at or above it), got {mode!r}")
    if not isinstance(stop, bool):
        raise ValueError(f"target.stop must be true or false, got {stop!r}")
    return Target(metric, float(number), mode, stop).to_dict()


class TimeToTarget:
    """The run clock and the first time the target is reached."""

    def __init__(self, target: Target, clock: Any = time.monotonic) -> None:
        self.target = target
        self._clock = clock
        self.started_s: float | None = None  # run_start on the clock (time.monotonic)
        self.started_wall_ms: int | None = None  # run_start as MLPerf logs it (ms since the epoch)
        self.seconds: float | None = None  # run_start to the check that found the target reached
        self.step: int | None = None
        self.value: float | None = None  # the value that reached it, or the last one seen

    @property
    def reached(self) -> bool:
        return self.seconds is not None

    def start(self) -> None:
        self.started_s, self.started_wall_ms = self._clock(), int(time.time() * 1000)

    def elapsed_s(self) -> float:
        return self._clock() - self.started_s

    def check(self, metrics: Mapping[str, Any], step: int) -> bool | None:
        """Look at the monitored metric; True the first time it reaches the target, None when it
        has not been logged (yet), False otherwise."""
        if self.reached or self.started_s is None:
            return False
        observed = metrics.get(self.target.metric)
        if observed is None:
            return None
        self.value = float(observed)  # a tensor on the GPU: one sync, on a log step or after validation
        if not self.target.reached(self.value):
            return False
        self.seconds, self.step = self.elapsed_s(), step
        return True

    def section(self) -> dict[str, Any]:
        """The summary's ``time_to_target``; until reached, ``seconds`` is the run time so far."""
        seconds = self.seconds if self.reached else (self.elapsed_s() if self.started_s is not None else None)
        return {"status": REACHED if self.reached else NOT_REACHED, "seconds": seconds, "step": self.step,
                "metric": self.target.metric, "value": self.value, "target": self.target.value,
                "mode": self.target.mode}


class MLPerfLog:
    """``:::MLLOG`` lines through mlperf-logging's ``mllog``, to stdout and ``<output_dir>/mlperf.log``."""

    def __init__(self, output_dir: str, run_id: str) -> None:
        try:
            from mlperf_logging import mllog
        except ImportError as error:
            raise ImportError("mllog: true needs mlperf-logging: pip install 'nemo-throughput[mlperf]' "
                              "(or pip install mlperf-logging)") from error
        self.constants = mllog.constants
        self.path = os.path.join(output_dir, MLLOG_FILE)
        # A logger of this run's own, so that two runs in one process never write into each other's file.
        self._logger = logging.getLogger(f"mlperf_logging.nemo_throughput.{run_id}")
        self._logger.propagate = False
        self._logger.setLevel(logging.INFO)
        self._handlers = [logging.StreamHandler(sys.stdout), logging.FileHandler(self.path)]
        for handler in self._handlers:
            self._logger.addHandler(handler)
        self._mllogger = mllog.mllog.MLLogger(logger=self._logger, default_stack_offset=2)

    def run_start(self, global_batch_size: int, time_ms: int) -> None:
        self._mllogger.event(self.constants.GLOBAL_BATCH_SIZE, global_batch_size, time_ms=time_ms)
        self._mllogger.start(self.constants.RUN_START, time_ms=time_ms)

    def evaluation(self, value: float, step: int, samples: int) -> None:
        self._mllogger.event(self.constants.EVAL_ACCURACY, value,
                             metadata={"step_num": step, self.constants.SAMPLES_COUNT: samples})

    def run_stop(self, success: bool, time_ms: int, step: int) -> None:
        status = self.constants.SUCCESS if success else self.constants.ABORTED
        self._mllogger.end(self.constants.RUN_STOP, time_ms=time_ms,
                           metadata={self.constants.STATUS: status, "step_num": step})

    def close(self) -> None:
        for handler in self._handlers:
            self._logger.removeHandler(handler)
            handler.close()


class RunClock:
    """A run's time to target on one rank: the clock from set-up, the checks at the same points on
    every rank (log steps, after validation), and on rank 0 with ``mllog`` its ``:::MLLOG`` lines."""

    def __init__(self, target: dict[str, Any], rank: int, mllog: bool, output_dir: str, run_id: str,
                 global_batch_size: int) -> None:
        self.clock = TimeToTarget(Target(**target))
        self._rank, self._global_batch_size = rank, global_batch_size
        self._mllog = MLPerfLog(output_dir, run_id) if mllog and rank == 0 else None
        self._said_missing = False  # the metric absent after a validation: said once

    def start(self) -> None:
        """MLPerf's run_start: after set-up, before any data is touched."""
        self.clock.start()
        if self._mllog is not None:
            self._mllog.run_start(self._global_batch_size, self.clock.started_wall_ms)

    def check(self, metrics: Callable[[], Mapping[str, Any]] | None, step: int, after_validation: bool) -> bool | None:
        """Has the monitored metric (``metrics`` reads them; None: none logged) reached the target?
        Returns this rank's vote to stop where the target says ``stop``, else None (every rank checks
        at the same points, so that a stop decided across ranks pairs its collective)."""
        clock = self.clock
        logged = metrics() if metrics is not None else {}
        first = clock.check(logged, step)
        if first is None and after_validation and logged and not self._said_missing:
            self._said_missing = True
            self._say_missing(f"is not among the metrics logged after validation at step {step}", logged)
        if self._mllog is not None and after_validation and first is not None:
            self._mllog.evaluation(clock.value, step, samples=step * self._global_batch_size)
        if first:
            self._reached(step)
        return clock.reached if clock.target.stop else None

    def _reached(self, step: int) -> None:
        clock = self.clock
        if self._rank == 0:
            log.info("nemo-throughput: %s = %.6g reached the target %s %g at step %d, %.3f s after run start",
                     printable(clock.target.metric), clock.value, "<=" if clock.target.mode == "min" else ">=",
                     clock.target.value, step, clock.seconds)
        if self._mllog is not None:
            self._mllog.run_stop(True, clock.started_wall_ms + round(clock.seconds * 1000), step)
            self._close_mllog()

    def _say_missing(self, what: str, logged: Mapping[str, Any]) -> None:
        """A target whose metric is never logged is never reached (a typo in its name, say): rank 0 says so."""
        if self._rank != 0:
            return
        names = sorted(map(str, logged))
        listed = ", ".join(printable(name) for name in names[:20]) + (" ..." if len(names) > 20 else "")
        log.warning("nemo-throughput: the target's metric %s %s (%s): is its name right? Until it is logged the "
                    "target is not reached%s.", printable(self.clock.target.metric), what, listed or "none",
                    " and training does not stop for it" if self.clock.target.stop else "")

    def stop(self, step: int) -> None:
        """The run ends without the target reached: MLPerf's run_stop, aborted. A metric never logged
        in the whole run is said once more."""
        if self.clock.value is None and self._rank == 0:
            log.warning("nemo-throughput: the target's metric %s was never logged in this run: time_to_target is "
                        "not reached, with no value", printable(self.clock.target.metric))
        if self._mllog is not None:
            self._mllog.run_stop(False, self.clock.started_wall_ms + round(self.clock.elapsed_s() * 1000), step)
            self._close_mllog()

    def _close_mllog(self) -> None:
        self._mllog.close()
        self._mllog = None
