"""The Megatron-Bridge callback: Bridge's training events -> :class:`~nemo_throughput.run.measurement.Measurement`.

Megatron-Bridge (NeMo Framework's LLM training since nemo_toolkit 3.0) runs its own loop, not
Lightning's; this adapter is a Bridge callback::

    from nemo_throughput import BridgeThroughputCallback
    pretrain(cfg, forward_step, callbacks=[BridgeThroughputCallback()])

Everything is read from the ``ConfigContainer`` Bridge hands every event (``context.state.cfg``):
the model shape, sequence length and parallel sizes from the model provider (``cfg.model``, a
megatron-core ``TransformerConfig``), global and micro batch sizes from ``cfg.train``, the dtype
from ``cfg.mixed_precision`` (an fp8 recipe counts as fp8), the step from ``state.train_state``.

Bridge has no event inside a step: a step is timed from the end of the previous one to
``on_train_step_end`` (one clock mark per event), with the data wait up to
``on_train_step_start``; forward/backward/optimizer phases stay null. An iteration Bridge skipped
(``skipped_iter``: no optimizer update) is timed and exchanged like any step but left out of the
statistics, counted in the summary's ``timing.skipped_steps`` and marked in steps.jsonl.

The loggers' metrics (progress.LOGGED_METRICS) go to the writers Bridge's ``GlobalState`` holds
(TensorBoard, Weights & Biases, MLflow, Comet: each None unless configured), on the rank they live
on (the last), at our log steps.

Nothing of Bridge is imported: Bridge's ``CallbackManager.add`` registers any object's methods
named after its events, so importing this module needs neither Bridge nor its heavy dependencies
(transformers, diffusers, ...), which ``import megatron.bridge`` pulls in.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist

from nemo_throughput import distributed
from nemo_throughput.batches import PACKED
from nemo_throughput.config import ThroughputConfig
from nemo_throughput.flops import MEASURED
from nemo_throughput.hardware import dtype_for_precision
from nemo_throughput.run.measurement import Measurement, MeasurementView
from nemo_throughput.run.reporting import LogMetrics, log_metrics_to
from nemo_throughput.megatron_config import (
    formula_gaps,
    high_precision_layers,
    padded_vocab_size,
    parallel_sizes,
    shape_fields,
)
from nemo_throughput.run_facts import RunFacts, resolve_run_facts
from nemo_throughput.text import package_logger

__all__ = ["BridgeThroughputCallback", "describe_bridge_run"]

log = package_logger(__name__)

CONFIG_SOURCE = "megatron-bridge ConfigContainer"
CallbackContext = Any  # megatron.bridge.training.callbacks.CallbackContext (state, loss_dict, ...)


class BridgeThroughputCallback(MeasurementView):
    """Times every Megatron-Bridge training step and reports tokens/s, MFU and stragglers across ranks.

    Keyword arguments are the fields of :class:`~nemo_throughput.config.ThroughputConfig`. A
    ``target`` reads its metric from the step's ``loss_dict`` (log steps) and the evaluation's
    ``total_loss_dict`` (e.g. ``"lm loss"``). With ``stop: true``, training ends once any rank saw
    the target reached: ``cfg.train.train_iters`` is lowered to the steps done, the end condition
    Bridge's loop checks before every step, so the run ends as a normal one (final checkpoint,
    ``on_train_end``).
    """

    def __init__(self, **settings: Any) -> None:
        config = ThroughputConfig.from_mapping(settings)
        if config.flops_formula == MEASURED and config.flops_per_sample is None:
            # Bridge has no event before backward (the count could not be split) and its Transformer
            # Engine kernels are invisible to torch's FLOP counter.
            raise ValueError("flops_formula: measured is not available under Megatron-Bridge; keep a formula "
                             "(the default reads the model from the ConfigContainer) or pass flops_per_sample=...")
        self.measurement = Measurement(config)
        self._counts_packs = False  # packed sequences: counted from Bridge's accumulators
        self._state: Any = None  # Bridge's GlobalState, for its writers
        self._wandb_axis = False  # our metrics' step axis declared to W&B

    # ----------------------------------------------------------------------- events
    def on_train_start(self, context: CallbackContext) -> None:
        self._state = context.state
        if not self.measurement.is_set_up:
            self._set_up(context.state.cfg)
        self.measurement.train_start(context.state.train_state.step, distributed.world_size(),
                                     max_steps=getattr(context.state.cfg.train, "train_iters", None))
        # Bridge's own SIGTERM handler (train.exit_signal_handler) is installed by now.
        self.measurement.watch_sigterm()

    def on_train_step_start(self, context: CallbackContext) -> None:
        self.measurement.step_start()

    def on_train_step_end(self, context: CallbackContext) -> None:
        step = context.state.train_state.step + 1  # Bridge counts the step after this event
        if self._counts_packs:
            self._count_packs(context.state)
        vote = self.measurement.step_end(step, lambda: _losses(context.loss_dict), skipped=bool(context.skipped_iter))
        _stop_if_any_rank_votes(context.state.cfg.train, vote, step)

    def on_eval_start(self, context: CallbackContext) -> None:
        self.measurement.validation_start()

    def on_checkpoint_save(self, context: CallbackContext) -> None:
        # Fired once the checkpoint is saved (an asynchronous save: once finalized).
        self.measurement.checkpoint_saved(context.state.train_state.step)

    def on_eval_end(self, context: CallbackContext) -> None:
        steps_done = context.state.train_state.step
        vote = self.measurement.validation_end(steps_done, lambda: _losses(context.total_loss_dict))
        _stop_if_any_rank_votes(context.state.cfg.train, vote, steps_done)

    def on_train_end(self, context: CallbackContext) -> None:
        self.measurement.train_end(context.state.train_state.step)

    def _set_up(self, cfg: Any) -> None:
        facts = self.measurement.set_up(functools.partial(describe_bridge_run, self.config, cfg, _device()),
                                        _device(), distributed.rank(), os.path.join(os.getcwd(), "throughput"),
                                        loggers=self._bridge_writers, log_rank=distributed.world_size() - 1)
        # Bridge hands callbacks no batch: the dataset config's word stands, and the step's own FLOPs
        # accumulators count its packed sequences.
        self._counts_packs = facts.batch_layout == PACKED

    def _bridge_writers(self) -> list[tuple[str, LogMetrics]]:
        """Each writer Bridge configured (on the last rank; run.reporting.Loggers), named by its
        GlobalState attribute; each gets one interval's metrics at the interval's last step."""
        state, writers = self._state, []
        if (tensorboard := getattr(state, "tensorboard_logger", None)) is not None:
            writers.append(("tensorboard_logger", functools.partial(_to_tensorboard, tensorboard)))
        if getattr(state, "wandb_logger", None) is not None:
            writers.append(("wandb_logger", self._to_wandb))
        for name in ("mlflow_logger", "comet_logger"):  # both: log_metrics(dict, step=...)
            if (logger := getattr(state, name, None)) is not None:
                writers.append((name, functools.partial(log_metrics_to, logger)))
        return writers

    def _to_wandb(self, metrics: dict[str, float], step: int) -> None:
        """W&B takes no step behind its latest row (Bridge logs its iterations): the metrics complete the
        row in progress, charted against their own step axis (``throughput/step``); we log at most once
        per iteration, so W&B's row never runs ahead of Bridge's next one."""
        wandb = self._state.wandb_logger
        if not self._wandb_axis:
            wandb.define_metric(WANDB_STEP)
            wandb.define_metric("throughput/*", step_metric=WANDB_STEP)
            self._wandb_axis = True
        wandb.log({**metrics, WANDB_STEP: step})

    def _count_packs(self, state: Any) -> None:
        """The step's token slots and sum of squared sequence lengths, as Bridge's forward step
        accumulated them on this rank (``GlobalState._flops_seqlen_sum``, ``_flops_seqlen_sq_sum``:
        ints, or device tensors read later without waiting). A rank that saw no tokens (a middle
        pipeline stage) counts nothing."""
        slots, seqlen_sq = (getattr(state, name, None) for name in BRIDGE_ACCUMULATORS)
        if slots is None or seqlen_sq is None:
            self._counts_packs = False
            self.measurement.not_counted("this Megatron-Bridge keeps no FLOPs accumulators of sequence lengths "
                                         f"({', '.join(BRIDGE_ACCUMULATORS)} on GlobalState)")
        elif not (isinstance(slots, int) and slots == 0):
            self.measurement.count_accumulated(slots, seqlen_sq, source="megatron-bridge")


ThroughputCallback = BridgeThroughputCallback  # the name this module first gave it
WANDB_STEP = "throughput/step"  # the W&B step axis of our metrics: the interval's last step
# Bridge's per-step FLOPs accumulators (reset before each step, filled by its forward step): token
# slots (padding included) and, for packed sequences, the sum of their squared lengths.
BRIDGE_ACCUMULATORS = ("_flops_seqlen_sum", "_flops_seqlen_sq_sum")


def describe_bridge_run(config: ThroughputConfig, cfg: Any, device: torch.device,
                        rank_records: list[dict[str, Any]]) -> RunFacts:
    """The run's facts from a Bridge ``ConfigContainer``: settings first, then ``cfg.model``,
    ``cfg.train`` and ``cfg.mixed_precision``."""
    model = cfg.model
    parallel = parallel_sizes(model)
    hosts = {record["node"] for record in rank_records}
    return resolve_run_facts(
        config, spec_fields=model_spec_fields(model, _dataset_seq_length(cfg)), source=CONFIG_SOURCE,
        parallel=parallel, global_batch_size=getattr(cfg.train, "global_batch_size", None),
        micro_batch_size=getattr(cfg.train, "micro_batch_size", None), batches_per_step=1,
        world_size=len(rank_records), num_nodes=len(hosts), device=device,
        framework_dtype=bridge_dtype(cfg), rank_records=rank_records, formula_gaps=formula_gaps(model),
        high_precision_layers=high_precision_layers(model), batch_layout=bridge_batch_layout(cfg),
        rampup_batch_size=getattr(cfg.train, "rampup_batch_size", None),
        decrease_batch_size_if_needed=getattr(cfg.train, "decrease_batch_size_if_needed", False) is True)


def bridge_batch_layout(cfg: Any) -> str | None:
    """PACKED when Bridge packs sequences (``cfg.dataset.enable_offline_packing``, a packed SFT file, or
    ``enable_in_batch_packing``); None when its dataset config does not say (its callbacks see no batch)."""
    dataset = getattr(cfg, "dataset", None)
    packs = getattr(dataset, "enable_offline_packing", False) or getattr(dataset, "enable_in_batch_packing", False)
    return PACKED if packs else None


def model_spec_fields(model: Any, seq_length: int | None = None) -> dict[str, Any]:
    """ModelSpec fields of a Bridge model provider. The vocabulary is the logits GEMM's: padded as
    the provider pads it when ``should_pad_vocab`` (to a multiple of ``make_vocab_size_divisible_by``
    x tensor parallel size, as the perf recipes do), else as given."""
    fields = shape_fields(model)
    fields["gated_linear_unit"] = bool(getattr(model, "gated_linear_unit", False))
    seq_length = getattr(model, "seq_length", None) or seq_length
    if seq_length:
        fields["seq_length"] = seq_length
    vocab_size = getattr(model, "vocab_size", None)
    if vocab_size and getattr(model, "should_pad_vocab", False):
        vocab_size = padded_vocab_size(vocab_size, getattr(model, "make_vocab_size_divisible_by", None) or 128,
                                       getattr(model, "tensor_model_parallel_size", None) or 1)
    if vocab_size:
        fields["vocab_size"] = vocab_size
    return fields


def bridge_dtype(cfg: Any) -> str | None:
    """The matmul dtype of a Bridge run: ``cfg.mixed_precision`` (a MixedPrecisionConfig or a recipe
    name such as "bf16_with_nvfp4_mixed"), else the model provider's flags. An fp4 (NVFP4, MXFP4) recipe
    counts as fp4, an fp8 one as fp8: MFU divides by that format's peak (hardware.precision_mix says so)."""
    precision = getattr(cfg, "mixed_precision", None)
    if isinstance(precision, str):  # a recipe name, before Bridge's config validation turns it into its config
        name = precision.lower().replace("-", "_")
        if "fp4" in name:
            return "fp4"
        if "fp8" in name:
            return "fp8"
        for prefix in ("bf16", "fp16"):
            if name.startswith(prefix) or f"_{prefix}_" in name:  # "nemotron_h_bf16_with_..."
                return prefix
        return dtype_for_precision("32")
    source = precision if precision is not None else cfg.model
    if getattr(source, "fp4", None):
        return "fp4"
    if getattr(source, "fp8", None):
        return "fp8"
    for flag, dtype in (("bf16", "bf16"), ("fp16", "fp16")):
        if getattr(source, flag, False):
            return dtype
    return dtype_for_precision("32")


