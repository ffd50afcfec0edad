"""What every trial carries besides the tool it measures: a synchronized clock over the window,
timers (and synchronization counters) around the tool's hooks, and a logger collecting what the
tool reported. Lightning is passed in (its base classes), never imported here."""

from __future__ import annotations

import time
from typing import Any

from nemo_throughput.bench.syncs import SyncCounter
from nemo_throughput.timing import BACKWARD, OPTIMIZER, START, StepTimer, clock_for


class WindowClock:
    """Harness: synchronized wall clock at the end of the window's first and last step."""

    def __init__(self, first: int, last: int, cuda: bool) -> None:
        self.first, self.last, self.cuda = first, last, cuda
        self.times: dict[int, float] = {}

    def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
        step = trainer.global_step
        if step in (self.first, self.last) and step not in self.times:
            if self.cuda:
                import torch

                torch.cuda.synchronize()
            self.times[step] = time.perf_counter()

    @property
    def step_time_s(self) -> float:
        return (self.times[self.last] - self.times[self.first]) / (self.last - self.first)


class StepSyncs:
    """Harness (counting round): synchronizations in each whole step, from the first callback's
    on_train_batch_start to the last callback's on_train_batch_end (``opener`` and ``closer``)."""

    def __init__(self) -> None:
        self.by_step: dict[int, int] = {}
        self._counter: SyncCounter | None = None

    def open(self, trainer: Any, *args: Any) -> None:
        self._counter = SyncCounter("warn").__enter__()

    def close(self, trainer: Any, *args: Any) -> None:
        if self._counter is not None:
            self._counter.__exit__(None, None, None)
            self.by_step[trainer.global_step] = self._counter.count
            self._counter = None

    def callbacks(self, base: type) -> tuple[Any, Any]:
        opener = type("StepSyncsOpen", (base,), {"on_train_batch_start": lambda _, *a: self.open(*a)})()
        closer = type("StepSyncsClose", (base,), {"on_train_batch_end": lambda _, *a: self.close(*a)})()
        return opener, closer


class EmptyHooks:
    """The four per-step hooks, doing nothing (the bench's empty-callback, mixed into the trial's
    Lightning Callback): their host time, timed as any tool's, is the floor under every tool's. A
    hook called between the model's kernels runs with caches and branch predictors cold, so even
    an empty one costs microseconds; a tool's own cost is what it takes above that."""

    def on_train_batch_start(self, *args: Any) -> None:
        pass

    def on_before_backward(self, *args: Any) -> None:
        pass

    def on_before_optimizer_step(self, *args: Any) -> None:
        pass

    def on_train_batch_end(self, *args: Any) -> None:
        pass


class StepTimerOnly:
    """Our step timer alone in the four hooks (timing.StepTimer on the run's clock), its steps collected
    every ``log_every`` steps as a log step collects them (the bench's step-timer-only): the timing's own
    cost, apart from the rest of an ordinary step's work (the goodput ledger, the batch checks, the
    step's number, the calls between the hooks and the timer)."""

    def __init__(self, log_every: int) -> None:
        self.log_every = log_every
        self._timer: StepTimer | None = None
        self._steps = 0

    def on_train_start(self, trainer: Any, *args: Any) -> None:
        self._timer = StepTimer(clock_for(trainer.strategy.root_device))
        self._timer.anchor()

    def on_train_batch_start(self, *args: Any) -> None:
        self._timer.mark(START)

    def on_before_backward(self, *args: Any) -> None:
        self._timer.mark(BACKWARD)

    def on_before_optimizer_step(self, *args: Any) -> None:
        self._timer.mark(OPTIMIZER)

    def on_train_batch_end(self, *args: Any) -> None:
        self._steps += 1
        self._timer.end_step(self._steps)
        if self._steps % self.log_every == 0:
            self._timer.collect(self._steps - 1)  # as a log step: the steps before this one


class TimedHooks:
    """Wraps a callback's per-step hooks (those its class defines): host time per step and, when
    ``count_syncs``, the synchronizations they cause (:class:`SyncCounter`). ``idle_device``: the
    device is synchronized before each hook, outside its time (a diagnostic: with the GPU idle, no
    wait behind queued work is timed, only the hook's own host work)."""

    HOOKS = ("on_train_batch_start", "on_before_backward", "on_before_optimizer_step", "on_train_batch_end")

    def __init__(self, callback: Any, base: type, count_syncs: bool, idle_device: bool = False) -> None:
        self.callback, self.count_syncs = callback, count_syncs
        self._before = _synchronize if idle_device else None
        self.ns_by_step: dict[int, int] = {}
        self.syncs_by_step: dict[int, int] = {}
        for name in self.HOOKS:
            if getattr(type(callback), name) is not getattr(base, name):
                setattr(callback, name, self._timed(getattr(callback, name)))

    def _timed(self, hook: Any) -> Any:
        ends_step = hook.__name__ == "on_train_batch_end"  # runs after the optimizer step's increment

        def timed(trainer: Any, *args: Any, **kwargs: Any) -> None:
            step = trainer.global_step + (0 if ends_step else 1)  # the step this call belongs to
            if self._before is not None:
                self._before()
            syncs = 0
            if self.count_syncs:
                with SyncCounter("warn") as counter:
                    elapsed = _elapsed_ns(hook, trainer, *args, **kwargs)
                syncs = counter.count
            else:
                elapsed = _elapsed_ns(hook, trainer, *args, **kwargs)
            self.ns_by_step[step] = self.ns_by_step.get(step, 0) + elapsed
            self.syncs_by_step[step] = self.syncs_by_step.get(step, 0) + syncs

        timed.__name__ = hook.__name__
        return timed


def _synchronize() -> None:
    import torch

    torch.cuda.synchronize()


def _elapsed_ns(hook: Any, *args: Any, **kwargs: Any) -> int:
    start = time.perf_counter_ns()
    hook(*args, **kwargs)
    return time.perf_counter_ns() - start


class MeasuredValues:
    """Metrics the tools logged, by name and step (steps from 1, as the callback counts them)."""

    def __init__(self) -> None:
        self.values: dict[str, dict[int, float]] = {}

    def add(self, metrics: dict[str, float], step: int) -> None:
        for key, value in metrics.items():
            self.values.setdefault(key, {})[step + 1] = float(value)

    def last(self, key: str) -> float:
        series = self.values[key]
        return series[max(series)]

    def at(self, key: str, steps: range) -> list[float]:
        return [self.values[key][s] for s in steps]


def collector(pl: Any, measured: MeasuredValues) -> Any:
    class Collector(pl.loggers.logger.Logger):
        name, version = "bench", 0

        def log_hyperparams(self, *args: Any, **kwargs: Any) -> None:
            pass

        def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
            measured.add(metrics, step or 0)

    return Collector()
