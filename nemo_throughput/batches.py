"""What a training batch looks like, and what it holds.

:func:`batch_layout` reads a batch's keys and shapes only. :class:`TokenCounter` counts packed and
padded batches' real tokens and sum over sequences of length squared on the device, where the
batch is, checks their values there (batch_checks), and hands each step's counts to the host
behind the step's own end mark: no step waits for the device to count (docs/configuration.md,
"Packed and padded batches"). :class:`BatchCounting` is a run's: the layout its batches show,
checked on every micro-batch, and their counts step by step. :class:`CheckedBatches` gathers what
the exchanged steps of every rank say of bad micro-batches, on the reporting thread."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from nemo_throughput.batch_checks import (
    HOST,
    MASK_KEY,
    PACKED_KEYS,
    TOKEN_KEYS,
    problems_text,
    read_micro_batch,
    shape_of,
)
from nemo_throughput.text import package_logger

log = package_logger(__name__)

FIXED, PACKED, PADDED = "fixed", "packed", "padded"
_PACKED = frozenset(PACKED_KEYS)


def batch_layout(batch: Any) -> str | None:
    """PACKED (cumulative sequence lengths: several sequences per row), PADDED (a 2-D attention
    mask beside the token rows: padding, or segment ids of sequences packed in a row), FIXED
    (token rows without either; a 4-D mask says nothing of padding), or None when the hook was
    handed no batch it can read (Megatron strategies pass an iterator)."""
    # Read on every micro-batch: a dict is checked before the ABC (whose check costs several calls),
    # and no generator runs (each of its steps is a call).
    if isinstance(batch, (dict, Mapping)):
        if not _PACKED.isdisjoint(batch.keys()):
            return PACKED
        tokens = None
        for key in TOKEN_KEYS:
            if key in batch:
                tokens = batch[key]
                break
        if shape_of(tokens) is None:
            return None
        mask = shape_of(batch.get(MASK_KEY))
        return PADDED if mask is not None and len(mask) == 2 else FIXED  # one unlike the tokens: not counted
    if shape_of(batch) is not None:
        return FIXED
    if isinstance(batch, (list, tuple)) and batch and all(shape_of(item) is not None for item in batch):
        return FIXED
    return None


def _token_rows(batch: Any) -> tuple[int, ...] | None:
    """The shape of a fixed-length batch's token rows: its token key's, the tensor's, or the first item's."""
    if isinstance(batch, (dict, Mapping)):
        return next((shape_of(batch[key]) for key in TOKEN_KEYS if key in batch), None)
    if isinstance(batch, (list, tuple)):
        return shape_of(batch[0])
    return shape_of(batch)


Count = int | torch.Tensor  # a Python int, or a scalar tensor on the batch's device


class StepCounts:
    """One step's counts on one rank (:data:`~nemo_throughput.timing.BATCH_COUNTS` then
    :data:`~nemo_throughput.timing.BATCH_CHECKS`; None: not counted). Device values are copied to
    the host when the step ends, without waiting; :meth:`read` is called once the step's end mark
    completed (the copy was enqueued before it)."""

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


# A fixed-length step whose micro-batches all passed the layout check: nothing counted, none bad
# (one shared object: made every step, it cost a fifth of the ordinary step's host time).
FIXED_CHECKED = StepCounts((None, None, None, 0, 0))


class TokenCounter:
    """Counts each step's real tokens, token slots (padding included), sum over sequences of
    length squared (the attention FLOPs' term), micro-batches found bad and the bitmask of their
    problems (batch_checks.PROBLEMS) from its micro-batches: a packed batch's lengths from its
    cumulative sequence lengths, a padded batch's from its attention mask's segment ids. Slots come
    from shapes, on the host; the rest is a few device operations per micro-batch, kept on the
    device until the step ends.

    ``unreadable`` says why, once a micro-batch could not be read on the host (its step's counts
    are None, and it counts as bad); every micro-batch is still checked, to count the bad ones."""

    def __init__(self) -> None:
        self.unreadable: str | None = None
        self.source: str | None = None  # where the counts come from (a batch key, or a framework's accumulators)
        # [tokens, slots, seqlen_sq, bad, problems] of the step so far; None: no micro-batch yet
        self.so_far: list[Count | None] | None = None

    def add_batch(self, batch: Any) -> None:
        """One micro-batch of the step in progress (a packed or padded one)."""
        read = read_micro_batch(batch)
        if not isinstance(read, str) and self.source not in (None, read.source):
            read = f"a micro-batch's lengths come from {read.source}, the run's first from {self.source}"
        if isinstance(read, str):
            self.refuse(read)
            return
        self.source = read.source
        self._add((read.tokens, read.slots, read.seqlen_sq, (read.problems != 0).to(torch.int64), read.problems))

    def refuse(self, why: str) -> None:
        """A micro-batch of the step in progress the host cannot count: ``why``, in words."""
        self.unreadable = self.unreadable or why
        self._add((None, None, None, 1, HOST))

    def add_counts(self, slots: Count, seqlen_sq: Count, source: str) -> None:
        """A framework's own counts of the step (Megatron-Bridge's FLOPs accumulators): token slots
        and sum of squared lengths; real tokens unknown, no batch checked."""
        self.source = source
        self._add((None, slots, seqlen_sq, None, 0))

    def _add(self, counts: tuple[Count | None, ...]) -> None:
        if self.so_far is None:
            self.so_far = list(counts)
            return
        summed = [None if a is None or b is None else a + b for a, b in zip(self.so_far[:-1], counts[:-1], strict=True)]
        self.so_far = [*summed, self.so_far[-1] | counts[-1]]  # the problems' bitmask: or, not sum

    def step_done(self) -> StepCounts | None:
        """The step ended: its counts (None when no micro-batch was seen), the copy to the host enqueued."""
        counted, self.so_far = self.so_far, None
        return StepCounts(tuple(counted)) if counted is not None else None


class BatchCounting:
    """A run's batches, told by its adapter: the layout the first one shows, checked on every
    micro-batch after it, and where the batches are packed or padded their counts
    (:class:`TokenCounter`), step by step. What it learns goes into the run's ``learned`` facts
    (run_facts.Learned), on the training thread; what the device's checks find comes back with the
    exchanged steps, to the reporting thread (:class:`CheckedBatches`).

    ``facts``: the set-up's (run_facts.RunFacts): their ``batch_layout`` is what the framework's
    data config says; a run whose samples are not token sequences is not counted."""

    def __init__(self, facts: Any, learned: Any, rank: int) -> None:
        self._facts, self._learned, self._rank = facts, learned, rank
        self._counter: TokenCounter | None = None
        self._layout: str | None = None  # the first batch's, every micro-batch's must be; None: not checked
        self._plain_tensor: type | None = None  # torch.Tensor where the first batch was one: so is every fixed one
        self._fixed_checked = False  # a fixed-length micro-batch of the step in progress passed the check

    def seen(self, batch: Any) -> None:
        """The first training batch: its layout (:func:`batch_layout`); None (no readable batch) keeps
        what the framework's config said (NeMo 2's packed data module). Packed or padded batches
        are counted from then on; where only the config says so, the config's tokens per step count
        padding: the summary and a warning say so."""
        if self._facts.seq_length is None:  # samples that are not token sequences
            return
        self._layout = layout = batch_layout(batch)
        if layout == FIXED and type(batch) is torch.Tensor:
            self._plain_tensor = torch.Tensor
        if layout == FIXED and self._rank == 0:
            self._check_shape(_token_rows(batch))
        if layout is not None:
            self._learned.batch_layout = layout
            self._counter = TokenCounter()
        elif self._facts.batch_layout in (PACKED, PADDED) and self._counter is None:
            self.not_counted(f"the {self._facts.batch_layout} layout comes from the data config, and the framework "
                             "hands the training hooks no batch to count")

    def _check_shape(self, shape: tuple[int, ...] | None) -> None:
        """The first fixed-length batch's token rows against the run's seq_length and micro-batch (or,
        where no micro_batch_size is known, its global batch): a setting the batches contradict would
        scale every rate. Rows may hold the next token as well."""
        if shape is None or len(shape) != 2:
            return
        rows, length = shape
        facts = self._facts
        wrong = [f"seq_length is {facts.seq_length}"] if length not in (facts.seq_length, facts.seq_length + 1) else []
        if facts.micro_batch_size is not None:
            wrong += [f"micro_batch_size is {facts.micro_batch_size}"] if facts.micro_batch_size != rows else []
        elif facts.batches_per_step is not None:
            data_parallel = facts.parallel.get("data", 1)
            trained = rows * facts.batches_per_step * data_parallel
            if trained != facts.global_batch_size:
                wrong.append(f"global_batch_size is {facts.global_batch_size}, where {rows} row(s) x "
                             f"{facts.batches_per_step} micro-batch(es) per step x {data_parallel} data-parallel "
                             f"rank(s) train {trained}")
        if wrong:
            log.warning("nemo-throughput: the first training batch holds %d row(s) of %d tokens, but the run's %s: "
                        "tokens/s, TFLOPS and MFU are computed from the settings. Correct them if this batch is what "
                        "a micro-batch trains (callbacks.throughput.seq_length=..., micro_batch_size=... and "
                        "global_batch_size=... with Hydra).", rows, length, " and its ".join(wrong))

    def add_batch(self, batch: Any) -> None:
        """A micro-batch of the step in progress: its layout checked against the first one's (on the
        host), and counted and checked (on the device) where the run's batches are packed or padded."""
        if type(batch) is self._plain_tensor:  # the common case, kept to a compare and a store
            self._fixed_checked = True
            return
        counter = self._counter
        if self._layout is None or counter is None:
            return
        layout = batch_layout(batch)
        if layout == FIXED and self._layout == FIXED:  # the common case, kept to a store: nothing to count
            self._fixed_checked = True
            return
        if layout != self._layout:
            counter.refuse(f"a micro-batch is {layout or 'unreadable'}, the run's first was {self._layout}")
        else:
            counter.add_batch(batch)
        if counter.unreadable is not None:
            self.not_counted(counter.unreadable)

    def add_counts(self, slots: Count, seqlen_sq: Count, source: str) -> None:
        """A framework's own counts of the step in progress (token slots, sum of squared sequence
        lengths; ints or device tensors), where it keeps them (Megatron-Bridge's FLOPs accumulators)."""
        self._counter = self._counter or TokenCounter()
        self._counter.add_counts(slots, seqlen_sq, source)

    def not_counted(self, why: str) -> None:
        """The run's batches cannot be counted: ``why``, in words (the first reason stands, told once)."""
        if self._learned.batch_uncounted is not None:
            return
        self._learned.batch_uncounted = why
        if self._rank == 0:
            log.warning(uncounted_warning(self._learned.batch_layout or self._facts.batch_layout, why,
                                          self._facts.workload.tokens_per_step))
        else:  # rank 0 learns only that a micro-batch here was bad: the why is told here, once
            log.warning("nemo-throughput: rank %d: %s; the run counts the config's tokens (rank 0 says so)",
                        self._rank, why)

    def step_done(self) -> StepCounts | None:
        """The step ended: its counts (None where not counted), the copy to the host enqueued."""
        counter = self._counter
        if counter is None:
            return None
        fixed_checked, self._fixed_checked = self._fixed_checked, False
        if fixed_checked and counter.so_far is None:
            return FIXED_CHECKED
        counts = counter.step_done()
        if counter.source is not None and self._learned.batch_count_source is None:
            self._learned.batch_count_source = counter.source
        return counts


