"""A measured run, framework-free: what every adapter drives through plain event methods.

An adapter calls :meth:`Measurement.set_up` once with its way of reading the run's facts (the set-up
sequence is :func:`~nemo_throughput.run.startup.start_run`), then the methods at its framework's
events: ``train_start``, ``step_start``, ``before_backward``, ``before_optimizer``, ``step_end``,
``validation_start``/``validation_end``, ``checkpoint_saving``/``checkpoint_saved``, ``train_end``,
``exception``. The measurement owns the hot path and the run's life cycle; each other concern has
its room: the batches (batches.BatchCounting), a measured FLOPs count
(measured_flops.FirstStepFlops), the time to target (target.RunClock), the explanation and the
log step's vector (explain.run), goodput (goodput.RunGoodput), the steps' exchange across ranks
(run.intervals), the intervals' reporting (run.reporting) and where the summary goes (run.publishing).

Hot path (every step): one clock mark per event, nothing read. Log step (every
``log_every_n_steps``): the finished steps go to the reporting thread over an all-gather
(run.intervals), with the run's facts as of now (a frozen snapshot). The end of the run drains
that thread before its final exchange.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch

from nemo_throughput import distributed
from nemo_throughput.aggregation import Exchange, FinalSteps
from nemo_throughput.batches import BatchCounting, Count
from nemo_throughput.config import ThroughputConfig, check_at_train_start
from nemo_throughput.explain.run import RunExplanation
from nemo_throughput.flops import MEASURED
from nemo_throughput.goodput.ledger import CHECKPOINT, DATA, STEP, VALIDATION, Ledger
from nemo_throughput.goodput.run import RunGoodput
from nemo_throughput.measured_flops import FirstStepFlops
from nemo_throughput.run.intervals import Intervals
from nemo_throughput.run.publishing import Publisher
from nemo_throughput.run.reporting import Loggers, Reporter
from nemo_throughput.run.stall import stall_watch
from nemo_throughput.run.startup import DescribeRun, start_run
from nemo_throughput.run_facts import Learned, RunFacts
from nemo_throughput.run_stats import RunStats
from nemo_throughput.target import RunClock
from nemo_throughput.text import package_logger
from nemo_throughput.timing import BACKWARD, LOGGED, OPTIMIZER, START, StepTimer, clock_for

log = package_logger(__name__)

NO_BATCH = object()  # step_start's batch where the framework hands its hooks none (Megatron-Bridge)


class Measurement:
    """One run's measurement; every method is a framework event, called on every rank.

    Steps are optimizer steps, numbered as the framework counts them: ``steps_done`` is how many
    were finished when an event fires (Lightning's ``global_step``, Bridge's ``train_state.step``),
    so the step that ends is ``steps_done + 1`` at its start and ``steps_done`` after it.

    Which attributes exist when: ``config`` always; after ``set_up``, the facts (frozen),
    ``learned``, the publisher, the explanation, the exchange, the batches, the run clock (a target
    set) and goodput (rank 0); after ``train_start``, the timer, the statistics, the reporter and the
    intervals' exchange."""

    def __init__(self, config: ThroughputConfig) -> None:
        self.config = config
        self.learned = Learned()
        self.rank = 0
        self._facts: RunFacts | None = None  # the set-up's; self.facts adds what was learned since
        self._device: torch.device | None = None
        self.publisher: Publisher | None = None
        self._explain: RunExplanation | None = None
        self._exchange: Exchange | None = None
        self._batches: BatchCounting | None = None
        self._goodput: RunGoodput | None = None  # rank 0
        self._ledger: Ledger | None = None  # rank 0: this segment's goodput ledger, on the hot path
        self.run_clock: RunClock | None = None  # a target set: its clock (run_clock.clock) and MLPerf log
        self._loggers: Loggers | None = None
        self._log_rank = 0  # the rank whose loggers get the metrics (the framework's: Lightning's 0)
        self._timer: StepTimer | None = None
        self.stats: RunStats | None = None
        self._reporter: Reporter | None = None
        self._flops: FirstStepFlops | None = None  # flops_formula measured, until the counted step ends
        self._profiling = False  # a profile window is set: the explanation sees every step's start and end
        self._intervals: Intervals | None = None  # the steps' way to the reporting thread, from train_start
        self._last_step = 0

    @property
    def is_set_up(self) -> bool:
        return self._facts is not None

    @property
    def facts(self) -> RunFacts | None:
        """The run's facts as of now: the set-up's, with what the run has learned since."""
        return self.learned.facts(self._facts) if self._facts is not None else None

    # ----------------------------------------------------------------------- set-up
    def set_up(self, describe: DescribeRun, device: torch.device, rank: int, default_dir: str,
               loggers: Loggers | None = None, log_rank: int = 0) -> RunFacts:
        """The set-up every stack makes once (run.startup.start_run): ``describe`` works out the run's
        facts from every rank's record; ``default_dir`` is the adapter's output directory, used when no
        output_dir setting or variable is set; ``loggers`` (run.reporting.Loggers), called on ``log_rank``
        (where the framework's loggers live), get each interval. Starts the run clock; returns the facts."""
        started = start_run(self.config, describe, rank, default_dir)
        self.rank, self._device, self._loggers, self._log_rank = rank, device, loggers, log_rank
        self._facts = facts = started.facts
        self.publisher = Publisher(rank, started.output_dir)
        if rank == 0:
            try:
                self._goodput = RunGoodput(started.requested_dir, started.output_dir)
                self._ledger = self._goodput.ledger
            except (OSError, ValueError) as error:  # a file system without shared memory maps: no goodput
                log.warning("nemo-throughput: no goodput ledger for this run (%s: %s); the rest is measured",
                            type(error).__name__, error)
        self._explain = RunExplanation(self.config, device, rank, facts.places, started.output_dir,
                                       started.rank_records, distributed.backend())
        self._profiling = self._explain.window is not None
        self._exchange = Exchange(extras_width=self._explain.width)
        self._batches = BatchCounting(facts, self.learned, rank)
        if self.config.target is not None:
            self.run_clock = RunClock(self.config.target, rank, self.config.mllog, started.output_dir,
                                      facts.run_id, facts.global_batch_size)
            self.run_clock.start()
        if rank == 0 and started.prometheus is not None:
            self.publisher.serve(started.prometheus, facts)
        return facts

    def train_start(self, steps_done: int, world_size: int, max_steps: int | None = None) -> None:
        """``max_steps``: the step training ends at (None: unknown or unlimited)."""
        if self._facts is None:
            return
        said = check_at_train_start(self.config, steps_done, max_steps, world_size, self._facts.batch_ramp)
        for warning in said if self.rank == 0 else []:
            log.warning(warning)
        self._last_step = steps_done
        self.stats = RunStats(world_size, self.config.warmup_steps, start_step=steps_done,
                              excluded=self.config.profile_steps, ramp_steps=self._facts.ramp_steps)
        self._timer = StepTimer(clock_for(self._device))
        self.publisher.open()
        if self._facts.flops_formula == MEASURED and self.learned.flops_per_sample is None:
            self._flops = FirstStepFlops(steps_done)
        if self._goodput is not None:
            self._goodput.start(steps_done, self._facts.run_id)
        if self._reporter is not None:  # a fit after a fit
            self._reporter.close()
        self._reporter = Reporter(self.stats, self._explain, self.publisher, self.run_clock, self._goodput,
                                  self._loggers, self._log_rank,
                                  stall_watch(self.config, self.rank, self.publisher.output_dir,
                                              lambda: self._last_step, self.stats.median_step_time_s))
        self._intervals = Intervals(self._exchange, self._timer, self._reporter, self._explain, self._goodput_pct)
        self._reporter.publish_running(self.facts)
        self._timer.anchor()

    def watch_sigterm(self) -> None:
        """Install the SIGTERM watch (once): call it after the framework installed its own handler."""
        if self._timer is not None:
            self.publisher.watch_sigterm()

    # ----------------------------------------------------------------------- hot path
    def count_accumulated(self, slots: Count, seqlen_sq: Count, source: str) -> None:
        """A framework's own counts of the step in progress (batches.BatchCounting.add_counts)."""
        if self._timer is not None:
            self._batches.add_counts(slots, seqlen_sq, source)

    def not_counted(self, why: str) -> None:
        """The run's batches are packed or padded, but cannot be counted: ``why``, in words."""
        self._batches.not_counted(why)

    def step_start(self, batch: Any = NO_BATCH, first: bool = False) -> None:
        """A micro-batch (or the whole step, where the framework has no finer event) of the step after
        the last one ended starts. ``batch``, where the framework hands one over, is checked, and
        counted where packed or padded (``first``: the fit's first, batches.BatchCounting.seen)."""
        if self._timer is None:
            return
        self._timer.mark(START)
        if self._ledger is not None:
            self._ledger.step_starts()
        if batch is not NO_BATCH:
            if first:
                self._batches.seen(batch)
            self._batches.add_batch(batch)
        if self._flops is not None:
            self._flops.step_start(self._last_step)
        if self._profiling:
            self._explain.step_start(self._last_step + 1)

    def before_backward(self) -> None:
        if self._timer is not None:
            self._timer.mark(BACKWARD)
            if self._flops is not None:
                self._flops.backward_starts()

    def before_optimizer(self) -> None:
        if self._timer is not None:
            self._timer.mark(OPTIMIZER)

    def step_end(self, step: int, metrics: Callable[[], Mapping[str, Any]] | None = None,
                 skipped: bool = False) -> bool | None:
        """Optimizer step ``step`` (1-based: steps done after it) ended; a repeated ``step`` is a
        gradient-accumulation micro-batch and ignored. ``metrics`` reads the monitored values
        (only called on log steps with a target). ``skipped``: the framework skipped the update
        (Bridge's ``skipped_iter``, e.g. an inf/NaN gradient): the step is timed and exchanged like
        any other, left out of the statistics and counted; every rank skips the same iterations
        (the decision is reduced across ranks). Returns None, or, where a target with ``stop: true``
        was checked, this rank's vote to stop (the adapter reduces it across ranks)."""
        if self._timer is None:
            return None
        if self._ledger is not None:
            self._ledger.switch(DATA, step)
        if step == self._last_step:
            return None
        self._last_step = step
        if skipped:
            self.stats.skip(step)
        self._timer.end_step(step, self._batches.step_done())
        if self._flops is not None and self._flops.step_end(step, self._facts, self.learned, self.rank):
            self._flops = None
        if self._profiling and self._explain.step_end(step):
            self._timer.anchor()  # stopping the profiler (and reading its trace) is no step's time
        if step % self.config.log_every_n_steps != 0:
            return None
        vote = self.run_clock.check(metrics, step, after_validation=False) if self.run_clock is not None else None
        self._intervals.log_step(step, self.facts)
        # Our log step's work and the trackers' calls: the next step's logging phase, not its data
        # wait; goodput's step time, not data.
        self._timer.mark(LOGGED)
        if self._ledger is not None:
            self._ledger.charge(STEP)
        return vote

    def validation_start(self) -> None:
        """A validation inside training starts (its time goes to the goodput ledger's validation)."""
        if self._timer is not None and self._ledger is not None:
            self._ledger.switch(VALIDATION)

    def checkpoint_saving(self, steps_done: int) -> None:
        """A checkpoint of ``steps_done`` steps is being saved (Lightning's ``on_save_checkpoint``): the
        time until the next event is the save's."""
        if self._timer is not None and self._ledger is not None:
            self._ledger.switch(CHECKPOINT)
            self._ledger.checkpoint(steps_done)

    def checkpoint_state(self) -> dict[str, Any]:
        """The callback's state in a checkpoint: which run and segment saved it (goodput's, rank 0; else empty)."""
        return self._goodput.checkpoint_state() if self._goodput is not None else {}

    def checkpoint_loaded(self, state: Mapping[str, Any]) -> None:
        """The resumed checkpoint's state (checkpoint_state's), before train_start: goodput continues its run."""
        if self._goodput is not None:
            self._goodput.checkpoint_loaded(state)

    def checkpoint_saved(self, steps_done: int) -> None:
        """A checkpoint of ``steps_done`` steps was saved (Megatron-Bridge's ``on_checkpoint_save``): the
        time since the last event was the save's."""
        if self._timer is not None and self._ledger is not None:
            self._ledger.charge(CHECKPOINT)
            self._ledger.checkpoint(steps_done)

    def validation_end(self, steps_done: int, metrics: Callable[[], Mapping[str, Any]] | None = None) -> bool | None:
        """A validation inside training ended: its time is no step's. Returns a stop vote as step_end does."""
        if self._timer is None:
            return None
        if self._ledger is not None:
            self._ledger.switch(DATA)
        vote = self.run_clock.check(metrics, steps_done, after_validation=True) if self.run_clock is not None else None
        self._timer.anchor()  # validation time is not part of the next training step
        return vote

    # ----------------------------------------------------------------------- end of run
    def train_end(self, steps_done: int) -> None:
        if self._timer is None:
            return
        self._stop(steps_done)
        self._reporter.drain(raise_error=True)
        self._finish("completed", None, self._flush(wait_for_device=True).missing)

    def exception(self, steps_done: int, exception: BaseException) -> None:
        """The run failed or was stopped (KeyboardInterrupt, SystemExit or SIGTERM: interrupted)."""
        if self._timer is None or self.publisher.done:
            return
        self._stop(steps_done)
        status, error = ended_by(exception, self.publisher.sigterm_received)
        interrupted = status == "interrupted"
        # Never raise from here: the run's own error must not be replaced with ours.
        self._reporter.drain(raise_error=False)
        several_ranks = self._exchange.world_size > 1
        if several_ranks:
            # What this rank knows goes to disk before any collective: another rank may be gone,
            # and SIGKILL follows SIGTERM within seconds.
            self.publisher.interim(self._reporter.summary(self.facts, status, error),
                                   f"steps after {self._reporter.absorbed_through}: written before the final "
                                   "exchange across ranks")
        # Several ranks: the device may be stuck behind a collective; read only finished steps.
        final = self._flush(wait_for_device=not several_ranks, interrupted=interrupted)
        others = [rank for rank in final.interrupted_ranks if rank != self.rank]
        if not others and not interrupted and final.missing is not None:
            # gone before the final exchange could hear them
            others = self.publisher.ranks_interrupted_on_disk(self._exchange.world_size)
        if others and not interrupted:  # this rank failed because another one was stopped
            status, error = "interrupted", f"{error} (after {ranks_text(others)} had been interrupted)"
        self._finish(status, error, final.missing)

    def _stop(self, steps_done: int) -> None:
        """Training ends: the stall watch stops, an unfinished FLOPs count is dropped, and the run clock stops."""
        self._reporter.stop_stall_watch()
        if self._flops is not None:
            self._flops.abandon()
            self._flops = None
        if self.run_clock is not None:
            self.run_clock.stop(steps_done)

    def _flush(self, wait_for_device: bool, interrupted: bool = False) -> FinalSteps:
        return self._intervals.flush(self._last_step, self.facts, wait_for_device, interrupted)

    def _goodput_pct(self) -> float:
        return self._goodput.goodput_pct if self._goodput is not None else math.nan

    def _finish(self, status: str, error: str | None, missing: str | None) -> None:
        if self._ledger is not None:
            self._ledger.charge(STEP)  # the segment's last event, its end; since the last step: ours, as above
        try:
            self.publisher.final(self._reporter.summary(self.facts, status, error, final=True), missing)
        finally:  # the summary written or not (a full disk), nothing of the run's is left running
            self._reporter.close()  # drained before the final exchange: its thread ends now
            if self._ledger is not None:
                self._ledger.close()
                self._goodput = self._ledger = None


