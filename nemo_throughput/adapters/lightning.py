"""The Lightning callback: hooks -> step timer -> cross-rank exchange -> log line, loggers, summary.

``ThroughputCallback`` subclasses the ``Callback`` of both Lightning namespaces that are
installed (``lightning.pytorch`` for NeMo 2, ``pytorch_lightning`` for NeMo 1.x and older
code), since each Trainer accepts only its own namespace's callbacks.

Hot path (every step): one clock mark in each of four hooks, nothing read. Log step (every
``log_every_n_steps``): collect the previous steps, sample this rank's telemetry, start their
all-gather, finish the one started on the last log step, log it and rewrite the summary (rank 0).
Only the steps of a ``profile_steps`` window do more (start and stop the profiler), and, with
``flops_formula: measured``, the run's first step (a warm-up step), whose FLOPs are counted. With
a ``target``, log steps and validations also read the monitored metric.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import threading
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

import torch
import torch.distributed as dist

from nemo_throughput import environment
from nemo_throughput.adapters.nemo import read_module
from nemo_throughput.aggregation import Exchange, FinalSteps, Gathered, Interval, RunStats, step_times
from nemo_throughput.config import ThroughputConfig
from nemo_throughput.explain.run import RunExplanation
from nemo_throughput.flops import MEASURED, ModelSpec, model_flops_per_sample
from nemo_throughput.hardware import device_name, dtype_for_precision, identify, peak_tflops
from nemo_throughput.measured_flops import StepFlopCounter, flops_per_sample
from nemo_throughput.signals import SigtermWatch
from nemo_throughput.summary import (
    STEPS_FILE,
    USER_FLOPS,
    OutputDirError,
    RunFacts,
    SummaryFile,
    append_jsonl,
    build_summary,
    claim_output_dir,
    write_json_atomic,
)
from nemo_throughput.target import MLPerfLog, Target, TimeToTarget
from nemo_throughput.timing import BACKWARD, OPTIMIZER, START, StepTimer, StepTimes, clock_for

log = logging.getLogger(__name__)


def _callback_bases() -> tuple[type, ...]:
    bases = []
    for namespace in ("lightning.pytorch", "pytorch_lightning"):
        try:
            bases.append(importlib.import_module(namespace).Callback)
        except ImportError:
            pass
    if not bases:
        raise ImportError("nemo-throughput needs `lightning` or `pytorch-lightning`: pip install pytorch-lightning")
    return tuple(bases)


class ThroughputCallback(*_callback_bases()):
    """Times every optimizer step and reports tokens/s, MFU and stragglers across ranks.

    Keyword arguments are the fields of :class:`~nemo_throughput.config.ThroughputConfig`.
    """

    def __init__(self, **settings: Any) -> None:
        self.config = ThroughputConfig.from_mapping(settings)
        self.from_hydra_config = False  # set by the `+callbacks=throughput` factory
        self.facts: RunFacts | None = None
        self.stats: RunStats | None = None
        self.output_dir: str | None = None
        self._summary_file: SummaryFile | None = None
        self._timer: StepTimer | None = None
        self._exchange: Exchange | None = None
        self._explain: RunExplanation | None = None
        self._in_flight: Gathered | None = None
        self._flop_counter: StepFlopCounter | None = None  # flops_formula measured, until the first step ends
        self._time_to_target: TimeToTarget | None = None  # target set: the run clock
        self._mllog: MLPerfLog | None = None  # mllog on, rank 0
        self._last_step = 0
        self._rank = 0
        self._done = False
        # End of run: SIGTERM watch, the last consistent summary, and a lock (made at training
        # start: a callback may be pickled before, as by ddp_spawn) between the two writers.
        self._sigterm: SigtermWatch | None = None
        self._snapshot: tuple[int, dict[str, Any]] | None = None
        self._write_lock: threading.Lock | None = None

    @property
    def summary_path(self) -> str | None:
        return os.path.join(self.output_dir, "summary.json") if self.output_dir else None

    @property
    def rank_summary_path(self) -> str | None:
        """Where a rank other than 0 leaves what it knew when rank 0 may lack some of it."""
        return os.path.join(self.output_dir, f"summary.rank{self._rank}.json") if self.output_dir else None

    # ----------------------------------------------------------------------- set-up
    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage != "fit" or self._deduplicate(trainer):
            return
        self._rank = trainer.global_rank
        records = _gather_rank_records()
        with _warnings_on_rank_zero(self._rank):
            facts = describe_run(self.config, trainer, pl_module, records)
        requested = (self.config.output_dir or os.environ.get(environment.ENV_OUTPUT_DIR)
                     or os.path.join(trainer.log_dir or os.getcwd(), "throughput"))
        # Checked now, not when the summary is first written at the end of hours of training.
        self.output_dir, facts.run_id = _claim_output_dir_on_rank_zero(self._rank, requested, facts)
        if self.config.per_step_jsonl:
            facts.steps_jsonl = {"path": STEPS_FILE, "complete": True, "error": None}
        self.facts = facts
        backend = dist.get_backend() if dist.is_available() and dist.is_initialized() else None
        self._explain = RunExplanation(self.config, trainer.strategy.root_device, self._rank, facts.places,
                                       self.output_dir, records, backend)
        self._exchange = Exchange(extras_width=self._explain.width)
        self._start_run_clock()

    def _start_run_clock(self) -> None:
        """MLPerf's run_start: after set-up, before any data is touched (Lightning creates the data
        loaders after the setup hooks)."""
        if self.config.target is None:
            return
        self._time_to_target = TimeToTarget(Target(**self.config.target))
        self._time_to_target.start()
        if self.config.mllog and self._rank == 0:
            self._mllog = MLPerfLog(self.output_dir, self.facts.run_id)
            self._mllog.run_start(self.facts.global_batch_size, self._time_to_target.started_wall_ms)

    def _deduplicate(self, trainer: Any) -> bool:
        """Drop this instance if it came from `+callbacks=throughput` and the code added one too."""
        others = [c for c in trainer.callbacks if isinstance(c, ThroughputCallback) and c is not self]
        if not others:
            return False
        if self.from_hydra_config:
            log.warning("ThroughputCallback is already in the trainer's callbacks; ignoring the one from "
                        "`+callbacks=throughput` (its settings do not apply).")
            # A new list, not an in-place removal: Lightning is iterating over the old one.
            trainer.callbacks = [c for c in trainer.callbacks if c is not self]
            return True
        if not any(c.from_hydra_config for c in others):
            raise ValueError("More than one ThroughputCallback was given to the Trainer; pass exactly one.")
        return False

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if self.facts is None:
            return
        self._last_step = trainer.global_step
        self._in_flight, self._done = None, False
        self.stats = RunStats(trainer.world_size, self.config.warmup_steps, start_step=trainer.global_step,
                              excluded=self.config.profile_steps)
        self._timer = StepTimer(clock_for(trainer.strategy.root_device))
        if self._rank == 0:
            self._summary_file = SummaryFile(self.summary_path)
        if self.facts.flops_formula == MEASURED and self.facts.flops_per_sample is None:
            self._flop_counter = StepFlopCounter()
        self._update_summary()
        self._timer.anchor()

    # ----------------------------------------------------------------------- hot path
    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if self._timer is not None:
            self._timer.mark(START)
            if self._flop_counter is not None:
                self._count_flops_from_here(trainer)
            window = self._explain.window
            if window is not None and window.contains(trainer.global_step + 1):
                window.step_start(trainer.global_step + 1)

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        if self._timer is not None:
            self._timer.mark(BACKWARD)
            if self._flop_counter is not None:
                self._flop_counter.backward_starts()

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        if self._timer is not None:
            self._timer.mark(OPTIMIZER)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        step = trainer.global_step
        if self._timer is None or step == self._last_step:
            return  # a gradient-accumulation micro-batch: the optimizer step is not over yet
        self._last_step = step
        self._timer.end_step(step)
        if self._flop_counter is not None and self._flop_counter.counting:
            self._take_measured_flops()
        window = self._explain.window
        if window is not None and window.contains(step):
            window.step_end(step)
            if step == window.last_step:
                self._timer.anchor()  # stopping the profiler (and reading its trace) is no step's time
        if step % self.config.log_every_n_steps == 0:
            self._check_target(trainer, after_validation=False)
            # Steps up to the previous one: their marks are at least one step old.
            steps, extras = self._timer.collect(step - 1), self._explain.sample(step)
            finished, self._in_flight = self._in_flight, self._exchange.start(steps, extras)
            if finished is not None:
                self._absorb(trainer, *finished.wait())
            self._update_summary()

    def _count_flops_from_here(self, trainer: Any) -> None:
        """First micro-batch of the run's first step: start counting; later ones of it: a new forward."""
        if self._flop_counter.counting:
            self._flop_counter.forward_starts()
        elif trainer.global_step == self.stats.start_step:
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
            if self._rank == 0:
                log.warning("nemo-throughput: %s Model TFLOPS and MFU stay null for this run.", error)
            return
        if self._rank == 0:
            log.info("nemo-throughput: measured %.4g model FLOPs per sample (forward %.4g, backward %.4g FLOPs "
                     "on this rank's %d samples of step %d)", self.facts.flops_per_sample, counted.forward,
                     counted.backward, counted.samples, self._last_step)

    def _stop_counting_flops(self) -> None:
        if self._flop_counter is not None:
            self._flop_counter.abandon()
            self._flop_counter = None

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if self._timer is not None and trainer.state.fn == "fit" and not trainer.sanity_checking:
            self._check_target(trainer, after_validation=True)
            self._timer.anchor()  # validation time is not part of the next training step

    def _check_target(self, trainer: Any, after_validation: bool) -> None:
        """Has the monitored metric reached the target? On every rank at the same points (log steps,
        after validation), so that a stop decided across ranks pairs its collective."""
        clock = self._time_to_target
        if clock is None:
            return
        step = trainer.global_step
        first = clock.check(trainer.callback_metrics, step)
        if self._mllog is not None and after_validation and first is not None:
            self._mllog.evaluation(clock.value, step, samples=step * self.facts.global_batch_size)
        if first:
            self._on_target_reached(step)
        if clock.target.stop and trainer.strategy.reduce_boolean_decision(clock.reached, all=False):
            trainer.should_stop = True

    def _on_target_reached(self, step: int) -> None:
        clock = self._time_to_target
        if self._rank == 0:
            log.info("nemo-throughput: %s = %.6g reached the target %s %g at step %d, %.3f s after run start",
                     clock.target.metric, clock.value, "<=" if clock.target.mode == "min" else ">=",
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
            clock = self._time_to_target
            self._mllog.run_stop(False, clock.started_wall_ms + round(clock.elapsed_s() * 1000), step)
            self._close_mllog()

    # ----------------------------------------------------------------------- end of run
    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        # Lightning installs its SIGTERM handler after on_fit_start; this is the first hook after.
        if self._timer is None or self._sigterm is not None:
            return
        self._write_lock = threading.Lock()
        self._sigterm = SigtermWatch(self._write_at_sigterm)
        self._sigterm.install()

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        if self._timer is None:
            return
        self._stop_counting_flops()
        self._stop_run_clock(trainer.global_step)
        self._finish("completed", None, self._flush(trainer, wait_for_device=True).missing)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        if self._timer is None or self._done:
            return
        self._stop_counting_flops()
        self._stop_run_clock(trainer.global_step)
        sigterm = self._sigterm is not None and self._sigterm.received
        interrupted = sigterm or isinstance(exception, (KeyboardInterrupt, SystemExit))
        status = "interrupted" if interrupted else "failed"
        error = f"{type(exception).__name__}: {exception}"
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
        final = self._flush(trainer, wait_for_device=not several_ranks, interrupted=interrupted)
        others = [rank for rank in final.interrupted_ranks if rank != self._rank]
        if others and not interrupted:  # this rank failed because another one was stopped
            status, error = "interrupted", f"{error} (after {_ranks_text(others)} had been interrupted)"
        self._finish(status, error, final.missing)

    # ----------------------------------------------------------------------- reporting
    def _flush(self, trainer: Any, wait_for_device: bool, interrupted: bool = False) -> FinalSteps:
        """Exchange and absorb every step not yet absorbed, the interval in flight included,
        waiting for the other ranks at most the final-exchange timeout."""
        # The in-flight all-gather (default group) is never waited for: a peer may be gone. Its
        # steps go again over the final exchange.
        self._in_flight = None
        if wait_for_device:  # else the device may be stuck: leave an open profile window as it is
            self._explain.close()
        pending = self._timer.collect(wait=wait_for_device)
        extras = self._explain.sample(self._last_step)
        final = self._exchange.finish(pending, self._absorbed_through(), interrupted, extras)
        for interval in final.intervals():
            self._absorb(trainer, interval)
        if final.extras is not None:
            self._explain.absorb(final.extras, measured=self.stats.is_measured(self._last_step))
        if final.missing is not None:
            log.warning("nemo-throughput: the summary lacks %s.", final.missing)
        return final

    def _absorbed_through(self) -> int:
        return self.stats.last_step if self.stats.last_step is not None else self.stats.start_step

    def _absorb(self, trainer: Any, steps: torch.Tensor, extras: torch.Tensor | None = None) -> None:
        interval = self.stats.add(steps)
        if extras is not None:
            sampled_at = int(extras[0, 0])
            self._explain.absorb(extras, measured=self.stats.is_measured(sampled_at))
        if interval is None or self._rank != 0:
            return
        metrics = self.facts.workload.metrics(interval.step_time_s)
        log.info(format_interval(interval, metrics))
        logged = {f"throughput/{k}": v for k, v in metrics.items() if v is not None}
        logged["throughput/step_time_s"] = interval.step_time_s
        logged["throughput/slowest_rank"] = interval.slowest_rank
        for logger in trainer.loggers:
            logger.log_metrics(logged, step=interval.last_step)
        if self.facts.steps_jsonl and self.facts.steps_jsonl["complete"]:
            self._append_steps(steps)

    def _append_steps(self, steps: torch.Tensor) -> None:
        """One interval's rows, all or none; after a failure (a full disk) the file stops, marked
        incomplete in the summary, and training goes on."""
        path = os.path.join(self.output_dir, STEPS_FILE)
        try:
            append_jsonl(path, step_rows(steps, self.stats, self.facts.run_id))
        except OSError as error:
            self.facts.steps_jsonl.update(complete=False, error=f"{type(error).__name__}: {error}")
            log.error("nemo-throughput: could not append to %s (%s); it stops here and the summary marks it "
                      "incomplete. Training goes on.", path, error)

    def _finish(self, status: str, error: str | None, missing: str | None) -> None:
        """The final summary (rank 0); other ranks keep theirs only while rank 0 may lack their steps."""
        summary = self._with_end(self._summary(status, error, final=True), missing)
        with self._write_lock or contextlib.nullcontext():
            self._done = True
            if self._rank == 0:
                self._summary_file.close(summary)
                log.info("nemo-throughput: %s run summary written to %s", status, self.summary_path)
            elif missing is None:  # the final exchange completed: rank 0 has every step this rank has
                with contextlib.suppress(FileNotFoundError):
                    os.remove(self.rank_summary_path)
            elif self._write_rank_file(summary, durable=True):
                log.warning("nemo-throughput: rank %d wrote what it knows to %s", self._rank, self.rank_summary_path)
        if self._sigterm is not None:
            self._sigterm.uninstall()
            self._sigterm = None

    def _write_at_sigterm(self) -> None:
        """On the SIGTERM watch's thread: the last summary the training thread built (a consistent
        one), marked interrupted, before Lightning's handler broadcasts (which can hang)."""
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
            if self._rank == 0:
                self._summary_file.update(summary)
            else:
                self._write_rank_file(summary, durable=False)

    def _write_rank_file(self, summary: dict[str, Any], durable: bool) -> bool:
        # Never raise from here: on_exception must not replace the run's own error with ours.
        try:
            write_json_atomic(self.rank_summary_path, summary, durable=durable)
            return True
        except (OSError, ValueError) as error:
            log.warning("nemo-throughput: could not write %s: %s", self.rank_summary_path, error)
            return False

    def _summary(self, status: str, error: str | None = None, final: bool = False) -> dict[str, Any]:
        explained = self._explain.sections(self.facts.workload.tokens_per_step, final=final and self._rank == 0)
        clock = self._time_to_target.section() if self._time_to_target is not None else None
        return build_summary(self.facts, self.stats, status, error, explained, time_to_target=clock)

    def _with_end(self, summary: dict[str, Any], missing: str | None) -> dict[str, Any]:
        """Add how the run ended: which rank wrote it, the signal, what the summary lacks."""
        received = self._sigterm is not None and self._sigterm.received
        summary["end"] = {"rank": self._rank, "signal": "SIGTERM" if received else None,
                          "all_steps_exchanged": missing is None, "missing": missing}
        return summary

    def _update_summary(self) -> None:
        """Rewrite the running summary, in the background (rank 0); _finish writes the final one.
        Every rank keeps it, consistent as of this log step, for the SIGTERM watch to write."""
        summary = self._summary("running")
        self._snapshot = (self._absorbed_through(), summary)
        if self._rank == 0:
            self._summary_file.update(summary)


def describe_run(config: ThroughputConfig, trainer: Any, pl_module: Any,
                 rank_records: list[dict[str, Any]] | None = None) -> RunFacts:
    """Resolve model shape, batch and hardware: explicit settings first, then the model's config.
    ``rank_records``: every rank's :func:`environment.rank_record` (default: this rank's alone)."""
    rank_records = rank_records or [environment.rank_record()]
    module = read_module(pl_module, getattr(trainer, "datamodule", None))
    shape = _shape_fields(config, module)
    spec = _model_spec(config, shape, module.source)
    rate = _primary_rate(config, shape.get("seq_length"))
    world_size = trainer.world_size
    model_parallel = 1
    for name in ("tensor", "pipeline", "context"):
        model_parallel *= module.parallel.get(name, 1)
    if world_size % model_parallel:
        raise ValueError(f"World size {world_size} is not a multiple of tensor x pipeline x context "
                         f"parallel size {model_parallel} read from the model config.")
    data_parallel = world_size // model_parallel

    micro_batch_size = config.micro_batch_size or module.micro_batch_size
    global_batch_size = config.global_batch_size or module.global_batch_size
    if global_batch_size is None and micro_batch_size is not None:
        global_batch_size = micro_batch_size * trainer.accumulate_grad_batches * data_parallel
    if global_batch_size is None:
        raise ValueError(
            "nemo-throughput cannot tell the global batch size (samples per optimizer step) from this "
            "model: pass global_batch_size=... or micro_batch_size=... to ThroughputCallback "
            "(callbacks.throughput.global_batch_size=... with Hydra)."
        )

    device = trainer.strategy.root_device
    gpu_name = device_name(device)
    dtype = config.dtype or dtype_for_precision(trainer.precision, fp8=module.fp8)
    if config.peak_tflops is not None:
        peak, peak_source = config.peak_tflops, "user"
    else:
        peak = peak_tflops(gpu_name, dtype) if dtype else None
        peak_source = f"table:{identify(gpu_name).name}" if peak is not None else None

    orchestrator = environment.detect_orchestrator()
    model_name = config.model_name or (spec.default_name() if spec else None)
    if model_name is None:
        raise ValueError("nemo-throughput cannot name the model: its FLOPs are given or measured and its shape is "
                         "not known, so no parameter count to name it after. Pass model_name=... "
                         "(callbacks.throughput.model_name=... with Hydra).")
    started = datetime.now(timezone.utc)
    return RunFacts(
        name=config.run_name or f"{model_name}_{trainer.num_nodes}n{world_size}g_{started:%Y%m%dT%H%M%SZ}",
        label=config.run_label or os.environ.get(environment.ENV_RUN_LABEL) or orchestrator,
        global_batch_size=global_batch_size,
        micro_batch_size=micro_batch_size,
        seq_length=shape.get("seq_length") or None,
        rate=rate,
        model_name=model_name,
        model_spec=spec,
        flops_formula=config.flops_formula if config.flops_per_sample is None else USER_FLOPS,
        flops_per_sample=_flops_per_sample(config, spec),
        gpu_name=gpu_name,
        num_gpus=world_size,
        num_nodes=trainer.num_nodes,
        dtype=dtype,
        peak_tflops=peak,
        peak_source=peak_source,
        parallel={"data": data_parallel, "tensor": 1, "pipeline": 1, "context": 1, **module.parallel},
        environment={**environment.capture(rank_records), "model_config_source": module.source},
        places=environment.places(rank_records),
        settings=config.to_dict(),
        started_at=started.isoformat(timespec="seconds"),
    )


def _flops_per_sample(config: ThroughputConfig, spec: ModelSpec | None) -> float | None:
    """Given (say from a published table): used as is. Measured: None until the first step is counted."""
    if config.flops_per_sample is not None:
        return float(config.flops_per_sample)
    if config.flops_formula == MEASURED:
        return None
    return model_flops_per_sample(spec, config.flops_formula)


_SHAPE_REQUIRED = ("num_layers", "hidden_size", "num_attention_heads", "seq_length", "vocab_size")


def _shape_fields(config: ThroughputConfig, module: Any) -> dict[str, Any]:
    """ModelSpec fields: the model config's, overridden by the model_spec and seq_length settings."""
    fields = {**module.spec_fields, **(config.model_spec or {})}
    if config.seq_length:
        fields["seq_length"] = config.seq_length
    return fields


def _primary_rate(config: ThroughputConfig, seq_length: int | None) -> str:
    """tokens/s where samples are sequences of a known length, else samples/s (images, ...)."""
    if config.rate == "auto":
        return "tokens" if seq_length else "samples"
    if config.rate == "tokens" and not seq_length:
        raise ValueError("rate: tokens needs the sequence length, which the model config does not give: pass "
                         "seq_length=... (callbacks.throughput.seq_length=... with Hydra), or rate: samples.")
    return config.rate


def _model_spec(config: ThroughputConfig, fields: dict[str, Any], source: str | None) -> ModelSpec | None:
    """The model shape; None only when flops_per_sample is given or measured (then nothing of it is
    needed: without a seq_length the rate is samples/s)."""
    given_flops = config.flops_per_sample is not None or config.flops_formula == MEASURED
    required = ("seq_length",) if given_flops and config.rate == "tokens" else () if given_flops else _SHAPE_REQUIRED
    missing = [name for name in required if not fields.get(name)]
    if missing:
        found = f" (read from the model's {source})" if source else ""
        raise ValueError(
            f"nemo-throughput cannot tell the model shape{found}: missing {missing}. Pass them as "
            f"ThroughputCallback(model_spec={{{', '.join(f'{n!r}: ...' for n in missing)}}}) or, with Hydra, "
            f"callbacks.throughput.model_spec.{missing[0]}=... (and seq_length=... for the sequence length)."
        )
    if given_flops and not all(fields.get(name) for name in _SHAPE_REQUIRED):
        return None
    return ModelSpec.from_dict(fields)


def _claim_output_dir_on_rank_zero(rank: int, requested: str, facts: RunFacts) -> tuple[str, str]:
    """Rank 0 makes the output directory this run's own (and probes that it can write there);
    every rank learns the outcome (one small collective), so that all fail together, not rank 0
    alone while the others wait for it. Returns (directory, run id)."""
    outcome: dict[str, Any] = {"directory": requested, "run_id": facts.run_id, "error": None}
    failure = None
    if rank == 0:
        try:
            outcome["directory"] = str(claim_output_dir(requested, facts.name, facts.run_id))
        except OutputDirError as error:
            failure, outcome["error"] = error, str(error)
    if dist.is_available() and dist.is_initialized():
        shared = [outcome]
        dist.broadcast_object_list(shared, src=0)
        outcome = shared[0]
    if failure is not None:
        raise failure
    if outcome["error"]:
        raise OutputDirError(f"{outcome['error']} (on rank 0)")
    return outcome["directory"], outcome["run_id"]


@contextlib.contextmanager
def _warnings_on_rank_zero(rank: int) -> Iterator[None]:
    """Silence set-up warnings (such as an unknown GPU peak) on all ranks but rank 0."""
    package_log = logging.getLogger("nemo_throughput")
    level = package_log.level
    if rank != 0:
        package_log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        package_log.setLevel(level)


def _gather_rank_records() -> list[dict[str, Any]]:
    """Every rank's node and communication settings, gathered once at set-up (one small collective)."""
    record = environment.rank_record()
    if not (dist.is_available() and dist.is_initialized()):
        return [record]
    records: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(records, record)
    return records


def _ranks_text(ranks: list[int], shown: int = 8) -> str:
    listed = ", ".join(map(str, ranks[:shown])) + (f" and {len(ranks) - shown} more" if len(ranks) > shown else "")
    return f"rank{'s' if len(ranks) > 1 else ''} {listed}"


def format_interval(interval: Interval, metrics: dict[str, float | None]) -> str:
    """One readable line per log interval."""
    warmup = " (profiled steps not counted)" if interval.profiled else " (warm-up)" if interval.warmup else ""
    parts = [f"step {interval.step_time_s:.4g} s (max {interval.max_step_time_s:.4g})"]
    if metrics["tokens_per_s"] is not None:
        parts += [f"{metrics['tokens_per_s']:,.0f} tok/s", f"{metrics['tokens_per_s_per_gpu']:,.0f} tok/s/GPU"]
    else:  # samples that are not token sequences
        parts.append(f"{metrics['samples_per_s']:,.4g} samples/s")
    if metrics["model_tflops_per_gpu"] is not None:
        parts.append(f"{metrics['model_tflops_per_gpu']:.4g} TFLOPS/GPU")
    parts.append(f"MFU {100 * metrics['mfu']:.1f}%" if metrics["mfu"] is not None else "MFU n/a")
    parts.append(f"slowest rank {interval.slowest_rank}")
    return f"[throughput] steps {interval.first_step}-{interval.last_step}{warmup}: " + " | ".join(parts)


def step_rows(steps: torch.Tensor, stats: RunStats, run_id: str) -> list[dict[str, Any]]:
    """Per-step JSON Lines rows: the global (slowest-rank) time and every rank's phases, and the
    run's id (so that rows of two runs can never be taken for one)."""
    per_rank = [step_times(steps, rank) for rank in range(steps.shape[0])]
    return [{
        "step": ranks[0].step,
        "run_id": run_id,
        "warmup": stats.is_warmup(ranks[0].step),
        "profiled": stats.is_excluded(ranks[0].step),
        "step_time_s": max(r.step_s for r in ranks),
        "ranks": [{name: getattr(r, name) for name in StepTimes.VALUES} for r in ranks],
    } for ranks in zip(*per_rank, strict=True)]
