"""What becomes of each exchanged interval: the run statistics, the live line, the loggers' figures,
rank 0's endpoint and steps.jsonl rows, and the summary as of what was absorbed. Log steps hand
intervals to the reporting thread (:class:`~nemo_throughput.background.OrderedWorker`) with the
run's facts as of that step (a frozen snapshot); the loggers' calls go back to the training thread
(loggers need not be thread-safe). Trackers are guests: a logger that raises (W&B or MLflow
unreachable, say) is told once in the log, counted, and never fails the run. The end of the run
drains the thread and reports the final exchange's intervals on the training thread.
"""

from __future__ import annotations

import math
import os
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

import torch

from nemo_throughput.background import OrderedWorker
from nemo_throughput.batches import CheckedBatches, uncounted_warning
from nemo_throughput.explain.run import RunExplanation
from nemo_throughput.flops import FORMULAS, flops_terms
from nemo_throughput.goodput.run import RunGoodput
from nemo_throughput.progress import format_interval, logger_metrics, step_rows
from nemo_throughput.run.publishing import Publisher
from nemo_throughput.run.stall import LONGEST_LOOK_S, StallWatch
from nemo_throughput.run_facts import RunFacts, mfu_above_peak_warning
from nemo_throughput.run_stats import COLUMNS, RunStats
from nemo_throughput.summary import STEPS_FILE, append_jsonl, build_summary
from nemo_throughput.target import RunClock
from nemo_throughput.text import package_logger, printable
from nemo_throughput.throughput import CountedStep, Workload
from nemo_throughput.timing import BATCH_CHECKS, BATCH_COUNTS

log = package_logger(__name__)

# One logger's call with an interval's metrics: (metrics, last step of the interval).
LogMetrics = Callable[[dict[str, float], int], None]
# The framework's loggers, read at each log step: (a name for messages, its call).
Loggers = Callable[[], Iterable[tuple[str, LogMetrics]]]


def log_metrics_to(logger: Any, metrics: dict[str, float], step: int) -> None:
    """LogMetrics of a logger with ``log_metrics(metrics, step=...)`` (Lightning's, MLflow's, Comet's)."""
    logger.log_metrics(metrics, step=step)


