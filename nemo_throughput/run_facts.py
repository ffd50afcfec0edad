"""A run's facts, worked out once at set-up: model shape, batch, rate, FLOPs per sample, GPU and
peak, parallel layout, environment (:class:`~nemo_throughput.summary.RunFacts`).

Explicit settings come first, then what the framework's config says (each adapter reads its own
and calls :func:`resolve_run_facts`). A fact that cannot be worked out, or that contradicts
another, stops the run at set-up with a message naming the setting that fixes it.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from nemo_throughput import environment
from nemo_throughput.config import ThroughputConfig
from nemo_throughput.flops import MEASURED, ModelSpec, model_flops_per_sample
from nemo_throughput.hardware import LOW_PRECISION, device_name, resolve_peak
from nemo_throughput.summary import USER_FLOPS, OutputDirError, RunFacts, claim_output_dir

if TYPE_CHECKING:
    import torch


def resolve_run_facts(config: ThroughputConfig, *, spec_fields: Mapping[str, Any], source: str | None,
                      parallel: Mapping[str, int], global_batch_size: int | None, micro_batch_size: int | None,
                      batches_per_step: int, world_size: int, num_nodes: int, device: torch.device,
                      framework_dtype: str | None, rank_records: list[dict[str, Any]] | None = None,
                      formula_gaps: Sequence[str] = (), high_precision_layers: int | None = None,
                      batch_layout: str | None = None) -> RunFacts:
    """Resolve model shape, batch and hardware: explicit settings first, then what the framework's
    config says (``spec_fields``: ModelSpec fields; ``parallel``: tensor/pipeline/context/...
    sizes; ``batches_per_step``: micro-batches per optimizer step on one rank, used only when the
    global batch size is not known). ``rank_records``: every rank's :func:`environment.rank_record`.
    ``formula_gaps``: what the model has that the formulas cannot describe (:func:`flops.formula_gaps`).
    ``high_precision_layers``: layers an fp8/fp4 run keeps in bf16, where the framework's config says.
    ``batch_layout``: what the framework's data config says of the batches (batches.PACKED or None),
    until a readable batch says otherwise; kept for token runs only."""
    rank_records = rank_records or [environment.rank_record()]
    shape = _shape_fields(config, spec_fields)
    spec = _model_spec(config, shape, source)
    _refuse_formula_gaps(config, formula_gaps)
    rate = _primary_rate(config, shape.get("seq_length"))
    model_parallel = 1
    for name in ("tensor", "pipeline", "context"):
        model_parallel *= parallel.get(name, 1)
    if world_size % model_parallel:
        raise ValueError(f"World size {world_size} is not a multiple of tensor x pipeline x context "
                         f"parallel size {model_parallel} read from the model config.")
    data_parallel = world_size // model_parallel

    micro_batch_size = config.micro_batch_size or micro_batch_size
    global_batch_size = config.global_batch_size or global_batch_size
    if global_batch_size is None and micro_batch_size is not None:
        global_batch_size = micro_batch_size * batches_per_step * data_parallel
    if global_batch_size is None:
        raise ValueError(
            "nemo-throughput cannot tell the global batch size (samples per optimizer step) from this "
            "model: pass global_batch_size=... or micro_batch_size=... to ThroughputCallback "
            "(callbacks.throughput.global_batch_size=... with Hydra)."
        )
    _check_batch(global_batch_size, micro_batch_size, data_parallel)

    gpu_name = device_name(device)
    dtype = config.dtype or framework_dtype
    peak, peak_source = resolve_peak(config.peak_tflops, gpu_name, dtype)

    orchestrator = environment.detect_orchestrator()
    model_name = config.model_name or (spec.default_name() if spec else None)
    if model_name is None:
        raise ValueError("nemo-throughput cannot name the model: its FLOPs are given or measured and its shape is "
                         "not known, so no parameter count to name it after. Pass model_name=... "
                         "(callbacks.throughput.model_name=... with Hydra).")
    started = datetime.now(timezone.utc)
    return RunFacts(
        name=config.run_name or f"{model_name}_{num_nodes}n{world_size}g_{started:%Y%m%dT%H%M%SZ}",
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


def _check_batch(global_batch_size: int, micro_batch_size: int | None, data_parallel: int) -> None:
    """One optimizer step trains micro_batch_size samples on each data-parallel rank at least, in
    whole micro-batches: a global batch that is not a multiple of that would make every rate wrong."""
    if micro_batch_size is None:
        return
    per_pass = micro_batch_size * data_parallel
    if global_batch_size % per_pass:
        raise ValueError(
            f"nemo-throughput: global_batch_size {global_batch_size} is not a positive multiple of micro_batch_size "
            f"{micro_batch_size} x data-parallel size {data_parallel} = {per_pass} (one micro-batch on every "
            "data-parallel rank is the least a step trains). Correct global_batch_size or micro_batch_size "
            "(callbacks.throughput.global_batch_size=... with Hydra).")


def _flops_per_sample(config: ThroughputConfig, spec: ModelSpec | None) -> float | None:
    """Given (say from a published table): used as is. Measured: None until the first step is counted."""
    if config.flops_per_sample is not None:
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


@contextlib.contextmanager
def warnings_on_rank_zero(rank: int) -> Iterator[None]:
    """Silence set-up warnings (such as an unknown GPU peak) on all ranks but rank 0."""
    package_log = logging.getLogger("nemo_throughput")
    level = package_log.level
    if rank != 0:
        package_log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        package_log.setLevel(level)


def gather_rank_records() -> list[dict[str, Any]]:
    """Every rank's node and communication settings, gathered once at set-up (one small collective)."""
    import torch.distributed as dist  # here: importing this module (the importers use its warning) loads no torch

    record = environment.rank_record()
    if not (dist.is_available() and dist.is_initialized()):
        return [record]
    records: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(records, record)
    return records


def claim_output_dir_on_rank_zero(rank: int, requested: str, facts: RunFacts) -> tuple[str, str]:
    """Rank 0 makes the output directory this run's own (and probes that it can write there);
    every rank learns the outcome (one small collective), so that all fail together, not rank 0
    alone while the others wait for it. Returns (directory, run id)."""
    import torch.distributed as dist  # here, as in gather_rank_records

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
