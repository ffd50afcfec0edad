"""FLOPs formulas against closed forms worked out by hand and the public worked example."""

import pytest

from nemo_throughput.flops import ModelSpec, flops_unlike_the_shape, model_flops_per_sample
from nemo_throughput.throughput import Workload, days_to_train, mfu

LLAMA31_70B = ModelSpec(num_layers=80, hidden_size=8192, num_attention_heads=64, num_query_groups=8,
                        ffn_hidden_size=28672, vocab_size=128256, seq_length=8192, gated_linear_unit=True)


def test_dgxc_llama31_70b_is_the_recipes_3_94e15():
    s, L, h, g, n, F, V = 8192, 80, 8192, 8, 64, 28672, 128256
    closed_form = s * (12 * L * h**2 * (1 + g / n + s / h) + 18 * L * F * h + 6 * V * h)
    flops = model_flops_per_sample(LLAMA31_70B, "dgxc")
    assert flops == closed_form
    assert flops == pytest.approx(3.94e15, rel=1e-3)


def test_worked_example_tokens_days_and_mfu():
    """Llama 3.1 70B, 64 x H100 FP8, GBS 128, seq 8192, 11.31 s/step (the worked example of docs/arithmetic.md)."""
    metrics = Workload(global_batch_size=128, seq_length=8192, num_gpus=64,
                       flops_per_sample=3.94e15, peak_tflops=1979).metrics(11.31)
    assert metrics["tokens_per_s"] == pytest.approx(92_712, abs=1)
    assert metrics["days_to_train_1t_tokens"] == pytest.approx(124.84, abs=0.01)
    assert 100 * metrics["mfu"] == pytest.approx(35.21, abs=0.005)
    assert mfu(flops_per_step=128 * 3.94e15, step_time_s=11.31, num_gpus=64, peak_tflops=1979) == metrics["mfu"]
    assert days_to_train(1e12, 92_712) == pytest.approx(124.84, abs=0.01)


