"""A run's facts: what is known before its first step (:class:`RunFacts`), worked out once at
set-up from the settings and the framework's config (:func:`resolve_run_facts`), and what the run
learns after (:class:`Learned`).

Explicit settings come first, then what the framework's config says (each adapter reads its own
and calls :func:`resolve_run_facts`). A fact that cannot be worked out, or that contradicts
another, stops the run at set-up with a message naming the setting that fixes it.
"""

from __future__ import annotations

import datetime as dt
import functools
import os
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

from nemo_throughput import environment
from nemo_throughput.config import ThroughputConfig, check_flops_settings
from nemo_throughput.flops import (FLOPS_FORMULAS, MEASURED, ModelSpec, flops_unlike_the_shape, model_flops_per_sample,
                                   require_positive_int)
from nemo_throughput.hardware import LOW_PRECISION, device_name, resolve_peak
from nemo_throughput.megatron_config import BatchRamp
from nemo_throughput.text import package_logger
from nemo_throughput.throughput import RATES, Workload

if TYPE_CHECKING:
    import torch

log = package_logger(__name__)

USER_FLOPS = "user"  # model.flops_formula when flops_per_sample was given, not computed


@dataclass(frozen=True)
class RunFacts:
    """What is known about a run before its first step; the summary adds the measurements.

    Frozen: a measured run's facts are worked out once, at set-up. What the run learns later
    (:class:`Learned`) comes back as a new RunFacts, a snapshot that one thread hands another."""

    name: str
    label: str
    global_batch_size: int | None  # None only for an imported result that does not state it
    micro_batch_size: int | None
    seq_length: int | None  # None: samples are not token sequences, the rate is samples/s
    model_name: str
    model_spec: ModelSpec | None  # None when flops_per_sample was given and the shape is unknown
    # a name of flops.FLOPS_FORMULAS, USER_FLOPS when flops_per_sample was given, None when an imported result
    # does not say
    flops_formula: str | None
    flops_per_sample: float | None  # None while a measured count is not known yet
    gpu_name: str
    num_gpus: int
    num_nodes: int
    dtype: str | None
    peak_tflops: float | None
    peak_source: str | None  # "table:<part>", "user", or None when unknown
    precision_mix: dict[str, Any] | None = None  # an fp8/fp4 run: what its MFU is relative to (run_facts.precision_mix)
    batch_layout: str | None = None  # batches.batch_layout of the first training batch; None: not seen or not readable
    batch_uncounted: str | None = None  # why packed or padded batches were not counted (batches.TokenCounter)
    # micro-batches found bad, all ranks (batches.CheckedBatches, the reporting's); None: no batch was checked
    batch_uncounted_batches: int | None = None
    # where packed or padded batches are counted from (a batch key, a framework's accumulators); None: not counted
    batch_count_source: str | None = None
    parallel: dict[str, int] = field(default_factory=dict)
    environment: dict[str, Any] = field(default_factory=dict)
    places: list[dict[str, Any]] = field(default_factory=list)  # per rank: rank, host, gpu_index
    settings: dict[str, Any] = field(default_factory=dict)
    started_at: str = field(default_factory=lambda: now_iso())
    source: str = "callback"  # or "import:<log format>"
    run_id: str = field(default_factory=lambda: new_run_id())  # unique per run, also in each steps.jsonl row
    # {"path": "steps.jsonl", "complete": bool, "error": str | None} when per-step rows are written
    steps_jsonl: dict[str, Any] | None = None
    # flops_formula "measured": this rank's counts of the counted step (MeasuredFlops.to_dict())
    measured_flops: dict[str, Any] | None = None
    rate: str = "tokens"  # the primary rate: a key of throughput.RATES
    # micro-batches per optimizer step on one rank, as the trainer accumulates them (Lightning's
    # accumulate_grad_batches; Megatron accumulates within a step and says 1); None: not known
    batches_per_step: int | None = None
    # Megatron's batch-size ramp: {"start", "increment", "samples", "steps"}; its first `steps` steps train a
    # smaller batch than global_batch_size and are warm-up; None: no ramp
    batch_ramp: dict[str, int] | None = None

    def __post_init__(self) -> None:
        """Impossible values are refused here, naming them, whoever builds the facts (callback, import)."""
        for name in ("name", "model_name"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ValueError(f"run {name} must be a non-empty string, got {getattr(self, name)!r}")
        if not isinstance(self.label, str):
            raise ValueError(f"run label must be a string, got {self.label!r} ({type(self.label).__name__})")
        for name in ("num_gpus", "num_nodes"):
            require_positive_int(name, getattr(self, name), prefix="")
        if self.num_nodes > self.num_gpus:
            raise ValueError(f"num_nodes {self.num_nodes} is more than num_gpus {self.num_gpus}: every node runs at "
                             "least one GPU; check the node and GPU counts given")
        for name in ("global_batch_size", "micro_batch_size", "seq_length"):
            if getattr(self, name) is not None:
                require_positive_int(name, getattr(self, name), prefix="")
        if self.rate not in RATES or (self.rate == "tokens" and self.seq_length is None):
            raise ValueError(f"rate must be one of {list(RATES)} (tokens only with a seq_length), got {self.rate!r}")
        if self.flops_formula not in (*FLOPS_FORMULAS, USER_FLOPS, None):
            raise ValueError(f"flops_formula must be one of {[*FLOPS_FORMULAS, USER_FLOPS, None]}, "
                             f"got {self.flops_formula!r}")
        # FLOPs given by the user are held against the tokens they cover; computed or counted ones are the model's
        check_flops_settings(self.peak_tflops, self.flops_per_sample,
                             self.seq_length if self.flops_formula == USER_FLOPS else None)

    @functools.cached_property
    def spec_dict(self) -> dict[str, Any] | None:
        return self.model_spec.to_dict() if self.model_spec is not None else None

    @property
    def ramp_steps(self) -> int:
        """Steps 1 to this train a batch-size ramp's smaller batches (0: no ramp)."""
        return self.batch_ramp["steps"] if self.batch_ramp else 0

    @property
    def workload(self) -> Workload:
        return Workload(
            global_batch_size=self.global_batch_size,
            seq_length=self.seq_length,
            num_gpus=self.num_gpus,
            flops_per_sample=self.flops_per_sample,
            peak_tflops=self.peak_tflops,
        )


@dataclass
class Learned:
    """What a measured run learns after set-up, each field None until learned: the batches' layout
    as the first one shows it, why packed or padded batches could not be counted and where they are
    counted from, a measured FLOPs count. Written on the training thread only; other threads get
    :meth:`facts`, a frozen snapshot. What the device's checks of the batches find, and any rank's
    bad micro-batches, arrive with the exchanged steps on the reporting thread, which keeps them
    itself (batches.CheckedBatches) and adds them to the facts it reports (run.reporting)."""

    batch_layout: str | None = None
    batch_uncounted: str | None = None
    batch_count_source: str | None = None
    flops_per_sample: float | None = None
    measured_flops: dict[str, Any] | None = None  # measured_flops.MeasuredFlops.to_dict()

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)
        object.__setattr__(self, "_made", None)  # something learned: the next snapshot is a new one

    def facts(self, known: RunFacts) -> RunFacts:
        """``known`` (the set-up's facts) with what has been learned so far; the same object until
        something more is learned (a log step makes no new one for nothing)."""
        made = self.__dict__.get("_made")
        if made is None or made[0] is not known:
            learned = {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}
            made = (known, replace(known, **learned) if learned else known)
            object.__setattr__(self, "_made", made)
        return made[1]


