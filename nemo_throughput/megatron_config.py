"""Reading a megatron-core ``TransformerConfig`` (NeMo 1.x ``cfg.model``, NeMo 2's ``GPTConfig``,
a Megatron-Bridge model provider) duck-typed, so that neither megatron-core nor the framework is
imported: attributes or mapping items (dataclass, DictConfig, dict)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nemo_throughput.values import is_int

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
    """Tensor / pipeline / context / virtual-pipeline / expert parallel sizes the config sets; any
    other value than a positive integer is refused, naming its key (a size of -2 made the
    data-parallel size -4, 2.7 was read as 2)."""
    sizes = {}
    for name, key in PARALLEL_KEYS.items():
        value = get(config, key)
        if value is None:
            continue
        if not is_int(value) or value < 1:
            raise ValueError(f"nemo-throughput: {key} in the model config must be a positive integer, got {value!r} "
                             f"({type(value).__name__}): fix it in the model config.")
        sizes[name] = value
    return sizes


_FP8_RECIPES = ("e4m3", "hybrid")
_FP4_FORMATS = ("e2m1", "nvfp4")


def low_precision(config: Any) -> str | None:
    """"fp4" or "fp8" when the config trains its GEMMs in that format, else None. megatron-core's ``fp4``
    is None or a format ("e2m1"), its ``fp8`` None or a recipe ("e4m3", "hybrid"); a bool is read as is.
    Any other text is refused: a misread flag would divide MFU by the wrong peak."""
    for key, names in (("fp4", _FP4_FORMATS), ("fp8", _FP8_RECIPES)):
        value = get(config, key)
        if value is None or isinstance(value, bool):
            if value:
                return key
            continue
        if isinstance(value, str) and value.lower() in names:
            return key
        raise ValueError(f"nemo-throughput: {key} in the model config must be null, true/false or one of "
                         f"{list(names)}, got {value!r}: fix it in the model config.")
    return None


def high_precision_layers(config: Any) -> int | None:
    """Transformer layers an fp8/fp4 run keeps in bf16 (megatron-core's ``first_last_layers_bf16`` with
    ``num_layers_at_start_in_bf16`` and ``num_layers_at_end_in_bf16``); None when the config does not say."""
    flag = get(config, "first_last_layers_bf16")
    if flag is None:
        return None
    if not flag:
        return 0
    return int(get(config, "num_layers_at_start_in_bf16") or 0) + int(get(config, "num_layers_at_end_in_bf16") or 0)


def formula_gaps(config: Any) -> list[str]:
    """What the model has that the GPT FLOPs formulas do not describe, so that FLOPs computed from
    its shape would be wrong: sliding-window layers would count as full attention (GPT-OSS: about
    +5 %), there is no multi-latent attention or multi-token prediction (DeepSeek-V3), and no
    state-space or convolution layer (Nemotron-H, Mamba 2, Evo 2: counted as transformer layers,
    1.09x to 1.76x the FLOPs)."""
    gaps = []
    window = get(config, "window_size")
    if window is not None:
        gaps.append(f"sliding-window attention (window_size={window!r})")
    if get(config, "multi_latent_attention") is True:
        gaps.append("multi-latent attention (multi_latent_attention=True)")
    if get(config, "mtp_num_layers"):
        gaps.append(f"multi-token prediction (mtp_num_layers={get(config, 'mtp_num_layers')})")
    pattern = get(config, "hybrid_override_pattern")
    if pattern or get(config, "is_hybrid_model") is True:  # every TransformerConfig has mamba_* defaults
        shown = f"{pattern[:24]}..." if isinstance(pattern, str) and len(pattern) > 24 else pattern
        gaps.append(f"Mamba, Hyena or hybrid layers (hybrid_override_pattern={shown!r})")
    return gaps


@dataclass(frozen=True)
class BatchRamp:
    """Megatron's batch-size ramp, ``rampup_batch_size: [start, increment, samples]``: the global batch
    starts at ``start`` and grows by ``increment`` every ``samples / ((final - start) / increment)``
    samples consumed; once more than ``samples`` are consumed it is the final one (megatron-core's
    RampupBatchsizeNumMicroBatchesCalculator). NeMo stops training at each change, so a ramped NeMo
    run is a chain of resumed segments; Megatron-Bridge ramps within one."""

    start: int
    increment: int
    samples: int

    @classmethod
    def from_config(cls, value: Any, final: int) -> BatchRamp | None:
        """The config's ``rampup_batch_size`` (None: no ramp), checked against the final global batch."""
        if value is None:
            return None
        if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or len(value) != 3 \
                or not all(is_int(v) for v in value) or value[0] < 1 or value[1] < 1 or value[2] < 0:
            raise ValueError(f"nemo-throughput: rampup_batch_size must be [start, increment, samples] (positive "
                             f"integers), got {value!r}: fix it in the config.")
        ramp = cls(*value)
        if ramp.start > final or (final - ramp.start) % ramp.increment:
            raise ValueError(f"nemo-throughput: rampup_batch_size {list(value)} cannot reach the global batch size "
                             f"{final} (start at most it, in steps of the increment): fix it in the config.")
        return ramp

    def steps_below(self, final: int, per_pass: int | None = None) -> int:
        """How many optimizer steps train a smaller batch than ``final``, counted as Megatron counts its
        consumed samples; ``per_pass``: micro-batch x data-parallel size, where Megatron rounds each batch
        down to a multiple of it (``decrease_batch_size_if_needed``)."""
        if self.start == final:
            return 0
        per_increment = self.samples / ((final - self.start) // self.increment)
        consumed = steps = 0
        while consumed <= self.samples:
            stage = int(consumed / per_increment)
            batch = self.start + stage * self.increment
            trained = batch // per_pass * per_pass if per_pass else batch
            if batch >= final or trained < 1:
                break

            def in_stage(taken: int) -> bool:  # the (taken + 1)-th step of the stage still trains `batch`
                after = consumed + taken * trained
                return after <= self.samples and int(after / per_increment) == stage

            taken = max(1, math.ceil(((stage + 1) * per_increment - consumed) / trained))
            while taken > 1 and not in_stage(taken - 1):  # the estimate, corrected by Megatron's own rule
                taken -= 1
            while in_stage(taken):
                taken += 1
            steps, consumed = steps + taken, consumed + taken * trained
        return steps
