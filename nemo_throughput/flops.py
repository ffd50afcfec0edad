"""Model FLOPs per training sample for GPT-style decoder transformers.

Two conventions are in common use and both appear in published numbers, so both are offered
and every result is recorded together with the name of the formula that produced it:

``"megatron"``
    Megatron-LM's ``num_floating_point_operations`` (``megatron/training/training.py``) for
    standard attention: MHA/GQA projections, causal attention counted at half the ``s x s``
    score matrix, SwiGLU as three FFN GEMMs, routed and shared MoE experts, logits over the
    (padded) vocabulary.
``"dgxc"``
    The convention of NVIDIA's DGX Cloud benchmarking recipes and NeMo's ``flops_formulas``:
    the same GEMM accounting but the full ``s x s`` attention (no causal halving). For dense
    models: ``s * (12*L*h^2*(1 + g/n + s/h) + 18*L*F*h + 6*V*h)`` (SwiGLU; 12*L*F*h without).

Both count training as 3x the forward pass (forward, data gradient, weight gradient) and a
multiply-add as 2 FLOPs. Activation recomputation is not model FLOPs and is not counted.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from nemo_throughput.values import is_int

FORMULAS = ("megatron", "dgxc")
MEASURED = "measured"  # not a formula: the FLOPs of one real training step, counted (measured_flops.py)
FLOPS_FORMULAS = (*FORMULAS, MEASURED)  # the choices of the flops_formula setting
# How each convention counts causal attention's s x s score matrix: Megatron halves it; DGX Cloud
# and torch's FlopCounterMode (which counts scaled_dot_product_attention whatever its mask) do not.
CAUSAL_ATTENTION = {"megatron": "half", "dgxc": "full", MEASURED: "full"}

_TRAIN_PASSES = 3  # forward + backward data-gradient + backward weight-gradient GEMMs
_FMA = 2  # one multiply-add = 2 floating-point operations


@dataclass(frozen=True)
class ModelSpec:
    """Shape of a GPT-style decoder; field names follow megatron-core's ``TransformerConfig``.

    ``vocab_size`` is the size of the logits GEMM, i.e. the padded vocabulary when the
    framework pads it (Megatron pads to a multiple of ``make_vocab_size_divisible_by * TP``).
    ``moe_layer_freq`` is an int (every k-th layer, starting with layer 0, is MoE) or a list
    with one 0/1 entry per layer, as in megatron-core.
    """

    num_layers: int
    hidden_size: int
    num_attention_heads: int
    seq_length: int
    vocab_size: int
    ffn_hidden_size: int | None = None  # default 4 * hidden_size
    num_query_groups: int | None = None  # default num_attention_heads (MHA)
    kv_channels: int | None = None  # default hidden_size // num_attention_heads
    gated_linear_unit: bool = False  # SwiGLU / GeGLU
    num_moe_experts: int | None = None  # None: dense
    moe_router_topk: int = 2
    moe_ffn_hidden_size: int | None = None  # default ffn_hidden_size
    moe_shared_expert_intermediate_size: int | None = None
    moe_layer_freq: int | Sequence[int] = field(default=1)

    def __post_init__(self) -> None:
        for name in ("num_layers", "hidden_size", "num_attention_heads", "seq_length", "vocab_size"):
            require_positive_int(name, getattr(self, name))
        for name in _OPTIONAL_INTS:
            value = getattr(self, name)
            if value is not None:
                require_positive_int(name, value)
        _check_field_type("gated_linear_unit", self.gated_linear_unit)
        _check_field_type("moe_router_topk", self.moe_router_topk)
        _check_field_type("moe_layer_freq", self.moe_layer_freq)
        if self.num_attention_heads % self.groups:
            raise ValueError(
                f"ModelSpec: num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_query_groups={self.groups}; fix one of them."
            )
        if self.kv_channels is None and self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"ModelSpec: hidden_size={self.hidden_size} is not divisible by "
                f"num_attention_heads={self.num_attention_heads}; pass kv_channels explicitly."
            )
        if self.num_moe_experts is not None:
            require_positive_int("moe_router_topk", self.moe_router_topk)
            if self.moe_router_topk > self.num_moe_experts:
                raise ValueError(
                    f"ModelSpec: moe_router_topk={self.moe_router_topk} exceeds "
                    f"num_moe_experts={self.num_moe_experts}."
                )
            _ = self.moe_layer_pattern  # raises if moe_layer_freq is malformed

    @classmethod
    def check_keys(cls, values: Mapping[str, Any]) -> None:
        """Reject keys that are not ModelSpec fields, naming the valid ones."""
        unknown = sorted(set(values) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(f"Unknown model_spec key(s) {unknown}; valid keys: {list(cls.__dataclass_fields__)}")

    @classmethod
    def check_fields(cls, values: Mapping[str, Any]) -> None:
        """Check the keys and the type of each value of a possibly partial spec (such as the
        ``model_spec`` setting), so that a wrong value fails when it is given, naming it."""
        cls.check_keys(values)
        for name, value in values.items():
            if value is not None or name not in _OPTIONAL_INTS:
                _check_field_type(name, value, prefix="model_spec.")

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> ModelSpec:
        """Build from a mapping, rejecting keys that are not ModelSpec fields."""
        cls.check_keys(values)
        values = dict(values)
        if isinstance(values.get("moe_layer_freq"), list):
            values["moe_layer_freq"] = tuple(values["moe_layer_freq"])
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        values = asdict(self)
        if isinstance(self.moe_layer_freq, (tuple, list)):
            values["moe_layer_freq"] = list(self.moe_layer_freq)
        return values

    @property
    def ffn(self) -> int:
        return self.ffn_hidden_size or 4 * self.hidden_size

    @property
    def groups(self) -> int:
        return self.num_query_groups or self.num_attention_heads

    @property
    def head_dim(self) -> int:
        return self.kv_channels or self.hidden_size // self.num_attention_heads

    @property
    def moe_layer_pattern(self) -> list[int]:
        """One entry per layer: 1 where the MLP is a mixture of experts."""
        if self.num_moe_experts is None:
            return [0] * self.num_layers
        freq = self.moe_layer_freq
        if is_int(freq):
            require_positive_int("moe_layer_freq", freq)
            return [1 if i % freq == 0 else 0 for i in range(self.num_layers)]
        pattern = [int(x) for x in freq]
        if len(pattern) != self.num_layers or set(pattern) - {0, 1}:
            raise ValueError(
                f"ModelSpec: moe_layer_freq as a list needs one 0/1 entry per layer "
                f"({self.num_layers}), got {list(freq)}."
            )
        return pattern

    def num_parameters(self) -> int:
        """Approximate parameter count (weights of the GEMMs and the tied embedding).

        Used only to derive a readable model name such as ``gpt-126m``.
        """
        h, q, kv = self.hidden_size, self.head_dim * self.num_attention_heads, self.head_dim * self.groups
        glu = 3 if self.gated_linear_unit else 2
        attention = h * (q + 2 * kv) + q * h
        moe_layers = sum(self.moe_layer_pattern)
        dense_layers = self.num_layers - moe_layers
        experts = (self.num_moe_experts or 0) * glu * h * (self.moe_ffn_hidden_size or self.ffn)
        shared = glu * h * (self.moe_shared_expert_intermediate_size or 0)
        return (
            self.num_layers * attention
            + dense_layers * glu * h * self.ffn
            + moe_layers * (experts + shared)
            + self.vocab_size * h
        )

    def default_name(self) -> str:
        """A readable name from the parameter count, e.g. ``gpt-126m`` or ``gpt-70b``."""
        params = self.num_parameters()
        if params >= 1e9:
            size = f"{params / 1e9:.3g}b"
        else:
            size = f"{params / 1e6:.3g}m"
        return f"gpt-{size}"


def model_flops_per_sample(spec: ModelSpec, formula: str = "megatron") -> float:
    """Training FLOPs (forward + backward) for one sample of ``spec.seq_length`` tokens."""
    per_token, per_token_pair = flops_terms(spec, formula)
    s = spec.seq_length
    return float(s * per_token + s * s * per_token_pair)


def flops_terms(spec: ModelSpec, formula: str = "megatron") -> tuple[float, float]:
    """Training FLOPs of a sequence of s tokens as ``per_token * s + per_token_pair * s**2``: the
    GEMMs, which run on every token slot (padding too), and attention's s x s scores. A packed
    batch computes ``per_token * slots + per_token_pair * sum(s_i**2)`` over its sequences."""
    if formula not in FORMULAS:
        raise ValueError(f"Unknown FLOPs formula {formula!r}; choose one of {list(FORMULAS)}.")
    h = spec.hidden_size
    query = spec.head_dim * spec.num_attention_heads  # query projection width
    key_value = spec.head_dim * spec.groups  # each of K and V
    glu = 3 if spec.gated_linear_unit else 2  # GEMMs per MLP, counted in units of h x ffn

    moe_layers = sum(spec.moe_layer_pattern)
    dense_layers = spec.num_layers - moe_layers
    routed_ffn = (spec.moe_ffn_hidden_size or spec.ffn) * spec.moe_router_topk
    shared_ffn = spec.moe_shared_expert_intermediate_size or 0

    per_token = _TRAIN_PASSES * _FMA * (
        h * glu * (spec.ffn * dense_layers + (routed_ffn + shared_ffn) * moe_layers)
        + spec.num_layers * (h * (query + 2 * key_value) + query * h)  # QKV + output projection
        + h * spec.vocab_size  # logits
    )
    # QK^T and softmax(QK^T)V: 2 GEMMs of s x s x query per layer; causal masking halves them.
    causal = 0.5 if formula == "megatron" else 1.0
    per_token_pair = _TRAIN_PASSES * _FMA * 2 * query * causal * spec.num_layers
    return float(per_token), float(per_token_pair)


# A flops_per_sample this far from every convention's count for the model's shape is another unit or another
# count (per token, per batch, GFLOPs, the forward pass only): MFU divides by it all the same, so it is said.
# The conventions themselves differ by less (causal attention halved or not: 1.7x at 128K tokens).
FLOPS_UNLIKE_THE_SHAPE = 2.0


def flops_unlike_the_shape(given: float, spec: ModelSpec, global_batch_size: int | None = None) -> str | None:
    """Why a given ``flops_per_sample`` cannot be this shape's FLOPs per sample, in words, or None
    where it is within FLOPS_UNLIKE_THE_SHAPE of a convention's count (FORMULAS)."""
    counts = {formula: model_flops_per_sample(spec, formula) for formula in FORMULAS}
    nearest = min(counts, key=lambda formula: abs(math.log(given / counts[formula])))
    ratio = given / counts[nearest]
    if 1 / FLOPS_UNLIKE_THE_SHAPE <= ratio <= FLOPS_UNLIKE_THE_SHAPE:
        return None
    return (f"flops_per_sample {given:.4g} is {ratio:.3g}x the {counts[nearest]:.4g} FLOPs the model's shape counts "
            f"per {spec.seq_length:,}-token sample ({nearest!r}): {_slip(ratio, spec.seq_length, global_batch_size)} "
            f"MFU divides by the {given:.4g} given.")