def new_run_id() -> str:
    return uuid.uuid4().hex[:12]


def now_iso() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def resolve_run_facts(config: ThroughputConfig, *, spec_fields: Mapping[str, Any], source: str | None,
                      parallel: Mapping[str, int], global_batch_size: int | None, micro_batch_size: int | None,
                      batches_per_step: int, world_size: int, num_nodes: int, device: torch.device,
                      framework_dtype: str | None, rank_records: list[dict[str, Any]] | None = None,
                      formula_gaps: Sequence[str] = (), high_precision_layers: int | None = None,
                      batch_layout: str | None = None, rampup_batch_size: Any = None,
                      decrease_batch_size_if_needed: bool = False) -> RunFacts:
    """Resolve model shape, batch and hardware: explicit settings first, then what the framework's
    config says (``spec_fields``: ModelSpec fields; ``parallel``: tensor/pipeline/context/...
    sizes; ``batches_per_step``: micro-batches per optimizer step on one rank, used only when the
    global batch size is not known). ``rank_records``: every rank's :func:`environment.rank_record`.
    ``formula_gaps``: what the model has that the formulas cannot describe (:func:`flops.formula_gaps`).
    ``high_precision_layers``: layers an fp8/fp4 run keeps in bf16, where the framework's config says.
    ``batch_layout``: what the framework's data config says of the batches (batches.PACKED or None),
    until a readable batch says otherwise; kept for token runs only. ``rampup_batch_size``: Megatron's
    batch-size ramp (megatron_config.BatchRamp), whose steps are warm-up; ``decrease_batch_size_if_needed``:
    Megatron trains the global batch rounded down to whole micro-batches on every data-parallel rank."""
    rank_records = rank_records or [environment.rank_record()]
    shape = _shape_fields(config, spec_fields)
    spec = _model_spec(config, shape, source)
    _refuse_formula_gaps(config, formula_gaps)
    rate = _primary_rate(config, shape.get("seq_length"))
    data_parallel = _data_parallel(parallel, world_size)
    micro_batch_size = config.micro_batch_size or micro_batch_size
    global_batch_size = _global_batch_size(config.global_batch_size or global_batch_size, micro_batch_size,
                                           batches_per_step, data_parallel, decrease_batch_size_if_needed)
    gpu_name = device_name(device)
    dtype = config.dtype or framework_dtype
    peak, peak_source = resolve_peak(config.peak_tflops, gpu_name, dtype)

    model_name = _model_name(config, spec)
    started = dt.datetime.now(dt.timezone.utc)
    return RunFacts(
        name=config.run_name or f"{model_name}_{num_nodes}n{world_size}g_{started:%Y%m%dT%H%M%SZ}",
        label=config.run_label or os.environ.get(environment.ENV_RUN_LABEL) or environment.detect_orchestrator(),
        global_batch_size=global_batch_size,
        micro_batch_size=micro_batch_size,
        seq_length=shape.get("seq_length") or None,
        rate=rate,
        model_name=model_name,
        model_spec=spec,
        flops_formula=config.flops_formula if config.flops_per_sample is None else USER_FLOPS,
        flops_per_sample=_flops_per_sample(config, spec, global_batch_size),
        gpu_name=gpu_name,
        num_gpus=world_size,
        num_nodes=num_nodes,
        dtype=dtype,
        peak_tflops=peak,
        peak_source=peak_source,
        precision_mix=precision_mix(dtype, high_precision_layers),
        batch_layout=batch_layout if shape.get("seq_length") else None,
        parallel={"data": data_parallel, "tensor": 1, "pipeline": 1, "context": 1, **parallel},
        environment={**environment.capture(rank_records), "model_config_source": source},
        places=environment.places(rank_records),
        settings=config.to_dict(),
        started_at=started.isoformat(timespec="seconds"),
        batches_per_step=batches_per_step,
        batch_ramp=_batch_ramp(rampup_batch_size, global_batch_size,
                               (micro_batch_size or 0) * data_parallel if decrease_batch_size_if_needed else None),
    )


