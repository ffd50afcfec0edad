"""One packed or padded micro-batch: its sequence lengths read, and checked before they are counted.

Where the lengths come from, first present first: cumulative sequence lengths (:data:`LENGTH_KEYS`),
one row of bounds per token row (``[rows, bounds]``, each bound at most the row's length) or one
flat row over all the tokens (``[bounds]``), starting at 0, never decreasing, ``-1`` padding only
after the last bound; else a 2-D ``attention_mask`` of segment ids the shape of the tokens: ``0`` is
padding, a sequence is a row's tokens of one non-zero id, and the ids never go down along a row
(multipack collators number a row's sequences 1, 2, 3 ...; a 0/1 padding mask, or a bool one, is
one sequence per row, left or right padded).

Types, dtypes and shapes are checked on the host, for free: a micro-batch that fails them is
unreadable, and the host says why in words. Values are checked on the device, beside the counts,
with fixed-shape operations: the result is a bitmask of :data:`PROBLEMS`, a scalar tensor read
with the step's counts once the step's end mark completed. Nothing here reads a device value on
the host (no ``.item()``, no ``bool(tensor)``, no shape that depends on the values).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, NamedTuple

import torch

# NeMo 2's packed-sequence batches carry cu_seqlens (-1 padded); Megatron-Bridge's and Transformer
# Engine's cu_seqlens_q / cu_seqlens_kv; Hugging Face's DataCollatorWithFlattening cu_seq_lens_q / _k.
PACKED_KEYS = ("cu_seqlens", "cu_seqlens_q", "cu_seqlens_kv", "cu_seqlens_unpadded", "cu_seq_lens_q",
               "cu_seq_lens_k")
TOKEN_KEYS = ("input_ids", "tokens")
# Where a packed batch's sequence lengths are read, first present first: NeMo's unpadded boundaries
# leave out each sequence's padding (its cu_seqlens count the pack's tail padding as a sequence).
LENGTH_KEYS = ("cu_seqlens_unpadded", "cu_seqlens", "cu_seqlens_q", "cu_seq_lens_q")
MASK_KEY = "attention_mask"

# What a micro-batch's values can show wrong: bits of the device's bitmask. HOST marks a micro-batch
# the host could not read (its rank's log and summary say why), so that the other ranks learn of it.
HOST, START, ORDER, BEYOND, PAD, NEGATIVE, IDS_NEGATIVE, IDS_ORDER = (1 << bit for bit in range(8))
PROBLEMS = {
    HOST: "a micro-batch could not be read",
    START: "{key} does not start at 0",
    ORDER: "{key} not monotonic",
    BEYOND: "{key} runs past the sequence (a bound above the row's tokens)",
    PAD: "{key} holds -1 padding before its last bound",
    NEGATIVE: "{key} holds a negative bound",
    IDS_NEGATIVE: f"{MASK_KEY} holds a negative segment id",
    IDS_ORDER: f"{MASK_KEY}'s segment ids go down along a row (a sequence split in two, or out of order)",
}


def problems_text(problems: int, key: str | None) -> str:
    """The problems of bitmask ``problems`` in words, the bounds named ``key`` (cu_seqlens if None)."""
    return "; ".join(text.format(key=key or "cu_seqlens") for bit, text in PROBLEMS.items() if problems & bit)


class MicroBatch(NamedTuple):
    """What one micro-batch holds; the tensors are int64 scalars on the batch's device."""

    source: str  # the key its lengths come from
    slots: int  # token slots, padding included (from the shape)
    tokens: torch.Tensor  # real tokens
    seqlen_sq: torch.Tensor  # sum over its sequences of length squared
    problems: torch.Tensor  # bitmask of PROBLEMS its values show; 0: none


def read_micro_batch(batch: Any) -> MicroBatch | str:
    """A packed or padded micro-batch's counts and value checks (on its device), or why the host
    cannot read it."""
    if not isinstance(batch, Mapping):
        return f"a micro-batch is a {type(batch).__name__}, not a mapping of named tensors"
    key = next((name for name in LENGTH_KEYS if name in batch), None)
    name = key or MASK_KEY
    values, tokens = batch.get(name), next((batch[k] for k in TOKEN_KEYS if k in batch), None)
    shape = shape_of(tokens)
    refused = _refused(name, values, shape, bounds=key is not None)
    if refused is not None:
        return refused
    try:
        if key is not None:  # a flat row of bounds runs over all the tokens; a row of bounds over its own
            limit = math.prod(shape) if values.dim() == 1 else shape[-1]
            return MicroBatch(key, math.prod(shape), *bound_counts(values, limit))
        return MicroBatch(MASK_KEY, math.prod(shape), *segment_counts(values))
    except RuntimeError as error:  # an operation the tensor's dtype or device lacks: never the run's failure
        return f"{name} could not be counted ({error})"