@pytest.mark.parametrize("L, h, s, V, literal", [
    (96, 12288, 2048, 51200, 2_174_868_359_479_296),  # GPT-3 175B
    (12, 768, 2048, 50304, 1_750_333_390_848),  # GPT-3 126M, padded vocabulary
])
def test_megatron_dense_gpt3_matches_the_paper_formula_with_causal_halving(L, h, s, V, literal):
    # Narayanan et al. (2021): 72 B s L h^2 (1 + s/(6h) + V/(12hL)); causal masking halves s/(6h).
    spec = ModelSpec(num_layers=L, hidden_size=h, num_attention_heads=h // 128, seq_length=s, vocab_size=V)
    expected = 72 * s * L * h**2 * (1 + s / (12 * h) + V / (12 * h * L))
    assert model_flops_per_sample(spec) == pytest.approx(expected, rel=1e-12)
    assert model_flops_per_sample(spec) == literal


def test_megatron_gqa_swiglu_llama3_8b():
    s, L, h, g, n, F, V = 8192, 32, 4096, 8, 32, 14336, 128256
    spec = ModelSpec(num_layers=L, hidden_size=h, num_attention_heads=n, num_query_groups=g,
                     ffn_hidden_size=F, seq_length=s, vocab_size=V, gated_linear_unit=True)
    # per token and layer: QKV+out projections 12h^2(1+g/n), causal attention 6hs, SwiGLU 18hF
    per_token = L * (12 * h * h * (1 + g / n) + 6 * h * s + 18 * h * F) + 6 * h * V
    assert model_flops_per_sample(spec) == s * per_token == 421_645_529_382_912


def test_megatron_moe_every_layer_top2_mixtral_8x7b():
    s, L, h, g, n, F, V, k = 4096, 32, 4096, 8, 32, 14336, 32000, 2
    spec = ModelSpec(num_layers=L, hidden_size=h, num_attention_heads=n, num_query_groups=g, ffn_hidden_size=F,
                     seq_length=s, vocab_size=V, gated_linear_unit=True, num_moe_experts=8, moe_router_topk=k)
    per_token = L * (12 * h * h * (1 + g / n) + 6 * h * s + 18 * h * F * k) + 6 * h * V
    assert model_flops_per_sample(spec) == s * per_token == 326_477_644_038_144


def test_megatron_moe_layer_frequency_and_shared_experts():
    s, L, h, n, F, Fm, Fs, V, k = 1024, 4, 1024, 16, 4096, 512, 2048, 32768, 4
    base = dict(num_layers=L, hidden_size=h, num_attention_heads=n, ffn_hidden_size=F, seq_length=s,
                vocab_size=V, gated_linear_unit=True, num_moe_experts=16, moe_router_topk=k,
                moe_ffn_hidden_size=Fm, moe_shared_expert_intermediate_size=Fs)
    attention = 24 * h * h + 6 * h * s  # MHA projections + causal attention, per token and layer
    dense_mlp, moe_mlp = 18 * h * F, 18 * h * (Fm * k + Fs)
    # every second layer (0 and 2) is MoE
    every_other = ModelSpec(**base, moe_layer_freq=2)
    assert every_other.moe_layer_pattern == [1, 0, 1, 0]
    assert model_flops_per_sample(every_other) == s * (L * attention + 2 * dense_mlp + 2 * moe_mlp + 6 * h * V)
    # an explicit pattern: only the last layer is MoE
    last_only = ModelSpec(**base, moe_layer_freq=(0, 0, 0, 1))
    assert model_flops_per_sample(last_only) == s * (L * attention + 3 * dense_mlp + moe_mlp + 6 * h * V)


def test_dgxc_differs_from_megatron_exactly_by_the_causal_half():
    s, L, h = LLAMA31_70B.seq_length, LLAMA31_70B.num_layers, LLAMA31_70B.hidden_size
    difference = model_flops_per_sample(LLAMA31_70B, "dgxc") - model_flops_per_sample(LLAMA31_70B, "megatron")
    assert difference == s * L * 6 * h * s


def test_kv_channels_decouple_attention_width_from_hidden_size():
    wide = ModelSpec(num_layers=1, hidden_size=64, num_attention_heads=4, kv_channels=32, seq_length=8,
                     vocab_size=128)
    h, q, s, F, V = 64, 4 * 32, 8, 4 * 64, 128  # query width 128 != hidden 64
    per_token = 6 * (h * 3 * q + q * h) + 6 * q * s + 12 * h * F + 6 * h * V
    assert model_flops_per_sample(wide) == 8 * per_token


def test_unknown_formula_names_the_valid_ones():
    with pytest.raises(ValueError, match=r"Unknown FLOPs formula 'palm'.*megatron.*dgxc"):
        model_flops_per_sample(LLAMA31_70B, "palm")


@pytest.mark.parametrize("changes, message", [
    ({"num_layers": 0}, "num_layers must be a positive integer"),
    ({"hidden_size": -8}, "hidden_size must be a positive integer"),
    ({"num_query_groups": 3}, "not a multiple of num_query_groups=3"),
    ({"hidden_size": 100, "num_attention_heads": 3}, "pass kv_channels"),
    ({"num_moe_experts": 2, "moe_router_topk": 4}, "moe_router_topk=4 exceeds num_moe_experts=2"),
    ({"num_moe_experts": 4, "moe_layer_freq": (1, 0)}, "one 0/1 entry per layer"),
])
def test_invalid_specs_say_what_to_fix(changes, message):
    values = dict(num_layers=4, hidden_size=64, num_attention_heads=8, seq_length=16, vocab_size=128) | changes
    with pytest.raises(ValueError, match=message):
        ModelSpec(**values)


def test_from_dict_rejects_unknown_keys_and_round_trips():
    with pytest.raises(ValueError, match=r"Unknown model_spec key\(s\) \['layers'\].*num_layers"):
        ModelSpec.from_dict({"layers": 2})
    spec = ModelSpec(num_layers=4, hidden_size=64, num_attention_heads=8, seq_length=16, vocab_size=128,
                     num_moe_experts=4, moe_layer_freq=(1, 0, 1, 0))
    assert ModelSpec.from_dict(spec.to_dict()) == spec


def test_default_name_from_parameter_count():
    gpt3_126m = ModelSpec(num_layers=12, hidden_size=768, num_attention_heads=12, seq_length=2048,
                          vocab_size=50304)
    assert gpt3_126m.default_name() == "gpt-124m"  # 85M in the layers + 39M tied embedding
    assert LLAMA31_70B.default_name() == "gpt-69.5b"


@pytest.mark.parametrize("changes, message", [
    ({"gated_linear_unit": "no"}, r"gated_linear_unit must be true or false, got 'no'"),
    ({"gated_linear_unit": 1}, r"gated_linear_unit must be true or false, got 1"),
    ({"num_layers": 2.0}, r"num_layers must be a positive integer, got 2.0"),
    ({"moe_router_topk": "2"}, r"moe_router_topk must be a positive integer, got '2'"),
    ({"moe_layer_freq": "1"}, r"moe_layer_freq must be a positive integer or a list"),
])
def test_model_spec_rejects_values_of_the_wrong_type(changes, message):
    shape = dict(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=128, vocab_size=256)
    with pytest.raises(ValueError, match=message):
        ModelSpec(**(shape | changes))


def test_check_fields_validates_a_partial_spec():
    ModelSpec.check_fields({"vocab_size": 64, "gated_linear_unit": True, "moe_layer_freq": [0, 1]})
    with pytest.raises(ValueError, match="model_spec.gated_linear_unit must be true or false, got 'no'"):
        ModelSpec.check_fields({"gated_linear_unit": "no"})
    with pytest.raises(ValueError, match=r"Unknown model_spec key\(s\) \['layers'\]"):
        ModelSpec.check_fields({"layers": 2})


# --------------------------------------------------- a given flops_per_sample held against the shape's count
LLAMA3_8B = ModelSpec(num_layers=32, hidden_size=4096, num_attention_heads=32, num_query_groups=8,
                      ffn_hidden_size=14336, seq_length=8192, vocab_size=128256, gated_linear_unit=True)


@pytest.mark.parametrize("factor, said", [
    (1 / 8192, "per token rather than per sample?"),
    (1e-9, "in GFLOPs?"),
    (1e-12, "in TFLOPs?"),
    (1 / 3, "the forward pass only (training is 3x)?"),
    (128, "per global batch rather than per sample?"),  # the global batch below
    (7.0, "another model's count?"),  # a 56B model's count, say
])
def test_a_given_flops_per_sample_far_from_the_shape_s_count_names_the_likely_slip(factor, said):
    count = model_flops_per_sample(LLAMA3_8B, "megatron")
    unlike = flops_unlike_the_shape(count * factor, LLAMA3_8B, global_batch_size=128)
    assert unlike is not None and unlike.endswith(f": {said} MFU divides by the {count * factor:.4g} given."), unlike


def test_either_convention_s_count_and_what_lies_between_them_are_not_said():
    """The conventions differ by causal attention's half: 1.6x at 128K tokens; each is a right count."""
    long = ModelSpec(**{**LLAMA3_8B.to_dict(), "seq_length": 131072})
    megatron, dgxc = model_flops_per_sample(long, "megatron"), model_flops_per_sample(long, "dgxc")
    assert dgxc / megatron > 1.5
    for given in (megatron, dgxc, (megatron + dgxc) / 2, 1.9 * dgxc, megatron / 1.9):
        assert flops_unlike_the_shape(given, long) is None
    assert "2.1x the" in flops_unlike_the_shape(2.1 * dgxc, long) and "'dgxc'" in flops_unlike_the_shape(2.1 * dgxc, long)
    assert flops_unlike_the_shape(megatron / 2.1, long).startswith(f"flops_per_sample {megatron / 2.1:.4g} is 0.476x")
