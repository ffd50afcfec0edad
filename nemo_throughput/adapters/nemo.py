"""NeMo adapter: read model shape, batch and parallel layout from the config objects a model
already carries, and hand NeMo 2 / NeMo-Run the callback as a ``run.Config`` (:func:`nemo_callback`).

Two sources are understood, both duck-typed so that neither NeMo nor megatron-core is imported:

* NeMo 1.x Megatron models: ``pl_module.cfg`` holds the ``model:`` section of the Hydra config
  (``encoder_seq_length``, ``activation``, ``global_batch_size``, parallel sizes, ``fp8``) and
  ``pl_module.padded_vocab_size`` the padded vocabulary.
* NeMo 2 / megatron-core models: ``pl_module.config`` is a ``TransformerConfig`` (NeMo 2's
  ``GPTConfig`` adds ``seq_length`` and ``vocab_size``); the batch lives on the data module.
"""

from __future__ import annotations

import dataclasses
import inspect
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from nemo_throughput.config import ThroughputConfig
from nemo_throughput.flops import formula_gaps

_GATED_ACTIVATIONS = ("swiglu", "fast-swiglu", "geglu", "fast-geglu", "reglu", "fast-reglu")
_FP8_RECIPES = ("e4m3", "hybrid")
_SHAPE_KEYS = ("num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size", "num_query_groups",
               "kv_channels", "num_moe_experts", "moe_router_topk", "moe_ffn_hidden_size",
               "moe_shared_expert_intermediate_size", "moe_layer_freq")
_PARALLEL_KEYS = {
    "tensor": "tensor_model_parallel_size",
    "pipeline": "pipeline_model_parallel_size",
    "context": "context_parallel_size",
    "virtual_pipeline": "virtual_pipeline_model_parallel_size",
    "expert": "expert_model_parallel_size",
}


@dataclass
class ModuleFacts:
    """What a LightningModule's own config says; every field may be missing."""

    source: str | None = None  # "nemo1 cfg", "megatron config" or None
    spec_fields: dict[str, Any] = field(default_factory=dict)  # ModelSpec fields (seq_length: the data's)
    global_batch_size: int | None = None
    micro_batch_size: int | None = None
    parallel: dict[str, int] = field(default_factory=dict)  # tensor/pipeline/context/virtual_pipeline
    fp8: bool = False
    formula_gaps: list[str] = field(default_factory=list)  # what the model has that ModelSpec cannot describe


def read_module(pl_module: Any, datamodule: Any = None) -> ModuleFacts:
    cfg = getattr(pl_module, "cfg", None)
    if _get(cfg, "num_layers") is not None and _get(cfg, "hidden_size") is not None:
        return _from_nemo1_cfg(cfg, pl_module)
    config = getattr(pl_module, "config", None)
    if _get(config, "num_layers") is not None and _get(config, "hidden_size") is not None:
        return _from_megatron_config(config, pl_module, datamodule)
    return ModuleFacts()