def precision_mix(dtype: str | None, high_precision_layers: int | None) -> dict[str, Any] | None:
    """For an fp8/fp4 run, what its MFU is relative to: the low-precision peak, though parts of every
    step (attention's score and value matmuls, and any layers kept in bf16) run at the bf16 rate, half
    that peak or less. None for a run in one precision."""
    if dtype not in LOW_PRECISION:
        return None
    return {"mfu_relative_to": dtype, "high_precision_layers": high_precision_layers}


def mfu_above_peak_warning(facts: RunFacts, fraction: float) -> str:
    """Why an MFU above 100 % cannot be: the peak it is divided by, or the FLOPs it counts."""
    if facts.flops_formula == USER_FLOPS:
        flops = f"the flops_per_sample given ({facts.flops_per_sample:.4g}: per sample, not per batch?)"
    else:
        flops = (f"the {facts.flops_formula!r} FLOPs model ({facts.flops_per_sample:.4g} per sample: "
                 "is the model shape read right?)")
    return (f"nemo-throughput: MFU computes to {100 * fraction:.0f}%, above the GPU's peak, which no run reaches: "
            f"the peak of {facts.peak_tflops:g} TFLOPS per GPU ({facts.peak_source}, dtype {facts.dtype}: an fp8 "
            f"run needs dtype fp8; peak_tflops is per GPU, not per node) or {flops} is wrong. MFU is reported as "
            "null; throughput.mfu_above_peak keeps the figure.")


def _data_parallel(parallel: Mapping[str, int], world_size: int) -> int:
    """The data-parallel size: the world over tensor x pipeline x context parallel sizes."""
    model_parallel = 1
    for name in ("tensor", "pipeline", "context"):
        model_parallel *= parallel.get(name, 1)
    if world_size % model_parallel:
        raise ValueError(f"World size {world_size} is not a multiple of tensor x pipeline x context "
                         f"parallel size {model_parallel} read from the model config.")
    return world_size // model_parallel