def _refused(name: str, values: Any, tokens: tuple[int, ...] | None, bounds: bool) -> str | None:
    """Why ``values`` (bounds, or a mask) cannot be read beside token rows of shape ``tokens``;
    None when they can. Host checks only: types, dtypes, shapes."""
    if not isinstance(values, torch.Tensor) or values.layout != torch.strided or values.is_meta:
        return f"{name} is {type(values).__name__}, not a dense integer tensor"
    if values.is_floating_point() or values.is_complex() or (bounds and values.dtype == torch.bool):
        if bounds:
            return f"{name} is {values.dtype}, not an integer tensor"
        return (f"{name} is {values.dtype}: a padding mask (1: a token) and an additive one (0: a token) "
                "cannot be told apart; give integer segment ids or a bool mask")
    if tokens is None or not tokens:
        return f"{name} came without the token rows ({' or '.join(TOKEN_KEYS)}) that give the slots"
    if values.numel() == 0 or math.prod(tokens) == 0:
        return f"{name} is empty (shape {list(values.shape)}, tokens {list(tokens)})"
    if not bounds:
        if tuple(values.shape) != tokens:
            return f"{name} of shape {list(values.shape)} does not match the tokens' {list(tokens)}"
        return None if values.dim() == 2 else f"{name} has {values.dim()} dimensions, not [rows, tokens]"
    if values.dim() not in (1, 2) or values.dim() == 2 and (len(tokens) != 2 or values.shape[0] != tokens[0]):
        return (f"{name} of shape {list(values.shape)} is neither one row of bounds per token row nor one "
                f"flat row (tokens {list(tokens)})")
    return f"{name} holds fewer than 2 bounds a row (shape {list(values.shape)})" if values.shape[-1] < 2 else None


def shape_of(value: Any) -> tuple[int, ...] | None:
    """A tensor-like value's shape as a tuple; None for anything without one."""
    shape = getattr(value, "shape", None)
    return tuple(shape) if shape is not None and not callable(shape) else None


def bound_counts(values: torch.Tensor, limit: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(real tokens, sum of squared lengths, problems) of cumulative bounds ``values``
    (``[rows, bounds]`` or ``[bounds]``), each row's bounds at most ``limit`` tokens."""
    bounds = values.to(torch.int64)
    pad = bounds == -1
    real = ~pad
    steps = bounds[..., 1:] - bounds[..., :-1]
    lengths = torch.where(real[..., 1:], steps, 0)  # a -1 after the last bound ends the row
    problems = (_flag(bounds[..., 0] != 0, START) + _flag(real[..., 1:] & (steps < 0), ORDER)
                + _flag(real & (bounds > limit), BEYOND) + _flag(pad[..., :-1] & real[..., 1:], PAD)
                + _flag(real & (bounds < 0), NEGATIVE))
    return lengths.sum(), (lengths * lengths).sum(), problems


def segment_counts(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(real tokens, sum of squared lengths, problems) of a ``[rows, tokens]`` mask of segment ids.

    A token starts a sequence where its id is above every id before it in the row; with ids that
    never go down, a sequence's tokens are those of one id (padding inside a row, as a 0/1 mask
    with a hole, leaves its sequence one). Each token adds its place in its sequence, k, as 2k - 1:
    over a sequence of s tokens that sums to s², with no per-sequence buffer and no sync."""
    ids = mask.to(torch.int64)
    token = ids != 0
    highest = ids.cummax(dim=-1).values
    before = torch.cat([torch.zeros_like(highest[..., :1]), highest[..., :-1]], dim=-1)  # highest id before each
    counted = token.to(torch.int64).cumsum(dim=-1)  # tokens so far in the row, this one included
    starts = token & (ids > before)
    # the count before each sequence's first token, carried along: the latest start's, as counts only grow
    offset = torch.where(starts, counted - 1, 0).cummax(dim=-1).values
    squares = torch.where(token, 2 * (counted - offset) - 1, 0)
    problems = _flag(ids < 0, IDS_NEGATIVE) + _flag((ids > 0) & (ids < before), IDS_ORDER)
    return token.sum(dtype=torch.int64), squares.sum(), problems


def _flag(wrong: torch.Tensor, bit: int) -> torch.Tensor:
    """``bit`` where any of ``wrong`` holds, else 0: an int64 scalar on the device."""
    return wrong.any().to(torch.int64) * bit
