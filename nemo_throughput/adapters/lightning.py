"""The Lightning callback: Lightning's hooks -> :class:`~nemo_throughput.run.measurement.Measurement`.

``ThroughputCallback`` subclasses the ``Callback`` of both Lightning namespaces that are
installed (``lightning.pytorch`` for NeMo 2, ``pytorch_lightning`` for NeMo 1.x and older
code), since each Trainer accepts only its own namespace's callbacks. What is Lightning's stays
here: the hook signatures, reading the trainer and the module (:func:`describe_run`), the
loggers, one callback per trainer, and ``should_stop``; the measurement itself (timing, exchange,
summary, end of run) is framework-free.

Hot path (every step): one clock mark in each of four hooks, nothing read; the step number from
Lightning's own step counter (:func:`step_counter`); packed or padded batches are also counted on the
device (batches.TokenCounter).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from nemo_throughput.adapters.nemo import read_module
from nemo_throughput.config import ThroughputConfig
from nemo_throughput.hardware import dtype_for_precision
from nemo_throughput.run.measurement import Measurement, MeasurementView
from nemo_throughput.run.reporting import LogMetrics, log_metrics_to
from nemo_throughput.run_facts import RunFacts, resolve_run_facts
from nemo_throughput.summary import OutputDirError
from nemo_throughput.text import package_logger

__all__ = ["ThroughputCallback", "describe_run"]

log = package_logger(__name__)

CHECKPOINT_KEY = "nemo_throughput"  # our state in a Lightning checkpoint: which run and segment saved it
STEP_COUNTER_CHECK_EVERY = 64  # batches: how often the step counter read on the hot path is checked against global_step


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


class ThroughputCallback(MeasurementView, *_callback_bases()):
    """Times every optimizer step and reports tokens/s, MFU and stragglers across ranks.

    Keyword arguments are the fields of :class:`~nemo_throughput.config.ThroughputConfig`.
    """

    def __init__(self, **settings: Any) -> None:
        self.measurement = Measurement(ThroughputConfig.from_mapping(settings))
        self.from_hydra_config = False  # set by the `+callbacks=throughput` factory
        self._read_metrics: Callable[[], Mapping[str, Any]] | None = None  # the trainer's, made at set-up
        self._batch_unseen = True  # the first training batch of a fit is looked at once
        self._step_counter: Any = None  # Lightning's count of optimizer steps (step_counter), from train start

    # ----------------------------------------------------------------------- set-up
    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage != "fit" or self._deduplicate(trainer):
            return
        rank = trainer.global_rank
        self._read_metrics = functools.partial(getattr, trainer, "callback_metrics")
        self._batch_unseen = True
        with self._refusal_in_one_line(rank):
            # Lightning creates the data loaders after the setup hooks: the run clock starts before.
            self.measurement.set_up(functools.partial(describe_run, self.config, trainer, pl_module),
                                    trainer.strategy.root_device, rank,
                                    default_dir=os.path.join(trainer.log_dir or os.getcwd(), "throughput"),
                                    loggers=functools.partial(_loggers, trainer))

    @contextlib.contextmanager
    def _refusal_in_one_line(self, rank: int) -> Iterator[None]:
        """A setting the run refuses (at set-up, or at train start where the steps are known)."""
        try:
            yield
        except (ValueError, OSError) as error:
            if not self.from_hydra_config:
                raise  # in code, the caller gets the exception with its message
            # From `+callbacks=throughput`: one line, as a wrong setting gets at job start (Hydra
            # would print a traceback of our set-up); SystemExit passes through Lightning's
            # handler, which ends the other ranks. Every rank meets the same error (the facts are
            # the same everywhere, the output directory's outcome is rank 0's): rank 0 says it.
            message = error.strerror if isinstance(error, OutputDirError) and error.strerror else str(error)
            line = message if message.startswith("nemo-throughput") else f"nemo-throughput: {message}"
            raise SystemExit(line if rank == 0 else 1) from error

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
        max_steps = trainer.max_steps if trainer.max_steps > 0 else None  # -1: epochs decide
        with self._refusal_in_one_line(trainer.global_rank):  # a profile window past the last step
            self.measurement.train_start(trainer.global_step, trainer.world_size, max_steps)
        self._step_counter = step_counter(trainer)

    # ----------------------------------------------------------------------- hot path
    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        # The fit's first batch gives the layout (keys and shapes); packed or padded: a few device operations.
        self.measurement.step_start(batch, first=self._batch_unseen)
        self._batch_unseen = False

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        self.measurement.before_backward()

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        self.measurement.before_optimizer()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        counter = self._step_counter
        if counter is not None and batch_idx % STEP_COUNTER_CHECK_EVERY:
            step = counter.completed
        else:
            step = self._checked_global_step(trainer)
        # A repeated global_step is a gradient-accumulation micro-batch: the measurement ignores it.
        vote = self.measurement.step_end(step, self._read_metrics)
        if vote is not None:
            self._decide_stop(trainer, vote)

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        if trainer.state.fn == "fit" and not trainer.sanity_checking:
            self.measurement.validation_start()

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        # Called as the checkpoint is assembled, before it is written: the write is the save's time.
        self.measurement.checkpoint_saving(trainer.global_step)
        # Kept in every checkpoint: the run and segment that saved it, so that a resume continues that
        # run. A key of the checkpoint's own, not a callback state_dict: Lightning refuses two callbacks
        # with state of one kind, and `+callbacks=throughput` beside an explicit callback is two until setup.
        state = self.measurement.checkpoint_state()
        if state:
            checkpoint[CHECKPOINT_KEY] = state

    def on_load_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        # Lightning restores callbacks after the setup hook and before on_train_start.
        state = checkpoint.get(CHECKPOINT_KEY)
        if isinstance(state, Mapping):
            self.measurement.checkpoint_loaded(state)

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if trainer.state.fn == "fit" and not trainer.sanity_checking:
            vote = self.measurement.validation_end(trainer.global_step, self._read_metrics)
            if vote is not None:
                self._decide_stop(trainer, vote)

    def _checked_global_step(self, trainer: Any) -> int:
        """``trainer.global_step``; where the step counter disagrees with it, the counter is dropped."""
        step = trainer.global_step
        if self._step_counter is not None and self._step_counter.completed != step:
            log.warning("nemo-throughput: Lightning's optimizer-step counter says %s, trainer.global_step %d: "
                        "reading trainer.global_step at every step from now on", self._step_counter.completed, step)
            self._step_counter = None
        return step

    @staticmethod
    def _decide_stop(trainer: Any, vote: bool) -> None:
        """A target with ``stop: true`` was checked: stop when any rank saw it reached (a collective,
        at the same points on every rank)."""
        if trainer.strategy.reduce_boolean_decision(vote, all=False):
            trainer.should_stop = True

    # ----------------------------------------------------------------------- end of run
    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        # Lightning installs its SIGTERM handler after on_fit_start; this is the first hook after.
        self.measurement.watch_sigterm()

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self.measurement.train_end(trainer.global_step)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self.measurement.exception(trainer.global_step, exception)


def step_counter(trainer: Any) -> Any | None:
    """Lightning's record of optimizer steps done, whose ``completed`` is ``trainer.global_step``
    (Lightning 2: the optimizer steps' total, of automatic or of manual optimization; NeMo's
    strategies read the same records). One attribute read on every step's end, where
    ``global_step`` makes six calls; the callback checks it against ``global_step`` every
    STEP_COUNTER_CHECK_EVERY batches. None where this Lightning keeps it elsewhere."""
    try:
        loop = trainer.fit_loop.epoch_loop
        if trainer.lightning_module.automatic_optimization:
            counter = loop.automatic_optimization.optim_progress.optimizer.step.total
        else:
            counter = loop.manual_optimization.optim_step_progress.total
        return counter if type(counter.completed) is int and counter.completed == trainer.global_step else None
    except AttributeError:
        return None


def _loggers(trainer: Any) -> list[tuple[str, LogMetrics]]:
    """The trainer's loggers (run.reporting.Loggers), each named by its class, on Lightning's own step axis."""
    return [(type(logger).__name__, functools.partial(_log_at_lightning_step, logger)) for logger in trainer.loggers]


def _log_at_lightning_step(logger: Any, metrics: dict[str, float], step: int) -> None:
    """An interval's metrics at its last step as Lightning numbers it: Lightning logs what a step logs
    at the steps done before it (``global_step`` as the step ran), one less than ours, so that our
    rows and the model's loss of the same step share a row."""
    log_metrics_to(logger, metrics, step - 1)



def describe_run(config: ThroughputConfig, trainer: Any, pl_module: Any,
                 rank_records: list[dict[str, Any]] | None = None) -> RunFacts:
    """Resolve model shape, batch and hardware: explicit settings first, then the model's config.
    ``rank_records``: every rank's :func:`environment.rank_record` (default: this rank's alone)."""
    module = read_module(pl_module, getattr(trainer, "datamodule", None))
    return resolve_run_facts(
        config, spec_fields=module.spec_fields, source=module.source, parallel=module.parallel,
        global_batch_size=module.global_batch_size, micro_batch_size=module.micro_batch_size,
        batches_per_step=trainer.accumulate_grad_batches, world_size=trainer.world_size,
        num_nodes=trainer.num_nodes, device=trainer.strategy.root_device,
        framework_dtype=dtype_for_precision(trainer.precision, low_precision=module.low_precision),
        rank_records=rank_records, formula_gaps=module.formula_gaps,
        high_precision_layers=module.high_precision_layers, batch_layout=module.batch_layout,
        rampup_batch_size=module.rampup_batch_size)
