"""The model TFLOP/s per GPU NeMo 2's FLOPsMeasurementCallback states, and the counts NeMo's
``flops_formulas`` make of a model (importers.crosscheck checks them).

The callback (``nemo/lightning/pytorch/callbacks/flops_callback.py``) adds the progress bar's
``train_step_timing in s`` of every step; every ``trainer.log_every_n_steps`` steps it logs, as
``TFLOPS_per_GPU`` (``tflops_per_sec_per_gpu`` before NeMo 2.3), its family formula's FLOPs of a
global batch (the data config's batch, the model config's ``seq_length``) / world size / 1e12 /
the mean of those steps' times. The value stays in the progress bar until the next: NeMo 2's
ProgressPrinter prints it on every line, averaged like every metric over its own ``log_interval``,
to 4 significant digits (``{:.4}``; an integer as one). With both intervals 1 (the performance
scripts') a line's figure is its own step's time's; otherwise a figure first printed at step s is the
mean over the callback's interval of steps up to s (or s - 1: the timing callback may run after it),
so the spread of those steps' times is allowed too. A figure whose interval holds times more than
MAX_AVERAGED_SPREAD apart (the first interval holds the first step's start-up) is not checked: the
allowance would check nothing. Event files hold it as logged, a float32.

The formulas count the model by its family name (``llama3``, ``mixtral`` ...), not its shape: a
fixed vocabulary per family, heads h/n wide, and family-wide MLP shapes. Where that counts a
model otherwise than ours, the family's own count is compared too and named when it agrees.
Causal attention is counted in full before NeMo 2.5 and halved since (``qwen3`` always halved).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from nemo_throughput.flops import ModelSpec
from nemo_throughput.importers.crosscheck import (Count, Facts, Result, Source, StatedRate, check_log, count,
                                                  float32_unit, given_count, padding_share)
from nemo_throughput.importers.steps import Step

OLD_FIELD = "tflops_per_sec_per_gpu"  # the name before NeMo 2.3, which also predates the halving (2.5)
PRINTED_DIGITS = 4  # ProgressPrinter's {:.4}
# A figure that may average step times further apart than this (max / min - 1) is not checked.
MAX_AVERAGED_SPREAD = 0.5
SAME_COUNT = 1e-6  # a family's count this close to one already compared is that one
EARLIER = "not with NeMo's current count: the run's NeMo is earlier than 2.5"
UNREPRODUCED = ("a NeMo formula this check does not reproduce (`transformer`, `deepseekv3`, `nemotronh`, `hyena`, "
                "`gpt_oss`, `bert`), or a family name that picks another family's formula")
BATCH_CHANGES = ("the batch changes within the log, and NeMo's callback counts its configured global batch, not the "
                 "one each line prints")


def printer_field(name: str) -> str:
    return f"`{name}:` of NeMo 2's progress lines (its FLOPs callback's)"


def event_field(name: str) -> str:
    return f"NeMo's `{name}` scalar (its FLOPs callback's)"


def printed_unit(value: float) -> float:
    """The last of the 4 significant digits ``{:.4}`` prints ``value`` to."""
    if not math.isfinite(value) or value == 0:
        return 0.0
    return 10.0 ** (math.floor(math.log10(abs(value))) - PRINTED_DIGITS + 1)


# ------------------------------------------------------------------ what the log states
def stated_rates(steps: list[Step], batch: int, unit: Callable[[float], float]) -> tuple[list[StatedRate], int]:
    """The figures the steps state, each with its own time, the batch the callback counts and, where the
    figure need not be its own step's, the spread of the step times it may average; and how many lines
    were left out because that spread is over MAX_AVERAGED_SPREAD."""
    own = _figures_are_their_steps(steps)
    windows = [(step.seconds, 0.0) for step in steps] if own else _windows(steps)
    rates, too_spread = [], 0
    for index, step in enumerate(steps):
        if step.tflops_per_gpu is None or (not own and _first_of_an_average(steps, index)):
            continue
        seconds, spread = windows[index]
        if spread > MAX_AVERAGED_SPREAD:
            too_spread += 1
            continue
        rates.append(StatedRate(step.line, step.tflops_per_gpu, seconds, unit(step.tflops_per_gpu),
                                unit(step.seconds), batch, spread))
    return rates, too_spread


def _figures_are_their_steps(steps: list[Step]) -> bool:
    """Every line one step after the one before, and no figure repeated on the next line: the callback and
    the printer both at every step (a line without one, the callback's first step, breaks no run)."""
    pairs = list(zip(steps, steps[1:]))
    return all(b.step == a.step + 1 and (a.tflops_per_gpu is None or b.tflops_per_gpu != a.tflops_per_gpu)
               for a, b in pairs)


def _first_of_an_average(steps: list[Step], index: int) -> bool:
    """The first figure after a line without one: the printer's interval mean counts the steps before the
    callback's first figure as zero."""
    return index > 0 and steps[index - 1].tflops_per_gpu is None


def _windows(steps: list[Step]) -> list[tuple[float, float]]:
    """For each line, the mean of the step times its figure may be the mean of, and their spread (max / min
    - 1): the steps of the callback's interval up to the step where the figure was first printed, that one
    included (the interval: the steps from there to the next figure's first line; the last figure's, the
    one before's). Where no interval is known (one figure), the line's own time, with the spread from the
    line before the figure's first to the line after it. Linear: a figure the callback logs every few
    thousand steps is printed on every line between."""
    starts = [i for i, step in enumerate(steps) if i == 0 or steps[i - 1].tflops_per_gpu != step.tflops_per_gpu]
    intervals = [steps[b].step - steps[a].step for a, b in itertools.pairwise(starts)]
    if not intervals:
        return [(step.seconds, spread) for step, spread in zip(steps, _spreads_around(steps))]
    intervals.append(intervals[-1])
    windows = []
    for run, (start, interval) in enumerate(zip(starts, intervals)):
        end = starts[run + 1] if run + 1 < len(starts) else len(steps)
        first, earliest = start, steps[start].step - interval
        # back through the interval, while the steps before go down: each line once (step numbers that
        # repeat or go up, as no run of one process prints them, end the window rather than scan the log)
        while first > 0 and earliest <= steps[first - 1].step < steps[first].step:
            first -= 1
        windows += [_mean_and_spread([step.seconds for step in steps[first:start + 1]])] * (end - start)
    return windows


def _spreads_around(steps: list[Step]) -> list[float]:
    """One figure on every line: each line's spread from the first line to the line after it, the bounds
    carried along in one pass."""
    spreads, low, high = [], math.inf, 0.0
    for index, step in enumerate(steps):
        low, high = _widened(low, high, step.seconds)
        after = _widened(low, high, steps[index + 1].seconds if index + 1 < len(steps) else math.nan)
        spreads.append(after[1] / after[0] - 1 if after[1] > 0 else 0.0)
    return spreads


def _mean_and_spread(times: list[float]) -> tuple[float, float]:
    """The usable times' mean and max / min - 1 (NaN and 0 where none is usable)."""
    usable = [seconds for seconds in times if math.isfinite(seconds) and seconds > 0]
    if not usable:
        return math.nan, 0.0
    return sum(usable) / len(usable), max(usable) / min(usable) - 1


def _widened(low: float, high: float, seconds: float) -> tuple[float, float]:
    """The bounds with one more step time, where it is a usable one."""
    if math.isfinite(seconds) and seconds > 0:
        return min(low, seconds), max(high, seconds)
    return low, high


# ------------------------------------------------------------------ the counts compared with
@dataclass(frozen=True)
class Family:
    """A family formula of NeMo's, as the shape it counts a model as."""

    name: str
    reads: str  # how it counts a model, for notes
    shape: Callable[[ModelSpec], ModelSpec | None]  # None: not a model it can have counted
    always_halved: bool = False


def _heads_even(spec: ModelSpec) -> bool:
    return spec.hidden_size % spec.num_attention_heads == 0


def _dense(spec: ModelSpec, **shape: object) -> ModelSpec:
    return replace(spec, kv_channels=None, num_moe_experts=None, moe_ffn_hidden_size=None,
                   moe_shared_expert_intermediate_size=None, moe_layer_freq=1, **shape)


def _llama(vocab: int) -> Callable[[ModelSpec], ModelSpec | None]:
    return lambda s: _dense(s, vocab_size=vocab) if s.gated_linear_unit and _heads_even(s) else None


def _ungated(**shape: object) -> Callable[[ModelSpec], ModelSpec | None]:
    return lambda s: (_dense(s, **{k: v(s) for k, v in shape.items()})
                      if not s.gated_linear_unit and s.num_moe_experts is None and _heads_even(s) else None)


def _every_layer_moe(expert_ffn: Callable[[ModelSpec], int], **shape: object) -> Callable[[ModelSpec], ModelSpec | None]:
    return lambda s: (replace(s, kv_channels=None, gated_linear_unit=True, moe_ffn_hidden_size=expert_ffn(s),
                              moe_shared_expert_intermediate_size=None, moe_layer_freq=1, **shape)
                      if s.num_moe_experts is not None and _heads_even(s) else None)


FAMILIES = (
    Family("llama2", "vocabulary 32,000, heads h/n wide, every MLP dense", _llama(32_000)),
    Family("llama3", "vocabulary 128,256, heads h/n wide, every MLP dense (llama4 too)", _llama(128_256)),
    Family("nemotron", "vocabulary 256,000, heads h/n wide", _ungated(vocab_size=lambda s: 256_000)),
    Family("gpt3", "vocabulary 51,200, MLP 4h, K and V as wide as Q",
           _ungated(vocab_size=lambda s: 51_200, ffn_hidden_size=lambda s: 4 * s.hidden_size,
                    num_query_groups=lambda s: None)),
    Family("mixtral", "vocabulary 32,000, heads h/n wide, every layer's experts ffn_hidden_size wide, none shared",
           _every_layer_moe(lambda s: s.ffn, vocab_size=32_000)),
    Family("qwen3", "heads h/n wide, every layer's experts moe_ffn_hidden_size wide, none shared",
           _every_layer_moe(lambda s: s.moe_ffn_hidden_size or s.ffn), always_halved=True),
)


def counts_for(spec: ModelSpec | None, given_flops: float | None, gpus_per_node: int,
               halved_possible: bool = True) -> list[Count]:
    """The model's count as NeMo 2.5 on and before 2.5 count it, then each family formula's reading of it
    where that differs; ``halved_possible`` False: the log predates the halving."""
    if given_flops is not None or spec is None:
        return given_count(given_flops)
    padding = padding_share(spec, gpus_per_node)
    counts = [count("full-attention", "NeMo's count before 2.5 (full s x s attention: the `dgxc` formula)", spec,
                    "dgxc", padding, verdict="agree_with_earlier_count", remark=EARLIER)]
    if halved_possible:
        counts.insert(0, count("megatron", "NeMo's count from 2.5 (causal attention halved: the `megatron` formula)",
                               spec, "megatron", padding))
    for family in FAMILIES:
        counts += [c for c in _family_counts(family, spec, padding, halved_possible)
                   if all(abs(c.flops_per_sample / o.flops_per_sample - 1) > SAME_COUNT for o in counts)]
    return counts


def _family_counts(family: Family, spec: ModelSpec, padding: float, halved_possible: bool) -> list[Count]:
    shape = family.shape(spec)
    if shape is None:
        return []
    remark = f"NeMo's `{family.name}` formula counts this model otherwise than ours ({family.reads})"
    conventions = [("megatron", "from 2.5, attention halved")] if halved_possible else []
    if not family.always_halved:
        conventions.append(("dgxc", "before 2.5, full attention"))
    return [count("nemo-formula" if formula == "megatron" else "nemo-formula-full-attention",
                  f"NeMo's `{family.name}` formula ({when}; {family.reads})", shape, formula, padding,
                  verdict="agree_with_framework_count", remark=remark) for formula, when in conventions]


# ------------------------------------------------------------------ the checks
def check_import(steps: list[Step], field_name: str, unit: Callable[[float], float], spec: ModelSpec | None,
                 given_flops: float | None, facts: Facts) -> list[Result]:
    """A NeMo 2 log's or event files' figures (``field_name``: printer_field or event_field of the name read;
    ``unit``: printed_unit or float32_unit) against the counts."""
    rates, too_spread = stated_rates(steps, facts.batch, unit)
    batches = {s.global_batch_size for s in steps if s.global_batch_size is not None}
    source = Source(rates, BATCH_CHANGES if batches - {facts.batch} else None,
                    missing=sum(step.tflops_per_gpu is None for step in steps), averaging=too_spread)
    counts = counts_for(spec, given_flops, facts.gpus_per_node, halved_possible=OLD_FIELD not in field_name)
    return check_log({field_name: source}, counts, replace(facts, framework_counts=UNREPRODUCED))
