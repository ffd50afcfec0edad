"""Named model shapes for runs whose logs do not carry one (``nemo-throughput import --model``).

Each matches the NeMo 2 config class named beside it (nemo_toolkit 2.5.0; checked against NeMo in
tests/nemo_tier), with the vocabulary NeMo's performance tools use for the family. The sequence
length is the config's default: benchmarks often run another one, given separately.
"""

from __future__ import annotations

from nemo_throughput.flops import ModelSpec


def _gpt3(layers: int, hidden: int, heads: int) -> ModelSpec:
    return ModelSpec(num_layers=layers, hidden_size=hidden, num_attention_heads=heads, seq_length=2048,
                     vocab_size=51200)


def _llama(layers: int, hidden: int, heads: int, groups: int, ffn: int, seq: int, vocab: int) -> ModelSpec:
    return ModelSpec(num_layers=layers, hidden_size=hidden, num_attention_heads=heads, num_query_groups=groups,
                     ffn_hidden_size=ffn, seq_length=seq, vocab_size=vocab, gated_linear_unit=True)


def _mixtral(layers: int, hidden: int, heads: int, ffn: int) -> ModelSpec:
    return ModelSpec(num_layers=layers, hidden_size=hidden, num_attention_heads=heads, num_query_groups=8,
                     ffn_hidden_size=ffn, seq_length=4096, vocab_size=32000, gated_linear_unit=True,
                     num_moe_experts=8, moe_router_topk=2, moe_ffn_hidden_size=ffn)


def _nemotron(layers: int, hidden: int, heads: int, groups: int, kv_channels: int | None = None) -> ModelSpec:
    return ModelSpec(num_layers=layers, hidden_size=hidden, num_attention_heads=heads, num_query_groups=groups,
                     ffn_hidden_size=4 * hidden, kv_channels=kv_channels, seq_length=4096, vocab_size=256000)


PRESETS: dict[str, ModelSpec] = {
    "gpt3-126m": _gpt3(12, 768, 12),  # GPTConfig126M
    "gpt3-5b": _gpt3(24, 4096, 32),  # GPTConfig5B
    "gpt3-20b": _gpt3(44, 6144, 48),  # GPTConfig20B
    "gpt3-40b": _gpt3(48, 8192, 64),  # GPTConfig40B
    "gpt3-175b": _gpt3(96, 12288, 96),  # GPTConfig175B
    "llama2-7b": _llama(32, 4096, 32, 32, 11008, 4096, 32000),  # Llama2Config7B
    "llama2-13b": _llama(40, 5120, 40, 40, 13824, 4096, 32000),  # Llama2Config13B
    "llama2-70b": _llama(80, 8192, 64, 8, 28672, 4096, 32000),  # Llama2Config70B
    "llama3-8b": _llama(32, 4096, 32, 8, 14336, 8192, 128256),  # Llama3Config8B
    "llama3-70b": _llama(80, 8192, 64, 8, 28672, 8192, 128256),  # Llama3Config70B
    "llama3.1-8b": _llama(32, 4096, 32, 8, 14336, 131072, 128256),  # Llama31Config8B
    "llama3.1-70b": _llama(80, 8192, 64, 8, 28672, 131072, 128256),  # Llama31Config70B
    "llama3.1-405b": _llama(126, 16384, 128, 8, 53248, 131072, 128256),  # Llama31Config405B
    "mixtral-8x7b": _mixtral(32, 4096, 32, 14336),  # MixtralConfig8x7B
    "mixtral-8x22b": _mixtral(56, 6144, 48, 16384),  # MixtralConfig8x22B
    "nemotron3-8b": _nemotron(32, 4096, 32, 32),  # Nemotron3Config8B
    "nemotron4-15b": _nemotron(32, 6144, 48, 8),  # Nemotron4Config15B
    "nemotron4-340b": _nemotron(96, 18432, 96, 8, kv_channels=192),  # Nemotron4Config340B
}

# The NeMo 2 config class each preset matches, for the check against NeMo.
NEMO_CONFIGS = {
    "gpt3-126m": "GPTConfig126M", "gpt3-5b": "GPTConfig5B", "gpt3-20b": "GPTConfig20B", "gpt3-40b": "GPTConfig40B",
    "gpt3-175b": "GPTConfig175B", "llama2-7b": "Llama2Config7B", "llama2-13b": "Llama2Config13B",
    "llama2-70b": "Llama2Config70B", "llama3-8b": "Llama3Config8B", "llama3-70b": "Llama3Config70B",
    "llama3.1-8b": "Llama31Config8B", "llama3.1-70b": "Llama31Config70B", "llama3.1-405b": "Llama31Config405B",
    "mixtral-8x7b": "MixtralConfig8x7B", "mixtral-8x22b": "MixtralConfig8x22B", "nemotron3-8b": "Nemotron3Config8B",
    "nemotron4-15b": "Nemotron4Config15B", "nemotron4-340b": "Nemotron4Config340B",
}


def preset(name: str) -> ModelSpec:
    try:
        return PRESETS[name.lower()]
    except KeyError:
        raise ValueError(f"Unknown model preset {name!r}; choose one of {sorted(PRESETS)} "
                         "or give the shape with --model-spec") from None