class MeasurementView:
    """What an adapter's callers read back (after a run, in tests): its measurement's."""

    measurement: Measurement

    @property
    def config(self) -> ThroughputConfig:
        return self.measurement.config

    @property
    def facts(self) -> RunFacts | None:
        return self.measurement.facts

    @property
    def stats(self) -> RunStats | None:
        return self.measurement.stats

    @property
    def output_dir(self) -> str | None:
        return self.measurement.publisher.output_dir if self.measurement.publisher else None

    @property
    def summary_path(self) -> str | None:
        return self.measurement.publisher.summary_path if self.measurement.publisher else None

    @property
    def rank_summary_path(self) -> str | None:
        return self.measurement.publisher.rank_summary_path if self.measurement.publisher else None


def ended_by(exception: BaseException, sigterm: bool) -> tuple[str, str]:
    """The status and error of a run that raised ``exception``: KeyboardInterrupt, SystemExit or
    SIGTERM (``sigterm``: received) interrupted it; anything else failed it."""
    interrupted = sigterm or isinstance(exception, (KeyboardInterrupt, SystemExit))
    error = f"{type(exception).__name__}: {exception}"
    if sigterm and not isinstance(exception, SystemExit):  # Lightning's SIGTERMException is one
        error += " (after SIGTERM)"
    return "interrupted" if interrupted else "failed", error


def ranks_text(ranks: list[int], shown: int = 8) -> str:
    listed = ", ".join(map(str, ranks[:shown])) + (f" and {len(ranks) - shown} more" if len(ranks) > shown else "")
    return f"rank{'s' if len(ranks) > 1 else ''} {listed}"