def _global_batch_size(global_batch_size: int | None, micro_batch_size: int | None, batches_per_step: int,
                       data_parallel: int, decrease_if_needed: bool = False) -> int:
    """Samples per optimizer step, as given or from the micro-batches (refused where they disagree).
    One optimizer step trains micro_batch_size samples on each data-parallel rank at least, in whole
    micro-batches: a global batch that is not a multiple of that would make every rate wrong, unless
    Megatron rounds it down to one (``decrease_if_needed``: that is the batch trained)."""
    if global_batch_size is None and micro_batch_size is not None:
        global_batch_size = micro_batch_size * batches_per_step * data_parallel
    if global_batch_size is None:
        raise ValueError(
            "nemo-throughput cannot tell the global batch size (samples per optimizer step) from this "
            "model: pass global_batch_size=... or micro_batch_size=... to ThroughputCallback "
            "(callbacks.throughput.global_batch_size=... with Hydra).")
    if micro_batch_size is None:
        return global_batch_size
    per_pass = micro_batch_size * data_parallel
    if decrease_if_needed and global_batch_size >= per_pass:
        return global_batch_size // per_pass * per_pass
    if global_batch_size % per_pass:
        raise ValueError(
            f"nemo-throughput: global_batch_size {global_batch_size} is not a positive multiple of micro_batch_size "
            f"{micro_batch_size} x data-parallel size {data_parallel} = {per_pass} (one micro-batch on every "
            "data-parallel rank is the least a step trains). Correct global_batch_size or micro_batch_size "
            "(callbacks.throughput.global_batch_size=... with Hydra).")
    return global_batch_size


def _batch_ramp(rampup_batch_size: Any, global_batch_size: int, per_pass: int | None) -> dict[str, int] | None:
    """RunFacts.batch_ramp: the config's ramp and how many steps it trains below the global batch
    (``per_pass``: micro-batch x data-parallel size, where Megatron rounds each batch down to it)."""
    ramp = BatchRamp.from_config(rampup_batch_size, global_batch_size)
    return {**asdict(ramp), "steps": ramp.steps_below(global_batch_size, per_pass)} if ramp else None


def _model_name(config: ThroughputConfig, spec: ModelSpec | None) -> str:
    model_name = config.model_name or (spec.default_name() if spec else None)
    if model_name is None:
        raise ValueError("nemo-throughput cannot name the model: its FLOPs are given or measured and its shape is "
                         "not known, so no parameter count to name it after. Pass model_name=... "
                         "(callbacks.throughput.model_name=... with Hydra).")
    return model_name


def _flops_per_sample(config: ThroughputConfig, spec: ModelSpec | None, global_batch_size: int) -> float | None:
    """Given (say from a published table): used as is, said where the model's shape counts far other.
    Measured: None until the first step is counted."""
    if config.flops_per_sample is not None:
        unlike = flops_unlike_the_shape(config.flops_per_sample, spec, global_batch_size) if spec else None
        if unlike:
            log.warning("nemo-throughput: %s", unlike)
        return float(config.flops_per_sample)
    if config.flops_formula == MEASURED:
        return None
    return model_flops_per_sample(spec, config.flops_formula)


_SHAPE_REQUIRED = ("num_layers", "hidden_size", "num_attention_heads", "seq_length", "vocab_size")


def _shape_fields(config: ThroughputConfig, spec_fields: Mapping[str, Any]) -> dict[str, Any]:
    """ModelSpec fields: the model config's, overridden by the model_spec and seq_length settings."""
    fields = {**spec_fields, **(config.model_spec or {})}
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


def _refuse_formula_gaps(config: ThroughputConfig, gaps: Sequence[str]) -> None:
    """FLOPs from a formula that cannot describe the model would give a silently wrong MFU."""
    if gaps and config.flops_per_sample is None and config.flops_formula != MEASURED:
        raise ValueError(
            f"nemo-throughput: the model uses {' and '.join(gaps)}, which the {config.flops_formula!r} FLOPs "
            "formula does not describe, so its MFU would be wrong. Give the model's FLOPs per sample "
            "(flops_per_sample=..., e.g. the figure Megatron-Bridge prints) or count them "
            "(flops_formula: measured, Lightning only).")


def _model_spec(config: ThroughputConfig, shape: dict[str, Any], source: str | None) -> ModelSpec | None:
    """The model shape; None only when flops_per_sample is given or measured (then nothing of it is
    needed: without a seq_length the rate is samples/s)."""
    given_flops = config.flops_per_sample is not None or config.flops_formula == MEASURED
    required = ("seq_length",) if given_flops and config.rate == "tokens" else () if given_flops else _SHAPE_REQUIRED
    missing = [name for name in required if not shape.get(name)]
    if missing:
        found = f" (read from the model's {source})" if source else ""
        raise ValueError(
            f"nemo-throughput cannot tell the model shape{found}: missing {missing}. Pass them as "
            f"ThroughputCallback(model_spec={{{', '.join(f'{n!r}: ...' for n in missing)}}}) or, with Hydra, "
            f"callbacks.throughput.model_spec.{missing[0]}=... (and seq_length=... for the sequence length)."
        )
    if given_flops and not all(shape.get(name) for name in _SHAPE_REQUIRED):
        return None
    return ModelSpec.from_dict(shape)
