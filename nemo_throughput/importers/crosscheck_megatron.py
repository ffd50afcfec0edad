"""The model TFLOP/s per GPU Megatron-LM, Megatron-Bridge and AMD Primus state, and the counts
Megatron has used for it (importers.crosscheck checks them).

Megatron-LM's ``num_floating_point_operations`` has changed: today (and Megatron-Bridge) causal
attention is halved; in 2024 it was counted in full; its first version (late 2023) took every MLP
as 4h wide and ungated. A figure agreeing with an earlier count means an earlier Megatron-LM, not
wrong facts.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

from nemo_throughput.flops import ModelSpec
from nemo_throughput.importers import megatron
from nemo_throughput.importers.crosscheck import (Count, Facts, Result, Source, StatedRate, check_log, count,
                                                  float32_unit, given_count, padding_share)
from nemo_throughput.importers.lines import read_lines
from nemo_throughput.importers.steps import Step

ITERATION_FIELD = "`... per GPU (TFLOP/s/GPU)` of the iteration lines"
STEP_TIME_FIELD = "`GPU utilization: ... TFLOP/s/GPU` of Megatron-Bridge's `Step Time :` lines"
EVENT_FIELD = "Megatron-LM's `throughput` scalar"
TFLOPS_UNIT = 0.1  # every framework prints the figure with {:.1f}
ITERATION_TIME_UNIT = 1e-4  # `elapsed time per iteration (ms): {:.1f}`, in seconds
STEP_TIME_UNIT = 1e-2  # Bridge's `Step Time : {:.2f}s`
EARLIER = "not with Megatron's current count: the run's Megatron-LM is an earlier one"


# ------------------------------------------------------------------ what the log states
def iteration_rates(steps: Iterable[Step], batch: int) -> list[StatedRate]:
    """The TFLOP/s per GPU the iteration lines state, each with its own time and batch."""
    return [StatedRate(s.line, s.tflops_per_gpu, s.seconds, TFLOPS_UNIT, ITERATION_TIME_UNIT,
                       s.global_batch_size or batch)
            for s in steps if s.tflops_per_gpu is not None]


def read_step_times(path: Path) -> list[tuple[int, float, float]]:
    """(line, seconds, TFLOP/s per GPU) of every Bridge `Step Time :` line, whichever rank printed it
    (rank 0 does, not the rank whose steps are read)."""
    return [(line.number, *found) for line in read_lines(path) if (found := megatron.bridge_step_time(line.text))]


def step_time_rates(step_times: list[tuple[int, float, float]], steps: list[Step],
                    batch: int) -> tuple[list[StatedRate], str | None]:
    """Bridge's `Step Time :` figures, with their own time (rounded to 10 ms), and why they are not
    checked: they name no iteration, so only a batch the whole log keeps can be theirs."""
    rates = [StatedRate(line, tflops, seconds, TFLOPS_UNIT, STEP_TIME_UNIT, batch)
             for line, seconds, tflops in step_times]
    if {s.global_batch_size for s in steps if s.global_batch_size is not None} - {batch}:
        return rates, "the batch changes within the log, and these lines name no iteration to take it from"
    return rates, None


# ------------------------------------------------------------------ the counts compared with
def counts_for(spec: ModelSpec | None, given_flops: float | None, gpus_per_node: int) -> list[Count]:
    """The counts to compare with, the current one first: a figure given as is, else the model's under
    Megatron's current count and the two it printed before."""
    if given_flops is not None or spec is None:
        return given_count(given_flops)
    padding = padding_share(spec, gpus_per_node)
    counts = [count("megatron", "Megatron's current count (causal attention halved)", spec, "megatron", padding),
              count("full-attention", "Megatron-LM's 2024 count (full s x s attention)", spec, "dgxc", padding,
                    verdict="agree_with_earlier_count", remark=EARLIER)]
    first = _first_megatron_lm_spec(spec)
    if first is not None:
        counts.append(count("4h-mlp", "Megatron-LM's first count (late 2023: every MLP 4h wide, ungated, dense)",
                            first, "dgxc", padding, verdict="agree_with_earlier_count", remark=EARLIER))
    return counts


def _first_megatron_lm_spec(spec: ModelSpec) -> ModelSpec | None:
    """The shape Megatron-LM's first count assumed (its 60 x B s L h^2 (...) formula): the model's
    layers, heads, groups and vocabulary, every MLP dense, ungated and 4h wide, heads h/n wide. That
    count with full attention is exactly flops.py's `dgxc` formula on this shape."""
    if spec.hidden_size % spec.num_attention_heads:
        return None
    return replace(spec, ffn_hidden_size=4 * spec.hidden_size, gated_linear_unit=False, kv_channels=None,
                   num_moe_experts=None, moe_ffn_hidden_size=None, moe_shared_expert_intermediate_size=None,
                   moe_layer_freq=1)


# ------------------------------------------------------------------ the checks
def check_import(steps: list[Step], step_times: list[tuple[int, float, float]], spec: ModelSpec | None,
                 given_flops: float | None, facts: Facts) -> list[Result]:
    """An imported Megatron log's checks: its iteration lines' figures, and its Bridge `Step Time :`
    lines' (``step_times``, from read_step_times)."""
    stated = iteration_rates(steps, facts.batch)
    sources = {ITERATION_FIELD: Source(stated, missing=len(steps) - len(stated)),
               STEP_TIME_FIELD: Source(*step_time_rates(step_times, steps, facts.batch))}
    return check_log(sources, counts_for(spec, given_flops, facts.gpus_per_node), facts)


def check_events(steps: list[Step], spec: ModelSpec | None, given_flops: float | None, facts: Facts) -> list[Result]:
    """Megatron-LM event files' `throughput` figures, each against the `iteration-time` of its iteration (the
    time it divides by), both float32."""
    stated = [StatedRate(s.line, s.tflops_per_gpu, s.seconds, float32_unit(s.tflops_per_gpu),
                         float32_unit(s.seconds), s.global_batch_size or facts.batch)
              for s in steps if s.tflops_per_gpu is not None]
    sources = {EVENT_FIELD: Source(stated, missing=len(steps) - len(stated))}
    return check_log(sources, counts_for(spec, given_flops, facts.gpus_per_node), facts)
