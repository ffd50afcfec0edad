"""From a step time to tokens/s, MFU and time to train (docs/arithmetic.md gives the formulas and a worked example)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

SECONDS_PER_DAY = 86_400
ONE_TRILLION = 1e12
RATES = {"tokens": "tokens_per_s", "samples": "samples_per_s"}  # the rate setting -> throughput.primary


class Metric(NamedTuple):
    """A figure of a run, as the loggers get it (under ``throughput/``) and the docs list it."""

    key: str
    unit: str
    meaning: str


# What a step time gives (Workload.metrics), in this order.
METRICS = (
    Metric("tokens_per_s", "tokens/s", "all GPUs; real tokens where packed or padded batches are counted"),
    Metric("tokens_per_s_per_gpu", "tokens/s", "tokens_per_s / GPUs"),
    Metric("tokens_per_s_with_padding", "tokens/s", "token slots/s, padding included (counted batches only)"),
    Metric("samples_per_s", "samples/s", "all GPUs"),
    Metric("model_tflops_per_gpu", "TFLOPS", "model FLOPs per step / step time / GPUs"),
    Metric("mfu", "fraction", "model_tflops_per_gpu / the dtype's dense peak (absent above 1)"),
    Metric("mfu_above_peak", "fraction", "the MFU computed when above 1: the peak or the FLOPs are wrong"),
    Metric("days_to_train_1t_tokens", "days", "10^12 tokens at tokens_per_s"),
)
METRIC_KEYS = tuple(metric.key for metric in METRICS)


def flops_per_gpu_s(*, flops_per_step: float, step_time_s: float, num_gpus: int) -> float:
    """Achieved model FLOP/s per GPU."""
    return flops_per_step / step_time_s / num_gpus


def mfu(*, flops_per_step: float, step_time_s: float, num_gpus: int, peak_tflops: float) -> float:
    """Model FLOPs utilisation as a fraction: achieved model FLOP/s per GPU over its peak."""
    return flops_per_gpu_s(flops_per_step=flops_per_step, step_time_s=step_time_s, num_gpus=num_gpus) / (
        peak_tflops * 1e12)


def days_to_train(tokens: float, tokens_per_s: float) -> float:
    return tokens / tokens_per_s / SECONDS_PER_DAY


@dataclass(frozen=True)
class CountedStep:
    """A mean measured step as its batches held it, over all data-parallel replicas (packed or
    padded batches, counted on the device: batches.TokenCounter)."""

    tokens: float | None  # real tokens; None where only the slots were counted (Megatron-Bridge's accumulators)
    slots: float  # token slots, padding included
    seqlen_sq: float  # sum over sequences of length squared: attention's term
    flops: float | None  # model FLOPs computed (flops.flops_terms); None: the FLOPs convention has no such terms
    source: str  # where the counts were read: a batch key, or the framework's accumulators

    @property
    def padding_share(self) -> float | None:
        """Fraction of the slots that held padding."""
        return 1.0 - self.tokens / self.slots if self.tokens is not None and self.slots else None


@dataclass(frozen=True)
class Workload:
    """What one optimizer step processes, and on how many GPUs."""

    global_batch_size: int
    seq_length: int | None  # None: samples are not token sequences (images...): no token figures
    num_gpus: int
    flops_per_sample: float | None = None
    peak_tflops: float | None = None
    counted: CountedStep | None = None  # counted from the batches: replaces the config's tokens and FLOPs

    @property
    def tokens_per_step(self) -> int | None:
        """Tokens per step from the config: global batch x sequence length (padding included)."""
        return self.global_batch_size * self.seq_length if self.seq_length else None

    @property
    def step_tokens(self) -> float | None:
        """The tokens the rates count: the batches' real tokens where counted, else the config's."""
        counted = self.counted.tokens if self.counted is not None else None
        return counted if counted is not None else self.tokens_per_step

    @property
    def step_flops(self) -> float | None:
        """Model FLOPs per step: the ones the batches' lengths computed where counted, else global
        batch x FLOPs per sample."""
        if self.counted is not None and self.counted.flops is not None:
            return self.counted.flops
        return self.global_batch_size * self.flops_per_sample if self.flops_per_sample is not None else None

    def metrics(self, step_time_s: float | None) -> dict[str, float | None]:
        """Throughput figures for a (global, slowest-rank) step time in seconds; None: no steps."""
        if not step_time_s:
            return dict.fromkeys(METRIC_KEYS)
        tokens_per_s = self.step_tokens / step_time_s if self.step_tokens else None
        achieved = utilisation = None  # FLOP/s per GPU, and over the peak
        if self.step_flops is not None:
            achieved = flops_per_gpu_s(flops_per_step=self.step_flops, step_time_s=step_time_s, num_gpus=self.num_gpus)
            utilisation = achieved / (self.peak_tflops * 1e12) if self.peak_tflops else None
        # Above 100 % the peak or the FLOPs model is wrong: no MFU is reported, the figure is kept as a flag.
        above_peak = utilisation if utilisation is not None and utilisation > 1 else None
        return {
            "tokens_per_s": tokens_per_s,
            "tokens_per_s_per_gpu": tokens_per_s / self.num_gpus if tokens_per_s else None,
            "tokens_per_s_with_padding": self.counted.slots / step_time_s if self.counted is not None else None,
            "samples_per_s": self.global_batch_size / step_time_s,
            "model_tflops_per_gpu": achieved / 1e12 if achieved is not None else None,
            "mfu": None if above_peak else utilisation,
            "mfu_above_peak": above_peak,
            "days_to_train_1t_tokens": days_to_train(ONE_TRILLION, tokens_per_s) if tokens_per_s else None,
        }
