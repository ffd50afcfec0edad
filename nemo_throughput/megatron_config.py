"""Reading a megatron-core ``TransformerConfig`` (NeMo 1.x ``cfg.model``, NeMo 2's ``GPTConfig``,
a Megatron-Bridge model provider) duck-typed, so that neither megatron-core nor the framework is
imported: attributes or mapping items (dataclass, DictConfig, dict)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

SHAPE_KEYS = ("num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size", "num_query_groups",
              "kv_channels", "num_moe_experts", "moe_router_topk", "moe_ffn_hidden_size",
              "moe_shared_expert_intermediate_size", "moe_layer_freq")
PARALLEL_KEYS = {
    "tensor": "tensor_model_parallel_size",
    "pipeline": "pipeline_model_parallel_size",
    "context": "context_parallel_size",
    "virtual_pipeline": "virtual_pipeline_model_parallel_size",
    "expert": "expert_model_parallel_size",
}


def get(obj: Any, key: str) -> Any:
    """Attribute or mapping item; None when absent."""
    if obj is None:
        return None
    if isinstance(obj, Mapping):
        return obj.get(key)
    try:
        return getattr(obj, key, None)
    except Exception:  # noqa: BLE001 - DictConfig raises on missing keys in struct mode
        return None


def shape_fields(config: Any) -> dict[str, Any]:
    """The ModelSpec fields the config sets (a list-valued ``moe_layer_freq`` as a tuple)."""
    values = {key: get(config, key) for key in SHAPE_KEYS}
    if isinstance(values["moe_layer_freq"], Sequence) and not isinstance(values["moe_layer_freq"], str):
        values["moe_layer_freq"] = tuple(values["moe_layer_freq"])
    return {key: value for key, value in values.items() if value is not None}


def padded_vocab_size(vocab_size: int, divisible_by: int = 128, tensor_parallel: int = 1) -> int:
    """Megatron's vocabulary padding, the logits GEMM's width: ``vocab_size`` rounded up to a multiple
    of ``make_vocab_size_divisible_by`` (``divisible_by``) x tensor-parallel size."""
    multiple = divisible_by * tensor_parallel
    return -(-vocab_size // multiple) * multiple


def parallel_sizes(config: Any) -> dict[str, int]:
    """Tensor / pipeline / context / virtual-pipeline / expert parallel sizes the config sets."""
    values = {name: get(config, key) for name, key in PARALLEL_KEYS.items()}
    return {name: int(value) for name, value in values.items() if value}


def formula_gaps(config: Any) -> list[str]:
    """What the model has that the GPT FLOPs formulas do not describe, so that FLOPs computed from
    its shape would be wrong: sliding-window layers would count as full attention (GPT-OSS: about
    +5 %), and there is no multi-latent attention or multi-token prediction (DeepSeek-V3)."""
    gaps = []
    window = get(config, "window_size")
    if window is not None:
        gaps.append(f"sliding-window attention (window_size={window!r})")
    if get(config, "multi_latent_attention") is True:
        gaps.append("multi-latent attention (multi_latent_attention=True)")
    if get(config, "mtp_num_layers"):
        gaps.append(f"multi-token prediction (mtp_num_layers={get(config, 'mtp_num_layers')})")
    return gaps