def uncounted_warning(layout: str | None, why: str, tokens_per_step: int | None) -> str:
    """The one warning of a run whose batches are not counted."""
    return (f"nemo-throughput: the training batches are {layout}, but {why}: tokens/s, TFLOPS and MFU count global "
            f"batch x seq_length = {tokens_per_step:,} tokens per step, padding included, and attention as if every "
            "sample were seq_length long, for the whole run. Read them as an upper bound (batch.uncounted in the "
            "summary).")


class CheckedBatches:
    """What every rank's exchanged steps (timing.BATCH_CHECKS, warm-up and profiled steps included)
    say of bad micro-batches: how many, their problems, on which ranks. Kept where the steps are
    absorbed (the reporting thread; the training thread once that is drained), read there."""

    def __init__(self) -> None:
        self.bad: int | None = None  # micro-batches found bad, all ranks; None: no step was checked
        self._problems = 0
        self._ranks: set[int] = set()

    def add(self, bad: torch.Tensor, problems: torch.Tensor) -> bool:
        """One interval's ``[ranks, steps]`` bad micro-batches and problems (NaN: not checked);
        True when these are the run's first bad ones."""
        checked = ~torch.isnan(bad)
        if not bool(checked.any()):  # host tensors, from the exchange
            return False
        first = not self.bad
        self.bad = (self.bad or 0) + int(bad[checked].sum())
        for rank, step in (bad > 0).nonzero().tolist():
            self._ranks.add(rank)
            self._problems |= int(problems[rank, step])
        return first and self.bad > 0

    def why(self, key: str | None) -> str | None:
        """The problems in words, with the ranks that found them; None without any."""
        if not self.bad:
            return None
        ranks = sorted(self._ranks)
        listed = ", ".join(map(str, ranks[:8])) + (f" and {len(ranks) - 8} more" if len(ranks) > 8 else "")
        told = "; its log says why" if self._problems & HOST else ""
        return f"{problems_text(self._problems, key)} (rank{'s' if len(ranks) > 1 else ''} {listed}{told})"