def _to_tensorboard(writer: Any, metrics: dict[str, float], step: int) -> None:
    for key, value in metrics.items():
        writer.add_scalar(key, value, step)



def _dataset_seq_length(cfg: Any) -> int | None:
    return getattr(getattr(cfg, "dataset", None), "seq_length", None)


def _losses(loss_dict: Mapping[str, Any] | None) -> dict[str, float]:
    """Bridge's reduced losses as floats (read only on log steps with a target)."""
    return {name: float(value) for name, value in (loss_dict or {}).items()}


def _stop_if_any_rank_votes(train: Any, vote: bool | None, steps_done: int) -> None:
    """A target with ``stop: true`` was checked (on every rank at the same point, so the reduction
    pairs): end training after ``steps_done`` steps when any rank saw it reached (the loss lives on
    the last pipeline stage only). Bridge's loop runs while ``train_state.step < train.train_iters``."""
    if vote is None:
        return
    if distributed.is_up():
        decision = torch.tensor([int(vote)], device=_device())
        dist.all_reduce(decision, op=dist.ReduceOp.MAX)
        vote = bool(decision.item())
    if vote and steps_done < train.train_iters:
        log.info("nemo-throughput: target reached: Megatron-Bridge training stops after step %d (train.train_iters "
                 "%d lowered to %d)", steps_done, train.train_iters, steps_done)
        train.train_iters = steps_done


def _device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
