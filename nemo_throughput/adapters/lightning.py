"""The Lightning callback: hooks -> step timer -> cross-rank exchange -> log line, loggers, summary.

``ThroughputCallback`` subclasses the ``Callback`` of both Lightning namespaces that are
installed (``lightning.pytorch`` for NeMo 2, ``pytorch_lightning`` for NeMo 1.x and older
code), since each Trainer accepts only its own namespace's callbacks.

Hot path (every step): one clock mark in each of four hooks, nothing read. Log step (every
``log_every_n_steps``): collect the previous steps, start their all-gather, finish the one
started on the last log step, log it and rewrite the summary (rank 0).
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

import torch
import torch.distributed as dist

from nemo_throughput import environment
from nemo_throughput.adapters.nemo import read_module
from nemo_throughput.aggregation import Exchange, Gathered, Interval, RunStats, step_times
from nemo_throughput.config import ThroughputConfig
from nemo_throughput.flops import ModelSpec, model_flops_per_sample
from nemo_throughput.hardware import device_name, dtype_for_precision, identify, peak_tflops
from nemo_throughput.summary import RunFacts, SummaryFile, append_jsonl, build_summary
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
        self._in_flight: Gathered | None = None
        self._last_step = 0
        self._rank = 0
        self._done = False

    @property
    def summary_path(self) -> str | None:
        return os.path.join(self.output_dir, "summary.json") if self.output_dir else None

    # ----------------------------------------------------------------------- set-up
    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage != "fit" or self._deduplicate(trainer):
            return
        self._rank = trainer.global_rank
        with _warnings_on_rank_zero(self._rank):
            self.facts = describe_run(self.config, trainer, pl_module)
        self.output_dir = (self.config.output_dir or os.environ.get(environment.ENV_OUTPUT_DIR)
                           or os.path.join(trainer.log_dir or os.getcwd(), "throughput"))
        self._exchange = Exchange()

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
        self.stats = RunStats(trainer.world_size, self.config.warmup_steps, start_step=trainer.global_step)
        self._timer = StepTimer(clock_for(trainer.strategy.root_device))
        if self._rank == 0:
            self._summary_file = SummaryFile(self.summary_path)
        self._update_summary()
        self._timer.anchor()

    # ----------------------------------------------------------------------- hot path
    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if self._timer is not None:
            self._timer.mark(START)

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        if self._timer is not None:
            self._timer.mark(BACKWARD)

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        if self._timer is not None:
            self._timer.mark(OPTIMIZER)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        step = trainer.global_step
        if self._timer is None or step == self._last_step:
            return  # a gradient-accumulation micro-batch: the optimizer step is not over yet
        self._last_step = step
        self._timer.end_step(step)
        if step % self.config.log_every_n_steps == 0:
            # Steps up to the previous one: their marks are at least one step old.
            finished, self._in_flight = self._in_flight, self._exchange.start(self._timer.collect(step - 1))
            if finished is not None:
                self._absorb(trainer, finished.wait())
            self._update_summary()

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if self._timer is not None and trainer.state.fn == "fit" and not trainer.sanity_checking:
            self._timer.anchor()  # validation time is not part of the next training step

    # ----------------------------------------------------------------------- end of run
    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        if self._timer is None:
            return
        self._flush(trainer)
        self._finish("completed")

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        if self._timer is None or self._done:
            return
        # With several ranks a collective now could hang on a rank that is gone: keep what was
        # exchanged, losing at most the last two intervals. Alone, there is nobody to wait for.
        if self._exchange.world_size == 1:
            self._flush(trainer)
        interrupted = isinstance(exception, (KeyboardInterrupt, SystemExit))
        self._finish("interrupted" if interrupted else "failed", f"{type(exception).__name__}: {exception}")

    # ----------------------------------------------------------------------- reporting
    def _flush(self, trainer: Any) -> None:
        """Finish the exchange in flight and exchange every step not yet reported (blocking)."""
        finished, self._in_flight = self._in_flight, None
        if finished is not None:
            self._absorb(trainer, finished.wait())
        self._absorb(trainer, self._exchange.start(self._timer.collect()).wait())

    def _absorb(self, trainer: Any, steps: torch.Tensor) -> None:
        interval = self.stats.add(steps)
        if interval is None or self._rank != 0:
            return
        metrics = self.facts.workload.metrics(interval.step_time_s)
        log.info(format_interval(interval, metrics))
        logged = {f"throughput/{k}": v for k, v in metrics.items() if v is not None}
        logged["throughput/step_time_s"] = interval.step_time_s
        logged["throughput/slowest_rank"] = interval.slowest_rank
        for logger in trainer.loggers:
            logger.log_metrics(logged, step=interval.last_step)
        if self.config.per_step_jsonl:
            append_jsonl(os.path.join(self.output_dir, "steps.jsonl"), step_rows(steps, self.stats))

    def _finish(self, status: str, error: str | None = None) -> None:
        self._done = True
        if self._rank == 0:
            self._summary_file.close(build_summary(self.facts, self.stats, status, error))
            log.info("nemo-throughput: %s run summary written to %s", status, self.summary_path)

    def _update_summary(self) -> None:
        """Rewrite the running summary, in the background (rank 0); _finish writes the final one."""
        if self._rank == 0:
            self._summary_file.update(build_summary(self.facts, self.stats, "running"))


def describe_run(config: ThroughputConfig, trainer: Any, pl_module: Any) -> RunFacts:
    """Resolve model shape, batch and hardware: explicit settings first, then the model's config."""
    module = read_module(pl_module, getattr(trainer, "datamodule", None))
    spec = _model_spec(config, module)
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
    model_name = config.model_name or spec.default_name()
    started = datetime.now(timezone.utc)
    return RunFacts(
        name=config.run_name or f"{model_name}_{trainer.num_nodes}n{world_size}g_{started:%Y%m%dT%H%M%SZ}",
        label=config.run_label or os.environ.get(environment.ENV_RUN_LABEL) or orchestrator,
        global_batch_size=global_batch_size,
        micro_batch_size=micro_batch_size,
        seq_length=spec.seq_length,
        model_name=model_name,
        model_spec=spec,
        flops_formula=config.flops_formula,
        flops_per_sample=model_flops_per_sample(spec, config.flops_formula),
        gpu_name=gpu_name,
        num_gpus=world_size,
        num_nodes=trainer.num_nodes,
        dtype=dtype,
        peak_tflops=peak,
        peak_source=peak_source,
        parallel={"data": data_parallel, "tensor": 1, "pipeline": 1, "context": 1, **module.parallel},
        environment={**environment.capture(_gather_rank_records()), "model_config_source": module.source},
        settings=config.to_dict(),
        started_at=started.isoformat(timespec="seconds"),
    )