def padded_vocab_size(vocab_size: int, divisible_by: int = 128, tensor_parallel: int = 1) -> int:
    """Megatron's vocabulary padding: up to a multiple of ``divisible_by * tensor_parallel``."""
    multiple = divisible_by * tensor_parallel
    return -(-vocab_size // multiple) * multiple


def _from_nemo1_cfg(cfg: Any, pl_module: Any) -> ModuleFacts:
    spec = _shape(cfg)
    spec["gated_linear_unit"] = str(_get(cfg, "activation") or "").lower() in _GATED_ACTIVATIONS
    seq_length = _get(cfg, "encoder_seq_length") or _get(cfg, "seq_length")
    if seq_length:
        spec["seq_length"] = seq_length
    vocab = getattr(pl_module, "padded_vocab_size", None) or _get(cfg, "padded_vocab_size")
    if vocab:
        spec["vocab_size"] = vocab
    return ModuleFacts(
        source="nemo1 cfg",
        spec_fields=spec,
        global_batch_size=_get(cfg, "global_batch_size"),
        micro_batch_size=_get(cfg, "micro_batch_size"),
        parallel=_parallel(cfg),
        fp8=_flag(cfg, "fp8"),
    )


def _from_megatron_config(config: Any, pl_module: Any, datamodule: Any) -> ModuleFacts:
    spec = _shape(config)
    spec["gated_linear_unit"] = _flag(config, "gated_linear_unit")
    parallel = _parallel(config)
    seq_length = _get(datamodule, "seq_length") or _get(config, "seq_length")
    if seq_length:
        spec["seq_length"] = seq_length
    # As NeMo 2's GPTConfig does: a preset vocab_size is used as is, else the tokenizer's is padded.
    vocab = getattr(pl_module, "padded_vocab_size", None) or _get(config, "vocab_size")
    tokenizer = getattr(pl_module, "tokenizer", None) or _get(datamodule, "tokenizer")
    if not vocab and _get(tokenizer, "vocab_size"):
        divisible_by = _get(config, "make_vocab_size_divisible_by") or 128
        vocab = padded_vocab_size(_get(tokenizer, "vocab_size"), divisible_by, parallel.get("tensor", 1))
    if vocab:
        spec["vocab_size"] = vocab
    return ModuleFacts(
        source="megatron config",
        spec_fields=spec,
        global_batch_size=_get(datamodule, "global_batch_size"),
        micro_batch_size=_get(datamodule, "micro_batch_size"),
        parallel=parallel,
        fp8=_megatron_fp8(config),
        formula_gaps=formula_gaps(config),
    )



def _flag(obj: Any, key: str) -> bool:
    """A true/false setting; absent or null is false. A string is refused: "no" would be truthy."""
    value = _get(obj, key)
    if value is None or isinstance(value, bool):
        return bool(value)
    raise ValueError(f"nemo-throughput: {key} in the model config must be true or false, got {value!r} "
                     f"({type(value).__name__}): fix it in the model config.")


def _megatron_fp8(config: Any) -> bool:
    """megatron-core's ``fp8`` is None (off) or a recipe name ("e4m3", "hybrid"); a bool is read as is."""
    value = _get(config, "fp8")
    if value is None or isinstance(value, bool):
        return bool(value)
    if isinstance(value, str) and value.lower() in _FP8_RECIPES:
        return True
    raise ValueError(f"nemo-throughput: fp8 in the model config must be null, true/false or one of "
                     f"{list(_FP8_RECIPES)}, got {value!r}: fix it in the model config.")


def _shape(obj: Any) -> dict[str, Any]:
    values = {key: _get(obj, key) for key in _SHAPE_KEYS}
    if isinstance(values["moe_layer_freq"], Sequence) and not isinstance(values["moe_layer_freq"], str):
        values["moe_layer_freq"] = tuple(values["moe_layer_freq"])
    return {key: value for key, value in values.items() if value is not None}


def _parallel(obj: Any) -> dict[str, int]:
    values = {name: _get(obj, key) for name, key in _PARALLEL_KEYS.items()}
    return {name: int(value) for name, value in values.items() if value}


def _get(obj: Any, key: str) -> Any:
    """Attribute or mapping item (dataclass, DictConfig, dict); None when absent."""
    if obj is None:
        return None
    if isinstance(obj, Mapping):
        return obj.get(key)
    try:
        return getattr(obj, key, None)
    except Exception:  # noqa: BLE001 - DictConfig raises on missing keys in struct mode
        return None


def nemo_callback(**settings: Any) -> Any:
    """``run.Config(ThroughputCallback, ...)`` for NeMo 2 recipes and the NeMo-Run CLI.

    Python: ``recipe.trainer.callbacks.append(nemo_callback(log_every_n_steps=20))``.
    CLI: ``nemo llm pretrain --factory llama3_8b 'trainer.callbacks+=[nemo_throughput.nemo_callback()]'``.
    Keyword arguments are ThroughputConfig's fields; a misspelt one fails here, before submission.
    """
    ThroughputConfig.from_mapping(settings)  # first: a wrong setting is named whether or not NeMo-Run is here

    import nemo_run as run

    from nemo_throughput.adapters.lightning import ThroughputCallback

    return run.Config(ThroughputCallback, **settings)


def _settings_signature() -> inspect.Signature:
    """Every ThroughputConfig field as a keyword parameter: NeMo-Run's CLI parses `name=value`
    against the factory's signature, and reads `Optional[X]` where Python 3.10 writes `X | None`."""

    def for_nemo_run(hint: Any) -> Any:
        return typing.Union[typing.get_args(hint)] if isinstance(hint, types.UnionType) else hint  # noqa: UP007

    hints = typing.get_type_hints(ThroughputConfig)
    return inspect.Signature([
        inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default,
                          annotation=for_nemo_run(hints[f.name]))
        for f in dataclasses.fields(ThroughputConfig)
    ])


nemo_callback.__signature__ = _settings_signature()