class Reporter:
    """One rank's reporting of a training run (rank 0 and the loggers' rank report; every rank
    absorbs, to keep the statistics the final exchange and the summary need)."""

    def __init__(self, stats: RunStats, explain: RunExplanation, publisher: Publisher, clock: RunClock | None,
                 goodput: RunGoodput | None, loggers: Loggers | None, log_rank: int,
                 stall: StallWatch | None = None) -> None:
        self.stats, self._explain, self._publisher = stats, explain, publisher
        self._clock, self._goodput = clock, goodput  # the summary's time to target and goodput (rank 0)
        self._rank = publisher.rank
        self._loggers, self._log_rank = loggers, log_rank
        self._failures: dict[str, int] = {}  # a logger's name -> calls of it that raised
        self.stall = stall  # looked at between the reporting thread's tasks
        self._worker = OrderedWorker("nemo-throughput-report", idle=self._look if stall is not None else None,
                                     idle_every_s=stall.look_every_s if stall is not None else 1.0)
        self._facts: RunFacts | None = None  # as of the latest running summary, for a stalled one
        self._stalled_published = 0.0  # monotonic time rank 0 last wrote the stalled summary
        self._to_log: deque[tuple[dict[str, float], int]] = deque()  # for the loggers, on the training thread
        self.goodput_pct = math.nan  # rank 0's goodput % as last received (NaN: none yet)
        self.steps_error: str | None = None  # why steps.jsonl stopped (a full disk), on the reporting thread
        self.checked = CheckedBatches()  # every rank's bad micro-batches, as the steps absorbed say
        self._warned_above_peak = False  # MFU above 100 %: warned once per run

    def submit(self, received: Callable[[], tuple[torch.Tensor, torch.Tensor]], facts: RunFacts) -> None:
        """An all-gather's result (``received`` splits it, on the reporting thread) and the facts as
        of the log step that took it."""
        log_step_at = time.time()  # steps went on until now: the endpoint's stall alert measures from it

        def report() -> None:
            self._publisher.last_step(log_step_at)
            self.absorb(*received(), facts=facts)
            self.publish_running(facts)
        self._worker.submit(report)

    @property
    def absorbed_through(self) -> int:
        """The last step in the statistics (the start step before any)."""
        return self.stats.last_step if self.stats.last_step is not None else self.stats.start_step

    def summary(self, facts: RunFacts, status: str, error: str | None = None, final: bool = False) -> dict[str, Any]:
        """The summary as of what was absorbed (on the reporting thread, or on the training thread once
        it is drained); ``facts`` as of the log step it reports."""
        facts = self._reported(facts)
        workload = self.workload(facts)
        explained = self._explain.sections(workload.step_tokens, final=final and self._rank == 0)
        clock = self._clock.clock.section() if self._clock is not None else None
        goodput = self._goodput.section() if self._goodput is not None else None  # its % goes out at log steps
        return build_summary(facts, self.stats, status, error, explained, time_to_target=clock,
                             counted=workload.counted, goodput=goodput,
                             stalls=self.stall.records() if self.stall is not None else None)

    def publish_running(self, facts: RunFacts) -> None:
        """The running (or, while the stall watch says so, stalled) summary as of a log step
        (run.publishing.Publisher.running)."""
        self._facts = facts
        status = "stalled" if self.stall is not None and self.stall.stalled else "running"
        self._publisher.running(self.summary(facts, status), self.absorbed_through)

    def _look(self) -> None:
        """The stall watch's look (run.stall), on the reporting thread between its tasks: a stall
        starting or ending is logged, and rank 0's summary says it (refreshed every few seconds while
        it lasts)."""
        event, stall = self.stall.look(), self.stall
        self._say(event)
        if self._rank == 0:  # the endpoint's time of the latest step, as fresh as the looks
            self._publisher.last_step(stall.last_step_epoch_s)
        now = time.monotonic()
        refresh = stall.stalled and now - self._stalled_published >= LONGEST_LOOK_S
        if self._rank == 0 and self._facts is not None and (event is not None or refresh):
            self._stalled_published = now
            self.publish_running(self._facts)

    def stop_stall_watch(self) -> None:
        """Training ended (on the training thread): a stall whose steps resumed since the last look
        is over, and said so like any other."""
        if self.stall is not None:
            self._say(self.stall.stop())

    def _say(self, event: str | None) -> None:
        """The log line of a stall starting ("stalled") or ending ("resumed")."""
        stall = self.stall
        if event == "stalled":
            current = stall.stalls[-1]
            stacks = f"every thread's stack is in {current.stacks}" if current.stacks else "no stacks could be written"
            log.warning("nemo-throughput: rank %d: stalled: no step since step %d for %.1f s (a stall: over %.1f s); "
                        "%s beside the summary.", self._rank, current.after_step, current.seconds,
                        stall.threshold_s(), stacks)
        elif event == "resumed":
            log.info("nemo-throughput: rank %d: steps resumed after %.0f s without one (after step %d)", self._rank,
                     stall.stalls[-1].seconds, stall.stalls[-1].after_step)

    def absorb(self, steps: torch.Tensor, extras: torch.Tensor | None, facts: RunFacts) -> None:
        """Every rank's steps of one interval, and its log step's vectors (:meth:`absorb_extras`)."""
        interval = self.stats.add(steps)
        if extras is not None:
            self.absorb_extras(extras)
        self._check(steps, facts)
        if interval is None or self._rank not in (0, self._log_rank):
            return
        facts = self._reported(facts)
        workload = self.workload(facts)
        metrics = workload.metrics(interval.step_time_s)
        straggler, counted = self.stats.straggler(), workload.counted
        logged = logger_metrics(interval, metrics, {
            "straggler_excess_pct": straggler["excess_pct"] if straggler else None,
            "padding_share": counted.padding_share if counted else None,
            "goodput_pct": None if math.isnan(self.goodput_pct) else self.goodput_pct,
            **self._explain.live(workload.step_tokens)})
        if self._rank == self._log_rank and self._loggers is not None:
            self._to_log.append((logged, interval.last_step))
        if self._rank != 0:
            return
        log.info(format_interval(interval, metrics))
        if metrics["mfu_above_peak"] is not None and not self._warned_above_peak:
            self._warned_above_peak = True
            log.warning(mfu_above_peak_warning(facts, metrics["mfu_above_peak"]))
        self._publisher.interval(logged, interval.measured_step_s, self._explain.latest_telemetry, facts.places,
                                 interval.rank_straggler_s)
        if facts.steps_jsonl and self.steps_error is None:
            self._append_steps(steps, facts.run_id)

    def absorb_extras(self, extras: torch.Tensor) -> None:
        """Every rank's vector of one log step (explain.run's layout): the explanation's, rank 0's goodput %."""
        received = self._explain.absorb(extras, self.stats.is_measured)
        if received is not None:
            self.goodput_pct = received

    def _append_steps(self, steps: torch.Tensor, run_id: str) -> None:
        """One interval's rows, all or none; after a failure (a full disk) the file stops, marked
        incomplete in the summary, and training goes on."""
        path = os.path.join(self._publisher.output_dir, STEPS_FILE)
        try:
            append_jsonl(path, step_rows(steps, self.stats, run_id))
        except OSError as error:
            self.steps_error = f"{type(error).__name__}: {error}"
            log.error("nemo-throughput: could not append to %s (%s); it stops here and the summary marks it "
                      "incomplete. Training goes on.", printable(path), error)

    def _check(self, steps: torch.Tensor, facts: RunFacts) -> None:
        """Every rank's bad micro-batches of one interval (warm-up steps included): from the first,
        the run counts the config's tokens; rank 0 warns once, unless it found them itself on the
        host and warned then (``facts`` as of a log step after the interval's steps)."""
        bad, problems = (steps[..., COLUMNS.index(name)] for name in BATCH_CHECKS)
        if self.checked.add(bad, problems) and facts.batch_uncounted is None and self._rank == 0:
            log.warning(uncounted_warning(facts.batch_layout, self.checked.why(facts.batch_count_source),
                                          facts.workload.tokens_per_step))

    def _reported(self, facts: RunFacts) -> RunFacts:
        """``facts`` with what the reporting has: steps.jsonl's state, the bad micro-batches of every rank."""
        changes: dict[str, Any] = {}
        if facts.steps_jsonl is not None and self.steps_error is not None:
            changes["steps_jsonl"] = {**facts.steps_jsonl, "complete": False, "error": self.steps_error}
        if self.checked.bad is not None:
            changes["batch_uncounted_batches"] = self.checked.bad
        if facts.batch_uncounted is None and self.checked.bad:
            changes["batch_uncounted"] = self.checked.why(facts.batch_count_source)
        return replace(facts, **changes) if changes else facts

    def workload(self, facts: RunFacts) -> Workload:
        """The facts' workload, with the steps' counted batches where they were counted."""
        counted = self._counted_step(facts)
        return replace(facts.workload, counted=counted) if counted is not None else facts.workload

    def _counted_step(self, facts: RunFacts) -> CountedStep | None:
        """The mean measured step's counts over all replicas (each rank counts its own batches; ranks
        of one data-parallel replica count the same ones, or nothing), or None where not counted."""
        if facts.batch_count_source is None or facts.batch_uncounted is not None:
            return None
        per_rank = {name: self.stats.counted_per_step(name) for name in BATCH_COUNTS}
        if per_rank["slots"] is None or per_rank["seqlen_sq"] is None:
            return None
        replicas = facts.parallel.get("data") or facts.num_gpus
        tokens, slots, seqlen_sq = (None if means is None else sum(means) / len(means) * replicas
                                    for means in per_rank.values())
        flops = None
        if facts.model_spec is not None and facts.flops_formula in FORMULAS:
            per_token, per_token_pair = flops_terms(facts.model_spec, facts.flops_formula)
            flops = per_token * slots + per_token_pair * seqlen_sq
        return CountedStep(tokens, slots, seqlen_sq, flops, facts.batch_count_source)

    def log_pending(self) -> None:
        """The loggers' calls, on the training thread (loggers need not be thread-safe)."""
        while self._to_log:
            metrics, step = self._to_log.popleft()
            for name, log_metrics in self._loggers():
                try:
                    log_metrics(metrics, step)
                except Exception as error:  # a guest's failure: never the run's
                    self._failed(name, error)

    def _failed(self, name: str, error: Exception) -> None:
        self._failures[name] = self._failures.get(name, 0) + 1
        if self._failures[name] == 1:
            log.warning("nemo-throughput: the %s logger could not take our metrics (%s: %s); training goes on, and "
                        "the summary has every figure. Its further failures are counted, not logged.",
                        printable(name), type(error).__name__, printable(error))

    def drain(self, raise_error: bool) -> None:
        """Wait for the reporting thread to take every interval handed over; then log them."""
        error = self._worker.drain(raise_error=raise_error)
        if error is not None:
            log.error("nemo-throughput: reporting an interval failed (%s: %s)", type(error).__name__, error)
        self.log_pending()

    def close(self) -> None:
        self._worker.close()
        for name, count in self._failures.items():
            log.warning("nemo-throughput: the %s logger failed to take our metrics %d time%s in this run", printable(name),
                        count, "s" if count > 1 else "")