def _slip(ratio: float, seq_length: int, global_batch_size: int | None) -> str:
    """The likeliest slip that makes a given count ``ratio`` times the shape's."""
    slips = [(1 / seq_length, "per token rather than per sample?"), (1e-9, "in GFLOPs?"), (1e-12, "in TFLOPs?"),
             (1 / _TRAIN_PASSES, "the forward pass only (training is 3x)?")]
    if global_batch_size and global_batch_size > 1:
        slips.append((global_batch_size, "per global batch rather than per sample?"))
    value, said = min(slips, key=lambda slip: abs(math.log(ratio / slip[0])))
    return said if abs(math.log(ratio / value)) <= math.log(FLOPS_UNLIKE_THE_SHAPE) else "another model's count?"


_OPTIONAL_INTS = ("ffn_hidden_size", "num_query_groups", "kv_channels", "num_moe_experts", "moe_ffn_hidden_size",
                  "moe_shared_expert_intermediate_size")


def _check_field_type(name: str, value: Any, prefix: str = "ModelSpec: ") -> None:
    """One field's value type; bools are never counted as numbers, nor strings as bools."""
    if name == "gated_linear_unit":
        if not isinstance(value, bool):
            raise ValueError(f"{prefix}{name} must be true or false, got {value!r} ({type(value).__name__}).")
    elif name == "moe_layer_freq":
        if is_int(value):
            require_positive_int(name, value, prefix)
        elif isinstance(value, str) or not isinstance(value, Sequence) or not all(is_int(x) for x in value):
            raise ValueError(f"{prefix}{name} must be a positive integer or a list of 0/1 per layer, "
                             f"got {value!r} ({type(value).__name__}).")
    else:
        require_positive_int(name, value, prefix)


def require_positive_int(name: str, value: Any, prefix: str = "ModelSpec: ") -> None:
    """Raise ValueError naming ``name`` unless ``value`` is an int > 0 (a bool is not one)."""
    if not is_int(value) or value <= 0:
        raise ValueError(f"{prefix}{name} must be a positive integer, got {value!r}.")
