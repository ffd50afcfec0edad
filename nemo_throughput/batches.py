"""What a training batch looks like, read from its keys, shapes and dtypes only (never its values:
that would wait for the device). Tokens per step are counted from the config (global batch x
sequence length); for packed or padded batches that count includes padding, and the run says so."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

FIXED, PACKED, PADDED = "fixed", "packed", "padded"
# NeMo 2's packed-sequence batches carry cu_seqlens (-1 padded); Megatron-Bridge's and Transformer
# Engine's cu_seqlens_q / cu_seqlens_kv.
PACKED_KEYS = ("cu_seqlens", "cu_seqlens_q", "cu_seqlens_kv", "cu_seqlens_unpadded")
TOKEN_KEYS = ("input_ids", "tokens")


def batch_layout(batch: Any) -> str | None:
    """PACKED (cumulative sequence lengths: several sequences per row), PADDED (a 2-D attention
    mask the shape of the tokens: rows padded to a common length), FIXED (token rows without
    either), or None when the hook was handed no batch it can read (Megatron strategies pass an
    iterator)."""
    if isinstance(batch, Mapping):
        if any(key in batch for key in PACKED_KEYS):
            return PACKED
        tokens = next((batch[key] for key in TOKEN_KEYS if key in batch), None)
        mask = batch.get("attention_mask")
        if _shape(mask) is not None and len(_shape(mask)) == 2 and _shape(mask) == _shape(tokens):
            return PADDED
        return FIXED if _shape(tokens) is not None else None
    if _shape(batch) is not None:
        return FIXED
    if isinstance(batch, (list, tuple)) and batch and all(_shape(item) is not None for item in batch):
        return FIXED
    return None


def _shape(value: Any) -> tuple[int, ...] | None:
    shape = getattr(value, "shape", None)
    return tuple(shape) if shape is not None and not callable(shape) else None
