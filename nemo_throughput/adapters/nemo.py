"""NeMo adapter: read model shape, batch and parallel layout from the config objects a model
already carries (NeMo 2 / NeMo-Run get the callback from :mod:`nemo_throughput.adapters.nemo_run`).

Two sources are understood, both duck-typed so that neither NeMo nor megatron-core is imported:

* NeMo 1.x Megatron models: ``pl_module.cfg`` holds the ``model:`` section of the Hydra config
  (``encoder_seq_length``, ``activation``, ``global_batch_size``, parallel sizes, ``fp8``) and
  ``pl_module.padded_vocab_size`` the padded vocabulary.
* NeMo 2 / megatron-core models: ``pl_module.config`` is a ``TransformerConfig`` (NeMo 2's
  ``GPTConfig`` adds ``seq_length`` and ``vocab_size``); the batch lives on the data module.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from nemo_throughput.batches import PACKED
from nemo_throughput.megatron_config import (
    formula_gaps,
    get,
    high_precision_layers,
    low_precision,
    padded_vocab_size,
    parallel_sizes,
    shape_fields,
)

_GATED_ACTIVATIONS = ("swiglu", "fast-swiglu", "geglu", "fast-geglu", "reglu", "fast-reglu")


@dataclass
class ModuleFacts:
    """What a LightningModule's own config says; every field may be missing."""

    source: str | None = None  # "nemo1 cfg", "megatron config" or None
    spec_fields: dict[str, Any] = field(default_factory=dict)  # ModelSpec fields (seq_length: the data's)
    global_batch_size: int | None = None
    micro_batch_size: int | None = None
    parallel: dict[str, int] = field(default_factory=dict)  # tensor/pipeline/context/virtual_pipeline
    low_precision: str | None = None  # "fp8" or "fp4" when the GEMMs run in it
    high_precision_layers: int | None = None  # layers such a run keeps in bf16, where the config says
    batch_layout: str | None = None  # "packed" when the data module packs sequences (NeMo 2 packed SFT)
    formula_gaps: list[str] = field(default_factory=list)  # what the model has that ModelSpec cannot describe
    rampup_batch_size: Any = None  # Megatron's batch-size ramp, [start, increment, samples], as the config says


def read_module(pl_module: Any, datamodule: Any = None) -> ModuleFacts:
    cfg = getattr(pl_module, "cfg", None)
    if get(cfg, "num_layers") is not None and get(cfg, "hidden_size") is not None:
        return _from_nemo1_cfg(cfg, pl_module)
    config = getattr(pl_module, "config", None)
    if get(config, "num_layers") is not None and get(config, "hidden_size") is not None:
        return _from_megatron_config(config, pl_module, datamodule)
    return ModuleFacts()


def _from_nemo1_cfg(cfg: Any, pl_module: Any) -> ModuleFacts:
    spec = shape_fields(cfg)
    spec["gated_linear_unit"] = str(get(cfg, "activation") or "").lower() in _GATED_ACTIVATIONS
    seq_length = get(cfg, "encoder_seq_length") or get(cfg, "seq_length")
    if seq_length:
        spec["seq_length"] = seq_length
    vocab = getattr(pl_module, "padded_vocab_size", None) or get(cfg, "padded_vocab_size")
    if vocab:
        spec["vocab_size"] = vocab
    return ModuleFacts(
        source="nemo1 cfg",
        spec_fields=spec,
        global_batch_size=get(cfg, "global_batch_size"),
        micro_batch_size=get(cfg, "micro_batch_size"),
        parallel=parallel_sizes(cfg),
        low_precision="fp8" if _flag(cfg, "fp8") else None,
        formula_gaps=formula_gaps(cfg),
        rampup_batch_size=get(cfg, "rampup_batch_size"),
    )


def _from_megatron_config(config: Any, pl_module: Any, datamodule: Any) -> ModuleFacts:
    spec = shape_fields(config)
    spec["gated_linear_unit"] = _flag(config, "gated_linear_unit")
    parallel = parallel_sizes(config)
    # A packed data module trains packs of packed_sequence_size token slots, which may be longer than
    # its seq_length (NeMo builds the packed dataset at the pack size).
    packed_size = get(datamodule, "packed_sequence_size") or 0
    seq_length = packed_size if packed_size > 0 else get(datamodule, "seq_length") or get(config, "seq_length")
    if seq_length:
        spec["seq_length"] = seq_length
    # As NeMo 2's GPTConfig does: a preset vocab_size is used as is, else the tokenizer's is padded.
    vocab = getattr(pl_module, "padded_vocab_size", None) or get(config, "vocab_size")
    tokenizer = getattr(pl_module, "tokenizer", None) or get(datamodule, "tokenizer")
    if not vocab and get(tokenizer, "vocab_size"):
        divisible_by = get(config, "make_vocab_size_divisible_by") or 128
        vocab = padded_vocab_size(get(tokenizer, "vocab_size"), divisible_by, parallel.get("tensor", 1))
    if vocab:
        spec["vocab_size"] = vocab
    return ModuleFacts(
        source="megatron config",
        spec_fields=spec,
        global_batch_size=get(datamodule, "global_batch_size"),
        micro_batch_size=get(datamodule, "micro_batch_size"),
        parallel=parallel,
        low_precision=low_precision(config),
        high_precision_layers=high_precision_layers(config),
        batch_layout=PACKED if packed_size > 0 else None,
        formula_gaps=formula_gaps(config),
        # NeMo 2: on the data module (fine-tuning) or its MegatronDataSampler (pre-training)
        rampup_batch_size=get(datamodule, "rampup_batch_size") or get(get(datamodule, "data_sampler"),
                                                                       "rampup_batch_size"),
    )


def _flag(obj: Any, key: str) -> bool:
    """A true/false setting; absent or null is false. A string is refused: "no" would be truthy."""
    value = get(obj, key)
    if value is None or isinstance(value, bool):
        return bool(value)
    raise ValueError(f"nemo-throughput: {key} in the model config must be true or false, got {value!r} "
                     f"({type(value).__name__}): fix it in the model config.")