def _model_spec(config: ThroughputConfig, module: Any) -> ModelSpec:
    fields = {**module.spec_fields, **(config.model_spec or {})}
    if config.seq_length:
        fields["seq_length"] = config.seq_length
    required = ("num_layers", "hidden_size", "num_attention_heads", "seq_length", "vocab_size")
    missing = [name for name in required if not fields.get(name)]
    if missing:
        found = f" (read from the model's {module.source})" if module.source else ""
        raise ValueError(
            f"nemo-throughput cannot tell the model shape{found}: missing {missing}. Pass them as "
            f"ThroughputCallback(model_spec={{{', '.join(f'{n!r}: ...' for n in missing)}}}) or, with Hydra, "
            f"callbacks.throughput.model_spec.{missing[0]}=... (and seq_length=... for the sequence length)."
        )
    return ModelSpec.from_dict(fields)


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


def format_interval(interval: Interval, metrics: dict[str, float | None]) -> str:
    """One readable line per log interval."""
    warmup = " (warm-up)" if interval.warmup else ""
    parts = [
        f"step {interval.step_time_s:.4g} s (max {interval.max_step_time_s:.4g})",
        f"{metrics['tokens_per_s']:,.0f} tok/s",
        f"{metrics['tokens_per_s_per_gpu']:,.0f} tok/s/GPU",
    ]
    if metrics["model_tflops_per_gpu"] is not None:
        parts.append(f"{metrics['model_tflops_per_gpu']:.4g} TFLOPS/GPU")
    parts.append(f"MFU {100 * metrics['mfu']:.1f}%" if metrics["mfu"] is not None else "MFU n/a")
    parts.append(f"slowest rank {interval.slowest_rank}")
    return f"[throughput] steps {interval.first_step}-{interval.last_step}{warmup}: " + " | ".join(parts)


def step_rows(steps: torch.Tensor, stats: RunStats) -> list[dict[str, Any]]:
    """Per-step JSON Lines rows: the global (slowest-rank) time and every rank's phases."""
    per_rank = [step_times(steps, rank) for rank in range(steps.shape[0])]
    return [{
        "step": ranks[0].step,
        "warmup": stats.is_warmup(ranks[0].step),
        "step_time_s": max(r.step_s for r in ranks),
        "ranks": [{name: getattr(r, name) for name in StepTimes.VALUES} for r in ranks],
    } for ranks in zip(*per_rank, strict=True)]
