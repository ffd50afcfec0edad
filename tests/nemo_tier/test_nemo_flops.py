"""Our FLOPs for NeMo recipes' models against NeMo 2.5.0's own `nemo.utils.flops_formulas`.

NeMo 2.5.0's family formulas (gpt3, llama2, llama3, nemotron, mixtral) halve the causal
attention, as Megatron-LM does: they equal our "megatron" formula. Our "dgxc" formula is the
published DGX Cloud recipe convention (full attention), i.e. those formulas without the half.
NeMo's generic `transformer()` counts a gated MLP as two GEMMs instead of three: for SwiGLU
models it is lower than Megatron-LM's count by exactly 6*h*F per token and layer.
"""

import fiddle as fdl
import pytest
from nemo.collections import llm
from nemo.collections.common.parts.perf_metrics_utils import LLM_VOCAB_SIZE_MAP
from nemo.utils import flops_formulas
from nemo.utils.flops_formulas import FLOPSConfig

from nemo_throughput.adapters.nemo import read_module
from nemo_throughput.flops import ModelSpec, model_flops_per_sample
from nemo_throughput.presets import NEMO_CONFIGS, PRESETS

GBS = 128


def recipe_spec(recipe_name: str, vocab_family: str) -> ModelSpec:
    """The ModelSpec our reader takes from the recipe's real model and config objects."""
    recipe = getattr(llm, recipe_name).pretrain_recipe(name="t", num_nodes=1, num_gpus_per_node=8)
    if hasattr(recipe.model.config, "apply_rope_fusion"):
        recipe.model.config.apply_rope_fusion = False
    model = fdl.build(recipe.model)
    fields = read_module(model).spec_fields
    fields.setdefault("seq_length", recipe.data.seq_length)
    return ModelSpec.from_dict({**fields, "vocab_size": LLM_VOCAB_SIZE_MAP[vocab_family]})


def nemo_config(spec: ModelSpec) -> FLOPSConfig:
    return FLOPSConfig(gbs=GBS, enc_seq_len=spec.seq_length, hs=spec.hidden_size, layers=spec.num_layers,
                       ffn_hs=spec.moe_ffn_hidden_size or spec.ffn, attention_heads=spec.num_attention_heads,
                       query_groups=spec.groups,
                       moe_router_topk=spec.moe_router_topk if spec.num_moe_experts else None,
                       vocab_size=spec.vocab_size)


@pytest.mark.parametrize("recipe_name, family", [
    ("gpt3_175b", "gpt3"),
    ("llama2_7b", "llama2"),
    ("llama3_8b", "llama3"),
    ("llama3_70b", "llama3"),
    ("nemotron4_15b", "nemotron"),
    ("mixtral_8x7b", "mixtral"),
])
def test_nemo_family_formulas_equal_our_megatron_formula(recipe_name, family):
    spec = recipe_spec(recipe_name, family)
    theirs = getattr(flops_formulas, family)(nemo_config(spec))
    assert GBS * model_flops_per_sample(spec, "megatron") == pytest.approx(theirs, rel=1e-12)
    # dgxc adds back the causal half of the attention scores
    half_attention = GBS * spec.seq_length**2 * spec.num_layers * 6 * spec.hidden_size
    assert GBS * model_flops_per_sample(spec, "dgxc") == pytest.approx(theirs + half_attention, rel=1e-12)


def test_llama31_70b_dgxc_is_the_published_3_94e15():
    spec = recipe_spec("llama31_70b", "llama3")
    assert model_flops_per_sample(spec, "dgxc") == pytest.approx(3.94e15, rel=1e-3)


def test_nemo_generic_transformer_formula():
    gpt3 = recipe_spec("gpt3_175b", "gpt3")  # dense, MHA, GELU MLP: the case it models exactly
    config = nemo_config(gpt3)
    config.causal_self_attn = True
    assert flops_formulas.transformer(config) == pytest.approx(GBS * model_flops_per_sample(gpt3), rel=1e-12)
    config.causal_self_attn = False
    assert flops_formulas.transformer(config) == pytest.approx(GBS * model_flops_per_sample(gpt3, "dgxc"), rel=1e-12)

    llama = recipe_spec("llama3_8b", "llama3")  # SwiGLU: NeMo's generic formula leaves out one GEMM
    config = nemo_config(llama)
    config.causal_self_attn = True
    missing_gemm = GBS * llama.seq_length * llama.num_layers * 6 * llama.hidden_size * llama.ffn
    assert GBS * model_flops_per_sample(llama) - flops_formulas.transformer(config) == pytest.approx(
        missing_gemm, rel=1e-9)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_import_presets_match_nemo_config_classes(name):
    config_class = getattr(llm, NEMO_CONFIGS[name])
    try:
        config = config_class(apply_rope_fusion=False)
    except TypeError:  # configs without RoPE
        config = config_class()
    ours = PRESETS[name]
    assert (ours.num_layers, ours.hidden_size, ours.num_attention_heads, ours.groups, ours.ffn, ours.head_dim,
            ours.gated_linear_unit, ours.seq_length, ours.num_moe_experts) == (
        config.num_layers, config.hidden_size, config.num_attention_heads, config.num_query_groups,
        config.ffn_hidden_size, config.kv_channels, config.gated_linear_unit, config.seq_length,
        config.num_moe_experts)
    if ours.num_moe_experts:
        assert (ours.moe_router_topk, ours.moe_ffn_hidden_size) == (config.moe_router_topk, config.moe_ffn_hidden_size)
