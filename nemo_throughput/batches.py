"""What a training batch looks like, and what it holds.

:func:`batch_layout` reads a batch's keys and shapes only. :class:`TokenCounter` counts packed and
padded batches' real tokens and sum over sequences of length squared on the device, where the
batch is, and hands each step's counts to the host behind the step's own end mark: no step waits
for the device to count (docs/measurement.md, "Packed and padded batches"). :class:`BatchCounting`
is a run's: the layout its batches show, and their counts step by step."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from nemo_throughput.text import package_logger

log = package_logger(__name__)

FIXED, PACKED, PADDED = "fixed", "packed", "padded"
# NeMo 2's packed-sequence batches carry cu_seqlens (-1 padded); Megatron-Bridge's and Transformer
# Engine's cu_seqlens_q / cu_seqlens_kv.
PACKED_KEYS = ("cu_seqlens", "cu_seqlens_q", "cu_seqlens_kv", "cu_seqlens_unpadded")
TOKEN_KEYS = ("input_ids", "tokens")
# Where a packed batch's sequence lengths are read, first present first: NeMo's unpadded boundaries
# leave out each sequence's padding (its cu_seqlens count the pack's tail padding as a sequence).
LENGTH_KEYS = ("cu_seqlens_unpadded", "cu_seqlens", "cu_seqlens_q")
MASK_KEY = "attention_mask"


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


Count = int | torch.Tensor  # a Python int, or a scalar tensor on the batch's device


class StepCounts:
    """One step's counts on one rank (:data:`~nemo_throughput.timing.BATCH_COUNTS`; None: not
    counted). Device values are copied to the host when the step ends, without waiting; :meth:`read`
    is called once the step's end mark completed (the copy was enqueued before it)."""

    def __init__(self, counts: tuple[Count | None, ...]) -> None:
        on_device = [value for value in counts if isinstance(value, torch.Tensor)]
        self._counts, self._host = counts, None
        if on_device:
            values = torch.stack(on_device)
            pinned = values.device.type == "cuda"
            self._host = torch.empty(values.shape, dtype=values.dtype, pin_memory=pinned)
            self._host.copy_(values, non_blocking=pinned)

    def read(self) -> tuple[float | None, ...]:
        copied = iter(self._host.tolist() if self._host is not None else ())
        return tuple(None if value is None else float(next(copied) if isinstance(value, torch.Tensor) else value)
                     for value in self._counts)


class TokenCounter:
    """Counts each step's real tokens, token slots (padding included) and sum over sequences of
    length squared (the attention FLOPs' term) from its micro-batches: a packed batch's lengths from
    its cumulative sequence lengths (-1 padding ignored), a padded batch's from its attention mask's
    rows. Slots come from shapes, on the host; the rest is a few device operations per micro-batch,
    kept on the device until the step ends.

    ``unreadable`` says why, once a batch of a packed or padded run could not be counted; no step
    is counted from then on (a step counted in part would be silently wrong)."""

    def __init__(self) -> None:
        self.unreadable: str | None = None
        self.source: str | None = None  # where the counts come from (a batch key, or a framework's accumulators)
        self._step: list[Count | None] | None = None  # [tokens, slots, seqlen_sq] of the step so far

    def add_batch(self, batch: Any) -> None:
        """One micro-batch of the step in progress (a packed or padded one)."""
        if self.unreadable is not None:
            return
        counted = _count(batch)
        if isinstance(counted, str):
            self.unreadable, self._step = counted, None
            return
        self.source, (lengths, slots) = counted
        self._add((lengths.sum(), slots, (lengths * lengths).sum()))

    def add_counts(self, slots: Count, seqlen_sq: Count, source: str) -> None:
        """A framework's own counts of the step (Megatron-Bridge's FLOPs accumulators): token slots
        and sum of squared lengths; real tokens unknown."""
        self.source = source
        self._add((None, slots, seqlen_sq))

    def _add(self, counts: tuple[Count | None, ...]) -> None:
        if self._step is None:
            self._step = list(counts)
            return
        self._step = [None if a is None or b is None else a + b for a, b in zip(self._step, counts, strict=True)]

    def step_done(self) -> StepCounts | None:
        """The step ended: its counts (None when nothing was counted), the copy to the host enqueued."""
        counted, self._step = self._step, None
        return StepCounts(tuple(counted)) if counted is not None and self.unreadable is None else None


