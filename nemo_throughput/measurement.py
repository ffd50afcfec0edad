"""A measured run, framework-free: what every adapter drives through plain event methods.

An adapter (Lightning, Megatron-Bridge) resolves the run's facts with
:func:`~nemo_throughput.run_facts.resolve_run_facts`, then calls :class:`Measurement`'s methods at
its framework's events: ``set_up``, ``train_start``, ``step_start``, ``before_backward``,
``before_optimizer``, ``step_end``, ``validation_end``, ``train_end``, ``exception``. The
measurement owns the step timer, the cross-rank exchange and its in-flight all-gather, the run
statistics, the explanation sections, measured FLOPs, the time to target, the summary file, and the
end of the run (SIGTERM, final exchange, rank files).

Hot path (every step): one clock mark per event, nothing read. Log step (every
``log_every_n_steps``): collect the previous steps, sample this rank's telemetry, start their
all-gather, take the one started on the last log step, and hand it to the reporting thread
(:class:`~nemo_throughput.background.OrderedWorker`), which folds it into the statistics, logs it,
appends steps.jsonl, rebuilds the running summary and updates rank 0's Prometheus endpoint (where
asked for); the loggers get its metrics at the next log step, on the training thread of the rank
where the framework keeps them (Lightning's rank 0, Megatron-Bridge's last). The end of the run
drains that thread before its final exchange.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import threading
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import torch
import torch.distributed as dist

from nemo_throughput import environment
from nemo_throughput.aggregation import Exchange, FinalSteps, Gathered, RunStats
from nemo_throughput.background import OrderedWorker
from nemo_throughput.batches import PACKED, PADDED, Count, TokenCounter
from nemo_throughput.config import ThroughputConfig, check_profile_window
from nemo_throughput.explain.run import RunExplanation
from nemo_throughput.flops import FORMULAS, MEASURED, flops_terms
from nemo_throughput.goodput import CHECKPOINT, DATA, STEP, VALIDATION, Ledger, RunGoodput
from nemo_throughput.measured_flops import StepFlopCounter, flops_per_sample
from nemo_throughput.progress import format_interval, logger_metrics, step_rows
from nemo_throughput.prometheus import PrometheusEndpoint, job_id, prometheus_setting
from nemo_throughput.run_facts import claim_output_dir_on_rank_zero, mfu_above_peak_warning
from nemo_throughput.signals import SigtermWatch
from nemo_throughput.summary import (
    STEPS_FILE,
    RunFacts,
    SummaryFile,
    append_jsonl,
    build_summary,
    write_json_atomic,
)
from nemo_throughput.target import MLPerfLog, Target, TimeToTarget
from nemo_throughput.text import printable
from nemo_throughput.throughput import CountedStep, Workload
from nemo_throughput.timing import BACKWARD, BATCH_COUNTS, OPTIMIZER, START, StepTimer, clock_for

log = logging.getLogger(__name__)

# Logs one interval's metrics (the adapter's loggers): (metrics, last step of the interval).
MetricsSink = Callable[[dict[str, float], int], None]


class Measurement:
    """One run's measurement; every method is a framework event, called on every rank.

    Steps are optimizer steps, numbered as the framework counts them: ``steps_done`` is how many
    were finished when an event fires (Lightning's ``global_step``, Bridge's ``train_state.step``),
    so the step that ends is ``steps_done + 1`` at its start and ``steps_done`` after it.
    """

    def __init__(self, config: ThroughputConfig) -> None:
        self.config = config
        self.facts: RunFacts | None = None
        self.stats: RunStats | None = None
        self.output_dir: str | None = None
        self.rank = 0
        self._device: torch.device | None = None
        self._log_metrics: MetricsSink | None = None
        self._log_rank = 0  # the rank whose loggers get the metrics (the framework's: Lightning's 0)
        self._endpoint: PrometheusEndpoint | None = None  # rank 0, where asked for
        # The run's goodput % so far: rank 0's (its ledger), sent with each log step's all-gather (NaN:
        # none yet), and as every rank last received it (for the loggers, which may live on another rank).
        self._goodput_pct, self._received_goodput_pct = math.nan, math.nan
        self._summary_file: SummaryFile | None = None
        self._timer: StepTimer | None = None
        self._exchange: Exchange | None = None
        self._explain: RunExplanation | None = None
        self._in_flight: Gathered | None = None
        self._reporter: OrderedWorker | None = None  # made at train start (a callback may be pickled before)
        self._to_log: deque[tuple[dict[str, float], int]] = deque()  # the reporter's, for the loggers
        self._flop_counter: StepFlopCounter | None = None  # flops_formula measured, until the first step ends
        self._token_counter: TokenCounter | None = None  # packed or padded batches: counted
        self._goodput: RunGoodput | None = None  # rank 0
        self._ledger: Ledger | None = None  # rank 0: this segment's goodput ledger (the goodput's), on the hot path
        self.time_to_target: TimeToTarget | None = None  # target set: the run clock
        self._mllog: MLPerfLog | None = None  # mllog on, rank 0
        self._last_step = 0
        self._done = False
        self._warned_above_peak = False  # MFU above 100 %: warned once per run
        # End of run: SIGTERM watch, the last consistent summary, and a lock (made when the watch
        # is installed: a callback may be pickled before, as by ddp_spawn) between the two writers.
        self._sigterm: SigtermWatch | None = None
        self._snapshot: tuple[int, dict[str, Any]] | None = None
        self._write_lock: threading.Lock | None = None

    @property
    def is_set_up(self) -> bool:
        return self.facts is not None

    @property
    def is_training(self) -> bool:
        return self._timer is not None

    @property
    def summary_path(self) -> str | None:
        return os.path.join(self.output_dir, "summary.json") if self.output_dir else None

    @property
    def rank_summary_path(self) -> str | None:
        """Where a rank other than 0 leaves what it knew when rank 0 may lack some of it."""
        return self._rank_file(self.rank) if self.output_dir else None

    def _rank_file(self, rank: int) -> str:
        return os.path.join(self.output_dir, f"summary.rank{rank}.json")

    # ----------------------------------------------------------------------- set-up
    def set_up(self, facts: RunFacts, device: torch.device, rank: int, records: list[dict[str, Any]],
               requested_dir: str, log_metrics: MetricsSink | None = None, log_rank: int = 0) -> None:
        """Claim the output directory (every rank learns the outcome) and start the run clock.
        ``requested_dir`` is the adapter's default, used when no output_dir setting or variable is set;
        ``log_metrics``, called on ``log_rank`` (where the framework's loggers live), logs each interval."""
        self.rank, self._device, self._log_metrics, self._log_rank = rank, device, log_metrics, log_rank
        # On every rank, before the first collective: a wrong value stops them all, none waits for rank 0.
        prometheus = prometheus_setting(self.config.prometheus, os.environ)
        requested = self.config.output_dir or os.environ.get(environment.ENV_OUTPUT_DIR) or requested_dir
        # Checked now, not when the summary is first written at the end of hours of training.
        self.output_dir, facts.run_id = claim_output_dir_on_rank_zero(rank, requested, facts)
        if rank == 0:
            try:
                self._goodput = RunGoodput(requested, self.output_dir)
                self._ledger = self._goodput.ledger
            except (OSError, ValueError) as error:  # a file system without shared memory maps: no goodput
                log.warning("nemo-throughput: no goodput ledger for this run (%s: %s); the rest is measured",
                            type(error).__name__, error)
        if self.config.per_step_jsonl:
            facts.steps_jsonl = {"path": STEPS_FILE, "complete": True, "error": None}
        self.facts = facts
        backend = dist.get_backend() if dist.is_available() and dist.is_initialized() else None
        self._explain = RunExplanation(self.config, device, rank, facts.places, self.output_dir, records, backend)
        self._exchange = Exchange(extras_width=self._explain.width + 1)  # and the goodput %
        self._start_run_clock()
        if rank == 0 and prometheus is not None:
            self._start_endpoint(prometheus)

    def _start_endpoint(self, setting: dict[str, Any]) -> None:
        """Rank 0: serve live metrics as the prometheus setting (or its variable) asks."""
        facts = self.facts
        labels = {"run": facts.name, "run_id": facts.run_id, "label": facts.label or "",
                  "model": facts.model_name or "", "job_id": job_id(os.environ)}
        try:
            endpoint = PrometheusEndpoint(setting, labels)
        except ImportError:
            log.warning("nemo-throughput: no Prometheus endpoint: prometheus-client is not installed "
                        "(pip install 'nemo-throughput[prometheus]'). Training goes on.")
            return
        if endpoint.serve():
            self._endpoint = endpoint

    def _start_run_clock(self) -> None:
        """MLPerf's run_start: after set-up, before any data is touched."""
        if self.config.target is None:
            return
        self.time_to_target = TimeToTarget(Target(**self.config.target))
        self.time_to_target.start()
        if self.config.mllog and self.rank == 0:
            self._mllog = MLPerfLog(self.output_dir, self.facts.run_id)
            self._mllog.run_start(self.facts.global_batch_size, self.time_to_target.started_wall_ms)

    def train_start(self, steps_done: int, world_size: int, max_steps: int | None = None) -> None:
        """``max_steps``: the step training ends at (None: unknown or unlimited)."""
        if self.facts is None:
            return
        check_profile_window(self.config.profile_steps, self.config.warmup_steps, steps_done, max_steps)
        self._last_step = steps_done
        self._in_flight, self._done = None, False
        self.stats = RunStats(world_size, self.config.warmup_steps, start_step=steps_done,
                                       excluded=self.config.profile_steps)
        self._timer = StepTimer(clock_for(self._device))
        if self.rank == 0:
            self._summary_file = SummaryFile(self.summary_path)
        if self.facts.flops_formula == MEASURED and self.facts.flops_per_sample is None:
            self._flop_counter = StepFlopCounter()
        self._start_goodput(steps_done)
        self._update_summary()
        if self._reporter is not None:
            self._reporter.close()
        self._reporter = OrderedWorker("nemo-throughput-report")
        self._timer.anchor()

    def _start_goodput(self, steps_done: int) -> None:
        """Rank 0: start-up is over; this segment continues an earlier one of the run, or starts one."""
        previous = self._goodput.start(steps_done, self.facts.run_id) if self._goodput is not None else None
        if previous is not None:
            log.info("nemo-throughput: this run continues run %s (segment %d, resumed at step %d; the last "
                     "segment reached step %d)", previous.run_id, self._goodput.segment, steps_done,
                     previous.last_step)

    def watch_sigterm(self) -> None:
        """Install the SIGTERM watch (once): call it after the framework installed its own handler."""
        if self._timer is None or self._sigterm is not None:
            return
        self._write_lock = threading.Lock()
        self._sigterm = SigtermWatch(self._write_at_sigterm)
        self._sigterm.install()

    # ----------------------------------------------------------------------- hot path
    def batch_seen(self, layout: str | None) -> None:
        """The first training batch's layout (batches.batch_layout), told once by an adapter that sees it;
        None (no readable batch) keeps what the framework's config said (NeMo 2's packed data module).
        Packed or padded batches are counted from then on (:meth:`count_batch`); where only the config
        says so, the config's tokens per step count padding: the summary and a warning say so."""
        if self.facts is None or self.facts.seq_length is None:  # samples that are not token sequences
            return
        if layout in (PACKED, PADDED):
            self.facts.batch_layout = layout
            self._token_counter = TokenCounter()
        elif layout is None and self.facts.batch_layout in (PACKED, PADDED) and self._token_counter is None:
            self.not_counted(f"the {self.facts.batch_layout} layout comes from the data config, and the framework "
                              "hands the training hooks no batch to count")
        else:
            self.facts.batch_layout = layout or self.facts.batch_layout

    def count_batch(self, batch: Any) -> None:
        """A micro-batch of the step in progress, counted where the run's batches are packed or padded."""
        counter = self._token_counter
        if counter is not None and counter.unreadable is None:
            counter.add_batch(batch)
            if counter.unreadable is not None:
                self.not_counted(counter.unreadable)

    def count_accumulated(self, slots: Count, seqlen_sq: Count, source: str) -> None:
        """A framework's own counts of the step in progress (token slots, sum of squared sequence
        lengths; ints or device tensors), where it keeps them (Megatron-Bridge's FLOPs accumulators)."""
        if self._timer is not None:
            self._token_counter = self._token_counter or TokenCounter()
            self._token_counter.add_counts(slots, seqlen_sq, source)

    def not_counted(self, why: str) -> None:
        """The run's batches are packed or padded, but cannot be counted: ``why``, in words."""
        self.facts.batch_uncounted = why
        if self.rank == 0:
            log.warning("nemo-throughput: the training batches are %s, but %s: tokens/s, TFLOPS and MFU count global "
                        "batch x seq_length = %s tokens per step, padding included, and attention as if every sample "
                        "were seq_length long. Read them as an upper bound (batch.uncounted in the summary).",
                        self.facts.batch_layout, why, f"{self.facts.workload.tokens_per_step:,}")

    def step_start(self, steps_done: int) -> None:
        """A micro-batch (or the whole step, where the framework has no finer event) starts."""
        if self._timer is not None:
            self._timer.mark(START)
            if self._ledger is not None:
                self._ledger.switch(STEP)
            if self._flop_counter is not None:
                self._count_flops_from_here(steps_done)
            window = self._explain.window
            if window is not None and window.contains(steps_done + 1):
                window.step_start(steps_done + 1)

    def before_backward(self) -> None:
        if self._timer is not None:
            self._timer.mark(BACKWARD)
            if self._flop_counter is not None:
                self._flop_counter.backward_starts()

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
            self._ledger.step_done(step)
        if step == self._last_step:
            return None
        self._last_step = step
        if skipped:
            self.stats.skip(step)
        counts = self._token_counter.step_done() if self._token_counter is not None else None
        self._timer.end_step(step, counts)
        if self._flop_counter is not None and self._flop_counter.counting:
            self._take_measured_flops()
        window = self._explain.window
        if window is not None and window.contains(step):
            window.step_end(step)
            if step == window.last_step:
                self._timer.anchor()  # stopping the profiler (and reading its trace) is no step's time
        if step % self.config.log_every_n_steps != 0:
            return None
        vote = self._check_target(metrics, step, after_validation=False)
        # Steps up to the previous one: their marks are at least one step old.
        steps, extras = self._timer.collect(step - 1), self._sample(step)
        finished, self._in_flight = self._in_flight, self._exchange.start(steps, extras)
        if finished is not None:
            received = finished.received()  # waits here; splitting runs on the reporting thread
            self._reporter.submit(lambda: self._report(*received()))
        self._log_pending()
        return vote

    def _report(self, steps: torch.Tensor, extras: torch.Tensor) -> None:
        """On the reporting thread: one interval into the statistics, the log, the summary."""
        self._absorb(steps, extras)
        self._update_summary()

    def _log_pending(self) -> None:
        """The loggers' calls, on the training thread (loggers need not be thread-safe)."""
        while self._to_log:
            metrics, step = self._to_log.popleft()
            self._log_metrics(metrics, step)

    def _drain_reporter(self, raise_error: bool) -> None:
        """Wait for the reporting thread to take every interval handed over; then log them."""
        error = self._reporter.drain(raise_error=raise_error)
        if error is not None:
            log.error("nemo-throughput: reporting an interval failed (%s: %s)", type(error).__name__, error)
        self._log_pending()

    def _count_flops_from_here(self, steps_done: int) -> None:
        """First micro-batch of the run's first step: start counting; later ones of it: a new forward."""
        if self._flop_counter.counting:
            self._flop_counter.forward_starts()
        elif steps_done == self.stats.start_step:
            self._flop_counter.start()

    def _take_measured_flops(self) -> None:
        """The counted step is over: from now on its FLOPs per sample give model TFLOPS and MFU."""
        data_parallel = self.facts.parallel["data"]
        counted = self._flop_counter.stop(samples=self.facts.global_batch_size // data_parallel)
        self._flop_counter = None
        self.facts.measured_flops = counted.to_dict()
        try:
            self.facts.flops_per_sample = flops_per_sample(counted, self.facts.num_gpus // data_parallel)
        except ValueError as error:  # known only now: the run goes on without model TFLOPS and MFU
            if self.rank == 0:
                log.warning("nemo-throughput: %s Model TFLOPS and MFU stay null for this run.", error)
            return
        if self.rank == 0:
            log.info("nemo-throughput: measured %.4g model FLOPs per sample (forward %.4g, backward %.4g FLOPs "
                     "on this rank's %d samples of step %d)", self.facts.flops_per_sample, counted.forward,
                     counted.backward, counted.samples, self._last_step)

    def _stop_counting_flops(self) -> None:
        if self._flop_counter is not None:
            self._flop_counter.abandon()
            self._flop_counter = None

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
        vote = self._check_target(metrics, steps_done, after_validation=True)
        self._timer.anchor()  # validation time is not part of the next training step
        return vote

    def _check_target(self, metrics: Callable[[], Mapping[str, Any]] | None, step: int,
                      after_validation: bool) -> bool | None:
        """Has the monitored metric reached the target? On every rank at the same points (log steps,
        after validation), so that a stop decided across ranks pairs its collective."""
        clock = self.time_to_target
        if clock is None:
            return None
        first = clock.check(metrics() if metrics is not None else {}, step)
        if self._mllog is not None and after_validation and first is not None:
            self._mllog.evaluation(clock.value, step, samples=step * self.facts.global_batch_size)
        if first:
            self._on_target_reached(step)
        return clock.reached if clock.target.stop else None

    def _on_target_reached(self, step: int) -> None:
        clock = self.time_to_target
        if self.rank == 0:
            log.info("nemo-throughput: %s = %.6g reached the target %s %g at step %d, %.3f s after run start",
                     printable(clock.target.metric), clock.value, "<=" if clock.target.mode == "min" else ">=",
                     clock.target.value, step, clock.seconds)
        if self._mllog is not None:
            self._mllog.run_stop(True, clock.started_wall_ms + round(clock.seconds * 1000), step)
            self._close_mllog()

    def _close_mllog(self) -> None:
        if self._mllog is not None:
            self._mllog.close()
            self._mllog = None

    def _stop_run_clock(self, step: int) -> None:
        """End of the run without the target reached: MLPerf's run_stop, aborted."""
        if self._mllog is not None:
            clock = self.time_to_target
            self._mllog.run_stop(False, clock.started_wall_ms + round(clock.elapsed_s() * 1000), step)
            self._close_mllog()

    # ----------------------------------------------------------------------- end of run
    def train_end(self, steps_done: int) -> None:
        if self._timer is None:
            return
        self._stop_counting_flops()
        self._stop_run_clock(steps_done)
        self._drain_reporter(raise_error=True)
        self._finish("completed", None, self._flush(wait_for_device=True).missing)

    def exception(self, steps_done: int, exception: BaseException) -> None:
        """The run failed or was stopped (KeyboardInterrupt, SystemExit or SIGTERM: interrupted)."""
        if self._timer is None or self._done:
            return
        self._stop_counting_flops()
        self._stop_run_clock(steps_done)
        sigterm = self._sigterm is not None and self._sigterm.received
        interrupted = sigterm or isinstance(exception, (KeyboardInterrupt, SystemExit))
        status = "interrupted" if interrupted else "failed"
        error = f"{type(exception).__name__}: {exception}"
        # Never raise from here: the run's own error must not be replaced with ours.
        self._drain_reporter(raise_error=False)
        if sigterm and not isinstance(exception, SystemExit):  # Lightning's SIGTERMException is one
            error += " (after SIGTERM)"
        several_ranks = self._exchange.world_size > 1
        if several_ranks:
            # What this rank knows goes to disk before any collective: another rank may be gone,
            # and SIGKILL follows SIGTERM within seconds.
            self._write_now(self._with_end(self._summary(status, error),
                                           f"steps after {self._absorbed_through()}: written before the final "
                                           "exchange across ranks"))
        # Several ranks: the device may be stuck behind a collective; read only finished steps.
        final = self._flush(wait_for_device=not several_ranks, interrupted=interrupted)
        others = [rank for rank in final.interrupted_ranks if rank != self.rank]
        if not others and not interrupted and final.missing is not None:
            others = self._ranks_interrupted_on_disk()  # gone before the final exchange could hear them
        if others and not interrupted:  # this rank failed because another one was stopped
            status, error = "interrupted", f"{error} (after {ranks_text(others)} had been interrupted)"
        self._finish(status, error, final.missing)

    def _ranks_interrupted_on_disk(self) -> list[int]:
        """Ranks whose own summary file (where this rank can see it) says they were interrupted:
        a rank stopped by SIGTERM writes it at once, and may be gone before the final exchange."""
        ranks = []
        for rank in range(self._exchange.world_size):
            with contextlib.suppress(OSError, ValueError):
                with open(self._rank_file(rank), encoding="utf-8") as file:
                    if rank != self.rank and json.load(file).get("status") == "interrupted":
                        ranks.append(rank)
        return ranks

    # ----------------------------------------------------------------------- reporting
    def _flush(self, wait_for_device: bool, interrupted: bool = False) -> FinalSteps:
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
        final = self._exchange.finish(pending, self._absorbed_through(), interrupted, self._sample(self._last_step))
        if final.extras is not None:
            self._absorb_extras(final.extras)
        for interval in final.intervals():
            self._absorb(interval)
        self._log_pending()
        if final.missing is not None:
            log.warning("nemo-throughput: the summary lacks %s.", final.missing)
        return final

    def _absorbed_through(self) -> int:
        return self.stats.last_step if self.stats.last_step is not None else self.stats.start_step

    def _sample(self, step: int) -> list[float]:
        """This rank's vector for the log step's all-gather: the explanation's, then the goodput %."""
        return [*self._explain.sample(step), self._goodput_pct]

    def _absorb_extras(self, extras: torch.Tensor) -> None:
        """Every rank's vectors of one log step (:meth:`_sample`): rank 0's goodput %, the explanation's."""
        sampled_at, goodput_pct = float(extras[0, 0]), float(extras[0, -1])
        if math.isnan(sampled_at):  # not sent (a final exchange that did not complete)
            return
        self._received_goodput_pct = goodput_pct
        self._explain.absorb(extras[:, :-1], measured=self.stats.is_measured(int(sampled_at)))

    def _absorb(self, steps: torch.Tensor, extras: torch.Tensor | None = None) -> None:
        interval = self.stats.add(steps)
        if extras is not None:
            self._absorb_extras(extras)
        if interval is None or self.rank not in (0, self._log_rank):
            return
        workload = self._workload()
        metrics = workload.metrics(interval.step_time_s)
        logged = logger_metrics(interval, metrics, self._run_figures(workload))
        if self.rank == self._log_rank and self._log_metrics is not None:
            self._to_log.append((logged, interval.last_step))
        if self.rank != 0:
            return
        log.info(format_interval(interval, metrics))
        if metrics["mfu_above_peak"] is not None and not self._warned_above_peak:
            self._warned_above_peak = True
            log.warning(mfu_above_peak_warning(self.facts, metrics["mfu_above_peak"]))
        if self._endpoint is not None:
            self._endpoint.interval(logged, interval.measured_step_s, self._explain.latest_telemetry,
                                    self.facts.places)
        if self.facts.steps_jsonl and self.facts.steps_jsonl["complete"]:
            self._append_steps(steps)

    def _run_figures(self, workload: Workload) -> dict[str, float | None]:
        """The loggers' figures of the run so far: straggler, padding, telemetry, energy, goodput."""
        straggler, counted = self.stats.straggler(), workload.counted
        return {"straggler_excess_pct": straggler["excess_pct"] if straggler else None,
                "padding_share": counted.padding_share if counted else None,
                "goodput_pct": None if math.isnan(self._received_goodput_pct) else self._received_goodput_pct,
                **self._explain.live(workload.step_tokens)}

    def _append_steps(self, steps: torch.Tensor) -> None:
        """One interval's rows, all or none; after a failure (a full disk) the file stops, marked
        incomplete in the summary, and training goes on."""
        path = os.path.join(self.output_dir, STEPS_FILE)
        try:
            append_jsonl(path, step_rows(steps, self.stats, self.facts.run_id))
        except OSError as error:
            self.facts.steps_jsonl.update(complete=False, error=f"{type(error).__name__}: {error}")
            log.error("nemo-throughput: could not append to %s (%s); it stops here and the summary marks it "
                      "incomplete. Training goes on.", printable(path), error)

    def _finish(self, status: str, error: str | None, missing: str | None) -> None:
        """The final summary (rank 0); other ranks keep theirs only while rank 0 may lack their steps."""
        if self._ledger is not None:
            self._ledger.switch(DATA)  # the segment's last event: its end
        summary = self._with_end(self._summary(status, error, final=True), missing)
        with self._write_lock or contextlib.nullcontext():
            self._done = True
            if self.rank == 0:
                self._summary_file.close(summary)
                log.info("nemo-throughput: %s run summary written to %s", status, printable(self.summary_path))
            elif missing is None:  # the final exchange completed: rank 0 has every step this rank has
                with contextlib.suppress(FileNotFoundError):
                    os.remove(self.rank_summary_path)
            elif self._write_rank_file(summary, durable=True):
                log.warning("nemo-throughput: rank %d wrote what it knows to %s", self.rank,
                            printable(self.rank_summary_path))
        self._close_endpoint(summary)
        if self._sigterm is not None:
            self._sigterm.uninstall()
            self._sigterm = None
        self._reporter.close()  # drained before the final exchange: its thread ends now
        if self._ledger is not None:
            self._ledger.close()
            self._goodput = self._ledger = None

    def _close_endpoint(self, summary: dict[str, Any]) -> None:
        """Rank 0: the final figures, served ``linger_s`` longer (not after SIGTERM: the kill follows)."""
        if self._endpoint is not None:
            self._endpoint.summary(summary)
            received = self._sigterm is not None and self._sigterm.received
            self._endpoint.close(linger_s=0.0 if received else self._endpoint.setting["linger_s"])
            self._endpoint = None

    def _write_at_sigterm(self) -> None:
        """On the SIGTERM watch's thread: the last summary the training thread built (a consistent
        one), marked interrupted, before the framework's handler broadcasts (which can hang)."""
        if self._snapshot is None:
            return
        absorbed_through, snapshot = self._snapshot
        summary = {**snapshot, "status": "interrupted", "error": "SIGTERM received"}
        self._write_now(self._with_end(summary, f"steps after {absorbed_through}: written when SIGTERM arrived, "
                                                "before the final exchange across ranks"))

    def _write_now(self, summary: dict[str, Any]) -> None:
        """This rank's interim summary: rank 0 through its background writer, others to their own file."""
        with self._write_lock or contextlib.nullcontext():
            if self._done:
                return  # the final one is written; never replace it with an older one
            if self.rank == 0:
                self._publish(summary)
            else:
                self._write_rank_file(summary, durable=False)

    def _publish(self, summary: dict[str, Any]) -> None:
        """Rank 0: a running or interrupted summary, to its file (in the background) and the endpoint."""
        self._summary_file.update(summary)
        if self._endpoint is not None:
            self._endpoint.summary(summary)

    def _write_rank_file(self, summary: dict[str, Any], durable: bool) -> bool:
        # Never raise from here: an exception event must not replace the run's own error with ours.
        try:
            write_json_atomic(self.rank_summary_path, summary, durable=durable)
            return True
        except (OSError, ValueError) as error:
            log.warning("nemo-throughput: could not write %s: %s", printable(self.rank_summary_path), error)
            return False

    def _summary(self, status: str, error: str | None = None, final: bool = False) -> dict[str, Any]:
        workload = self._workload()
        explained = self._explain.sections(workload.step_tokens, final=final and self.rank == 0)
        clock = self.time_to_target.section() if self.time_to_target is not None else None
        goodput = self._goodput.section() if self._goodput is not None else None
        if goodput is not None and goodput["goodput_pct"] is not None:
            self._goodput_pct = goodput["goodput_pct"]  # sent to every rank with the next log step's exchange
        return build_summary(self.facts, self.stats, status, error, explained, time_to_target=clock,
                             counted=workload.counted, goodput=goodput)

    def _workload(self) -> Workload:
        """The facts' workload, with the steps' counted batches where they were counted."""
        counted = self._counted_step()
        return replace(self.facts.workload, counted=counted) if counted is not None else self.facts.workload

    def _counted_step(self) -> CountedStep | None:
        """The mean measured step's counts over all replicas (each rank counts its own batches; ranks
        of one data-parallel replica count the same ones, or nothing), or None where not counted."""
        counter = self._token_counter
        if counter is None or counter.unreadable is not None or self.facts.batch_uncounted is not None:
            return None
        per_rank = {name: self.stats.counted_per_step(name) for name in BATCH_COUNTS}
        if per_rank["slots"] is None or per_rank["seqlen_sq"] is None:
            return None
        replicas = self.facts.parallel.get("data") or self.facts.num_gpus
        tokens, slots, seqlen_sq = (None if means is None else sum(means) / len(means) * replicas
                                    for means in per_rank.values())
        flops = None
        if self.facts.model_spec is not None and self.facts.flops_formula in FORMULAS:
            per_token, per_token_pair = flops_terms(self.facts.model_spec, self.facts.flops_formula)
            flops = per_token * slots + per_token_pair * seqlen_sq
        return CountedStep(tokens, slots, seqlen_sq, flops, counter.source)

    def _with_end(self, summary: dict[str, Any], missing: str | None) -> dict[str, Any]:
        """Add how the run ended: which rank wrote it, the signal, what the summary lacks."""
        received = self._sigterm is not None and self._sigterm.received
        summary["end"] = {"rank": self.rank, "signal": "SIGTERM" if received else None,
                          "all_steps_exchanged": missing is None, "missing": missing}
        return summary

    def _update_summary(self) -> None:
        """Rewrite the running summary, in the background (rank 0); _finish writes the final one.
        Every rank keeps it, consistent as of this log step, for the SIGTERM watch to write. After
        SIGTERM an interval still being reported is written marked interrupted, as the watch's write
        was: a `running` one would replace that, and stay if the process is then killed."""
        summary = self._summary("running")
        self._snapshot = (self._absorbed_through(), summary)
        with self._write_lock or contextlib.nullcontext():  # the watch checks and writes under it too
            received = self._sigterm is not None and self._sigterm.received
            if self.rank == 0 and not received and not self._done:
                self._publish(summary)
        if received:
            self._write_at_sigterm()


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
        return self.measurement.output_dir

    @property
    def summary_path(self) -> str | None:
        return self.measurement.summary_path

    @property
    def rank_summary_path(self) -> str | None:
        return self.measurement.rank_summary_path


def ranks_text(ranks: list[int], shown: int = 8) -> str:
    listed = ", ".join(map(str, ranks[:shown])) + (f" and {len(ranks) - shown} more" if len(ranks) > shown else "")
    return f"rank{'s' if len(ranks) > 1 else ''} {listed}"
