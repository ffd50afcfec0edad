"""The steps' way from this rank's timer to the reporting thread, across ranks.

At each log step the steps up to the previous one (their marks at least a step old) and this rank's
vector go into an all-gather, and the one started at the previous log step, finished by now, is
handed to the reporting thread. At the end of the run every step not yet absorbed goes over the
final exchange, which waits for the other ranks at most its timeout.
"""

from __future__ import annotations

from collections.abc import Callable

from nemo_throughput.aggregation import Exchange, FinalSteps, Gathered
from nemo_throughput.explain.run import RunExplanation
from nemo_throughput.run.reporting import Reporter
from nemo_throughput.run_facts import RunFacts
from nemo_throughput.text import package_logger
from nemo_throughput.timing import StepTimer

log = package_logger(__name__)


class Intervals:
    """One fit's exchanges; ``goodput_pct``: rank 0's goodput % as of now (NaN elsewhere), in the vector."""

    def __init__(self, exchange: Exchange, timer: StepTimer, reporter: Reporter, explain: RunExplanation,
                 goodput_pct: Callable[[], float]) -> None:
        self._exchange, self._timer, self._reporter, self._explain = exchange, timer, reporter, explain
        self._goodput_pct = goodput_pct
        self._in_flight: Gathered | None = None  # the all-gather started at the last log step

    def log_step(self, step: int, facts: RunFacts) -> None:
        """Log step ``step``: start its all-gather, hand the previous one on (waiting for it here; it is
        split on the reporting thread), and give the loggers what the reporting thread has for them."""
        steps, extras = self._timer.collect(step - 1), self._sample(step)
        finished, self._in_flight = self._in_flight, self._exchange.start(steps, extras)
        if finished is not None:
            self._reporter.submit(finished.received(), facts)
        self._reporter.log_pending()

    def flush(self, last_step: int, facts: RunFacts, wait_for_device: bool, interrupted: bool = False) -> FinalSteps:
        """Exchange and absorb every step not yet absorbed, the interval in flight included,
        waiting for the other ranks at most the final-exchange timeout."""
        # The in-flight all-gather (default group) is not read: a peer may be gone, and its steps go
        # again over the final exchange. At the end of a completed run every rank started it, so
        # it is let end (boundedly): a gloo work left pending aborts the process at exit.
        if self._in_flight is not None and wait_for_device:
            self._in_flight.settle(self._exchange.final_timeout_s)
        self._in_flight = None
        if wait_for_device:  # else the device may be stuck: leave an open profile window as it is
            self._explain.close()
        pending = self._timer.collect(wait=wait_for_device)
        final = self._exchange.finish(pending, self._reporter.absorbed_through, interrupted,
                                      self._sample(last_step, final=wait_for_device))
        if final.extras is not None:
            self._reporter.absorb_extras(final.extras)
        for interval in final.intervals():
            self._reporter.absorb(interval, None, facts)
        self._reporter.log_pending()
        if final.missing is not None:
            log.warning("nemo-throughput: the summary lacks %s.", final.missing)
        return final

    def _sample(self, step: int, final: bool = False) -> list[float]:
        """This rank's vector for the all-gather (explain.run's layout), rank 0's goodput % in it."""
        return self._explain.sample(step, self._goodput_pct(), final)