def _count(batch: Any) -> tuple[str, tuple[torch.Tensor, int]] | str:
    """(source, (sequence lengths on the device, token slots)) of a packed or padded micro-batch,
    or why they cannot be read."""
    if not isinstance(batch, Mapping):
        return f"a micro-batch is a {type(batch).__name__}, not a mapping of named tensors"
    key = next((key for key in LENGTH_KEYS if key in batch), None)
    values = batch.get(key) if key is not None else batch.get(MASK_KEY)
    tokens = next((batch[name] for name in TOKEN_KEYS if name in batch), values if key is None else None)
    if not isinstance(values, torch.Tensor) or values.is_floating_point() and key is not None:
        return f"{key or MASK_KEY} is {type(values).__name__}, not an integer tensor"
    if _shape(tokens) is None:
        return f"{key} came without the token rows ({' or '.join(TOKEN_KEYS)}) that give the slots"
    slots = 1
    for size in _shape(tokens):
        slots *= size
    if key is not None:  # cumulative boundaries per row, -1 after the last
        bounds = values.to(torch.int64)
        return key, ((bounds[..., 1:] - bounds[..., :-1]).clamp(min=0), slots)
    if values.dim() != 2:
        return f"{MASK_KEY} has {values.dim()} dimensions, not [rows, tokens]"
    return MASK_KEY, ((values != 0).sum(dim=1, dtype=torch.int64), slots)


class BatchCounting:
    """A run's batches, told by its adapter: the layout the first one shows, and where the batches
    are packed or padded their counts (:class:`TokenCounter`), step by step. What it learns goes
    into the run's ``learned`` facts (run_facts.Learned), on the training thread.

    ``facts``: the set-up's (run_facts.RunFacts): their ``batch_layout`` is what the framework's
    data config says; a run whose samples are not token sequences is not counted."""

    def __init__(self, facts: Any, learned: Any, rank: int) -> None:
        self._facts, self._learned, self._rank = facts, learned, rank
        self._counter: TokenCounter | None = None

    def seen(self, layout: str | None) -> None:
        """The first training batch's layout (:func:`batch_layout`); None (no readable batch) keeps
        what the framework's config said (NeMo 2's packed data module). Packed or padded batches
        are counted from then on; where only the config says so, the config's tokens per step count
        padding: the summary and a warning say so."""
        if self._facts.seq_length is None:  # samples that are not token sequences
            return
        if layout in (PACKED, PADDED):
            self._learned.batch_layout = layout
            self._counter = TokenCounter()
        elif layout is None and self._facts.batch_layout in (PACKED, PADDED) and self._counter is None:
            self.not_counted(f"the {self._facts.batch_layout} layout comes from the data config, and the framework "
                             "hands the training hooks no batch to count")
        elif layout is not None:
            self._learned.batch_layout = layout

    def add_batch(self, batch: Any) -> None:
        """A micro-batch of the step in progress, counted where the run's batches are packed or padded."""
        counter = self._counter
        if counter is not None and counter.unreadable is None:
            counter.add_batch(batch)
            if counter.unreadable is not None:
                self.not_counted(counter.unreadable)

    def add_counts(self, slots: Count, seqlen_sq: Count, source: str) -> None:
        """A framework's own counts of the step in progress (token slots, sum of squared sequence
        lengths; ints or device tensors), where it keeps them (Megatron-Bridge's FLOPs accumulators)."""
        self._counter = self._counter or TokenCounter()
        self._counter.add_counts(slots, seqlen_sq, source)

    def not_counted(self, why: str) -> None:
        """The run's batches are packed or padded, but cannot be counted: ``why``, in words."""
        self._learned.batch_uncounted = why
        if self._rank == 0:
            log.warning("nemo-throughput: the training batches are %s, but %s: tokens/s, TFLOPS and MFU count global "
                        "batch x seq_length = %s tokens per step, padding included, and attention as if every sample "
                        "were seq_length long. Read them as an upper bound (batch.uncounted in the summary).",
                        self._learned.batch_layout or self._facts.batch_layout, why,
                        f"{self._facts.workload.tokens_per_step:,}")

    def step_done(self) -> StepCounts | None:
        """The step ended: its counts (None where not counted), the copy to the host enqueued."""
        counter = self._counter
        if counter is None:
            return None
        counts = counter.step_done()
        if counts is not None and self._learned.batch_count_source is None:
            self._learned.batch_count_source = counter.source
        return counts
