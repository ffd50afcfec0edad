"""Our FLOPs formulas against Megatron-Bridge's own ``num_floating_point_operations``
(``megatron/bridge/training/utils/flop_utils.py``, megatron-bridge 0.6.2), for the model shapes of
Bridge's LLM recipes.

Bridge's recipes take the shapes from the Hugging Face configs (``AutoBridge.from_hf_pretrained(...)
.to_megatron_provider()``), mapped by ``MegatronModelBridge.CONFIG_MAPPING`` and each model's
``provider_bridge``; with no hub here the shapes below are those configs' published values, mapped
the same way. Bridge's function is the real one: imported as it is where Bridge's dependencies
install (Python 3.12), else its source file loaded by path with five imports it needs at import time
but never calls for a GPT model filled in (see ``_stand_ins``).

What the two count, and why they differ where they do, is on the docs' arithmetic page.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import math
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from nemo_throughput.batches import TokenCounter
from nemo_throughput.flops import ModelSpec, flops_terms, model_flops_per_sample
from nemo_throughput.megatron_config import padded_vocab_size


def _bridge_package_dir() -> Path | None:
    """The installed megatron/bridge directory, without importing the package (its __init__ needs
    transformers); another test may already have registered the package as a bare namespace."""
    registered = getattr(sys.modules.get("megatron.bridge"), "__path__", None)
    if registered:
        locations = list(registered)
    else:
        try:
            spec = importlib.util.find_spec("megatron.bridge")
        except (ImportError, ValueError):
            return None
        locations = list(spec.submodule_search_locations) if spec else []
    return next((Path(p) for p in locations if (Path(p) / "training" / "utils" / "flop_utils.py").is_file()), None)


BRIDGE_DIR = _bridge_package_dir()
pytestmark = pytest.mark.skipif(BRIDGE_DIR is None, reason="megatron-bridge is not installed (.ci/setup installs it "
                                                           "with --no-deps --ignore-requires-python)")


# ------------------------------------------------------------------ Bridge's function, as real as it gets here
def _import_or_none(name: str) -> ModuleType | None:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def _ceil_multiple_padding(vocab_size: int, make_vocab_size_divisible_by: int, tensor_model_parallel_size: int,
                           logging_enabled: bool = True) -> int:
    """megatron.training.vocab_utils.calculate_padded_vocab_size (megatron-core >= 0.17 ships it; 0.16,
    the last for Python 3.11, does not): up to a multiple of divisible_by * TP."""
    multiple = make_vocab_size_divisible_by * tensor_model_parallel_size
    return math.ceil(vocab_size / multiple) * multiple


def _stand_ins() -> dict[str, ModuleType]:
    """What flop_utils imports at import time that megatron-core 0.16 / Python 3.11 cannot give, none of
    it called for a GPT model: the hybrid (Mamba) layer-pattern parser (only for hybrid_layer_pattern
    models), packed-sequence statistics and the LoRA class (only for LoRA fine-tuning), the
    ConfigContainer class (only a type annotation), and the vocabulary padding that Bridge delegates to
    Megatron-LM's megatron.training (used: the real one where installed, else the same rule)."""
    def unused(*_args: Any, **_kwargs: Any) -> Any:
        raise AssertionError("stand-in called: this path of flop_utils is not for GPT models")

    hybrid = types.ModuleType("megatron.core.models.hybrid.hybrid_layer_allocation")
    mamba_allocation = _import_or_none("megatron.core.ssm.mamba_hybrid_layer_allocation")
    hybrid.Symbols = getattr(mamba_allocation, "Symbols", None)
    hybrid.get_hybrid_layer_counts = hybrid.parse_hybrid_pattern = unused
    packing = types.ModuleType("megatron.bridge.data.packing.algorithms")
    packing.calculate_avg_seqlen = unused
    lora = types.ModuleType("megatron.bridge.peft.lora")
    lora.LoRA = type("LoRA", (), {})
    config = types.ModuleType("megatron.bridge.training.config")
    config.ConfigContainer = type("ConfigContainer", (), {})
    vocab = types.ModuleType("megatron.bridge.utils.vocab_utils")
    real_vocab = _import_or_none("megatron.training.vocab_utils")
    vocab.calculate_padded_vocab_size = getattr(real_vocab, "calculate_padded_vocab_size", _ceil_multiple_padding)
    stand_ins = {module.__name__: module for module in (packing, lora, config, vocab)}
    if _import_or_none("megatron.core.models.hybrid.hybrid_layer_allocation") is None:
        stand_ins[hybrid.__name__] = hybrid
    return stand_ins


def _import_flop_utils_as_is() -> ModuleType | None:
    """Where Bridge's dependencies are installed (Python 3.12, transformers, megatron-core >= 0.17)."""
    if importlib.util.find_spec("transformers") is None:
        return None
    try:
        return importlib.import_module("megatron.bridge.training.utils.flop_utils")
    except Exception:  # noqa: BLE001 - any failure of Bridge's package import: load the file by path instead
        return None


def _load_flop_utils_by_path() -> ModuleType:
    """flop_utils.py executed with the stand-ins registered only while it runs; every real module it
    imports (torch, megatron.core) stays registered as usual."""
    stand_ins = {name: module for name, module in _stand_ins().items() if name not in sys.modules}
    saved = {name: sys.modules.get(name) for name in stand_ins}
    path = BRIDGE_DIR / "training" / "utils" / "flop_utils.py"
    spec = importlib.util.spec_from_file_location("bridge_flop_utils_by_path", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules.update(stand_ins)
    try:
        spec.loader.exec_module(module)
    finally:
        for name, previous in saved.items():
            if previous is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = previous
    return module


@functools.cache
def bridge_flop_utils() -> ModuleType:
    """Bridge's flop_utils module: imported, or loaded by path."""
    return _import_flop_utils_as_is() or _load_flop_utils_by_path()


@pytest.fixture(scope="module")
def bridge_flops() -> Any:
    """Bridge's num_floating_point_operations(cfg, batch_size)."""
    return bridge_flop_utils().num_floating_point_operations


# ------------------------------------------------------------------ the recipes' shapes
@dataclass(frozen=True)
class Recipe:
    """A Bridge recipe's model: the Hugging Face config values and the recipe's own settings."""

    name: str
    hf_id: str
    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    kv_channels: int
    vocab_size: int
    seq_length: int
    tensor_model_parallel_size: int
    num_moe_experts: int | None = None
    moe_router_topk: int = 2
    moe_ffn_hidden_size: int | None = None
    window_size: tuple[int, int] | None = None  # GPT-OSS: (sliding_window - 1, 0)
    window_attn_skip_freq: int | None = None  # GPT-OSS: 2, every second layer full attention

    def bridge_provider(self) -> SimpleNamespace:
        """The fields of Bridge's GPTModelProvider that flop_utils reads, as the recipe sets them."""
        return SimpleNamespace(
            num_layers=self.num_layers, hidden_size=self.hidden_size, ffn_hidden_size=self.ffn_hidden_size,
            num_attention_heads=self.num_attention_heads, num_query_groups=self.num_query_groups,
            kv_channels=self.kv_channels, vocab_size=self.vocab_size, seq_length=self.seq_length,
            tensor_model_parallel_size=self.tensor_model_parallel_size,
            make_vocab_size_divisible_by=bridge_vocab_divisor(self.vocab_size),
            gated_linear_unit=True, multi_latent_attention=False, mtp_num_layers=None,
            num_moe_experts=self.num_moe_experts, moe_router_topk=self.moe_router_topk,
            moe_ffn_hidden_size=self.moe_ffn_hidden_size, moe_shared_expert_intermediate_size=None,
            window_size=self.window_size, window_attn_skip_freq=self.window_attn_skip_freq)

    def bridge_config(self) -> SimpleNamespace:
        return SimpleNamespace(model=self.bridge_provider(), peft=None, dataset=None)

    def padded_vocab(self) -> int:
        return padded_vocab_size(self.vocab_size, bridge_vocab_divisor(self.vocab_size),
                                 self.tensor_model_parallel_size)

    def model_spec(self) -> ModelSpec:
        """Ours: the same shape, with the vocabulary padded as Bridge pads it."""
        return ModelSpec(
            num_layers=self.num_layers, hidden_size=self.hidden_size, num_attention_heads=self.num_attention_heads,
            seq_length=self.seq_length, vocab_size=self.padded_vocab(), ffn_hidden_size=self.ffn_hidden_size,
            num_query_groups=self.num_query_groups, kv_channels=self.kv_channels, gated_linear_unit=True,
            num_moe_experts=self.num_moe_experts, moe_router_topk=self.moe_router_topk,
            moe_ffn_hidden_size=self.moe_ffn_hidden_size)

    @property
    def sliding_window_layers(self) -> int:
        """Layers that flop_utils counts with sliding-window attention (window_attn_skip_freq: every
        k-th layer, 1-based, is full attention)."""
        if self.window_size is None:
            return 0
        return sum(1 for i in range(self.num_layers) if (i + 1) % self.window_attn_skip_freq != 0)


def bridge_vocab_divisor(vocab_size: int) -> int:
    """MegatronModelBridge.make_vocab_size_divisible_by: the largest power of two up to 128 that divides
    the Hugging Face vocabulary (so a vocabulary is padded only for tensor parallelism)."""
    divisor = 128
    while vocab_size % divisor:
        divisor //= 2
    return divisor


# HF config.json values; seq_length and TP from Bridge's H100 perf recipes (megatron/bridge/perf_recipes/*/h100:
# llama3_8b_pretrain_8gpu TP1, llama3_70b_pretrain_64gpu TP4, llama31_405b_pretrain_1024gpu TP8, seq 8192;
# gpt_oss_120b_pretrain_64gpu TP1, recipes/gpt_oss gpt_oss_20b TP2, seq 4096; qwen3_30b_a3b_pretrain_16gpu
# TP1, qwen3_235b_a22b_pretrain_256gpu TP2, seq 4096).
LLAMA = dict(vocab_size=128256, num_query_groups=8, kv_channels=128, seq_length=8192)
GPT_OSS = dict(hidden_size=2880, ffn_hidden_size=2880, moe_ffn_hidden_size=2880, num_attention_heads=64,
               num_query_groups=8, kv_channels=64, vocab_size=201088, seq_length=4096, moe_router_topk=4,
               window_size=(127, 0), window_attn_skip_freq=2)
QWEN3_MOE = dict(num_query_groups=4, kv_channels=128, vocab_size=151936, seq_length=4096, moe_router_topk=8,
                 num_moe_experts=128)
RECIPES = [
    Recipe("llama31_8b", "meta-llama/Llama-3.1-8B", num_layers=32, hidden_size=4096, ffn_hidden_size=14336,
           num_attention_heads=32, tensor_model_parallel_size=1, **LLAMA),
    Recipe("llama31_70b", "meta-llama/Llama-3.1-70B", num_layers=80, hidden_size=8192, ffn_hidden_size=28672,
           num_attention_heads=64, tensor_model_parallel_size=4, **LLAMA),
    Recipe("llama31_405b", "meta-llama/Llama-3.1-405B", num_layers=126, hidden_size=16384, ffn_hidden_size=53248,
           num_attention_heads=128, tensor_model_parallel_size=8, **LLAMA),
    Recipe("gpt_oss_20b", "openai/gpt-oss-20b", num_layers=24, num_moe_experts=32, tensor_model_parallel_size=2,
           **GPT_OSS),
    Recipe("gpt_oss_120b", "openai/gpt-oss-120b", num_layers=36, num_moe_experts=128, tensor_model_parallel_size=1,
           **GPT_OSS),
    Recipe("qwen3_30b_a3b", "Qwen/Qwen3-30B-A3B", num_layers=48, hidden_size=2048, ffn_hidden_size=6144,
           moe_ffn_hidden_size=768, num_attention_heads=32, tensor_model_parallel_size=1, **QWEN3_MOE),
    Recipe("qwen3_235b_a22b", "Qwen/Qwen3-235B-A22B", num_layers=94, hidden_size=4096, ffn_hidden_size=12288,
           moe_ffn_hidden_size=1536, num_attention_heads=64, tensor_model_parallel_size=2, **QWEN3_MOE),
]
FULL_ATTENTION = [r for r in RECIPES if r.window_size is None]
SLIDING_WINDOW = [r for r in RECIPES if r.window_size is not None]


def by_name(recipes: list[Recipe]) -> dict[str, Any]:
    return {"argvalues": recipes, "ids": [r.name for r in recipes]}


def causal_attention_flops_per_sample(recipe: Recipe) -> int:
    """What Megatron's causal halving leaves out: half of the two s x s GEMMs (QK^T, scores x V) of every
    layer, training (x3) at 2 FLOPs per multiply-add: 3 * 2 * 2 * (s*s/2) * query width * layers."""
    query = recipe.kv_channels * recipe.num_attention_heads
    return 3 * 2 * 2 * recipe.seq_length ** 2 // 2 * query * recipe.num_layers


# ------------------------------------------------------------------ the checks
@pytest.mark.parametrize("recipe", **by_name(FULL_ATTENTION))
def test_megatron_formula_equals_bridge_for_full_attention_recipes(bridge_flops, recipe):
    """Dense (Llama 3.1) and MoE (Qwen3) with GQA, SwiGLU, kv_channels != hidden/heads, padded vocab:
    the same number, to the FLOP."""
    ours = model_flops_per_sample(recipe.model_spec(), "megatron")
    assert ours == bridge_flops(recipe.bridge_config(), batch_size=1)
    assert 8 * ours == bridge_flops(recipe.bridge_config(), batch_size=8)  # per sample, linear in the batch


@pytest.mark.parametrize("recipe", **by_name(RECIPES))
def test_dgxc_formula_is_bridge_plus_the_causal_half_of_attention(bridge_flops, recipe):
    """DGX Cloud's convention counts the whole s x s attention; Bridge, like Megatron-LM, half of it."""
    ours = model_flops_per_sample(recipe.model_spec(), "dgxc")
    megatron = model_flops_per_sample(recipe.model_spec(), "megatron")
    assert ours - megatron == causal_attention_flops_per_sample(recipe)
    if recipe.window_size is None:
        assert ours - bridge_flops(recipe.bridge_config()) == causal_attention_flops_per_sample(recipe)


@pytest.mark.parametrize("recipe", **by_name(SLIDING_WINDOW))
def test_gpt_oss_sliding_window_layers_are_the_whole_difference(bridge_flops, recipe):
    """GPT-OSS alternates 128-token sliding-window and full attention. Bridge counts a window layer's
    attention with the mean causal context of a window W: W - W(W-1)/(2s) keys per query; our formula
    has no sliding window and counts every layer with full causal attention (s/2 keys per query)."""
    s, window = recipe.seq_length, recipe.window_size[0] + recipe.window_size[1] + 1
    window_context = window - window * (window - 1) / (2 * s)
    query = recipe.kv_channels * recipe.num_attention_heads
    per_layer_excess = 3 * 2 * 2 * query * (s / 2 - window_context) * s  # training, FMA, QK^T and x V
    ours = model_flops_per_sample(recipe.model_spec(), "megatron")
    bridge = bridge_flops(recipe.bridge_config())
    assert recipe.sliding_window_layers == recipe.num_layers // 2
    assert ours - bridge == pytest.approx(recipe.sliding_window_layers * per_layer_excess, rel=1e-12)
    assert ours > bridge


@pytest.mark.parametrize("recipe", **by_name(SLIDING_WINDOW))
def test_gpt_oss_without_its_window_matches_exactly(bridge_flops, recipe):
    """Take the window away and Bridge's MoE (128 or 32 experts, top-4, SwiGLU, expert width = hidden),
    GQA with 64-wide heads and the 201,088 vocabulary count exactly what ours does."""
    config = recipe.bridge_config()
    config.model.window_size = None
    assert model_flops_per_sample(recipe.model_spec(), "megatron") == bridge_flops(config)


def test_vocab_padding_is_the_only_tensor_parallel_effect(bridge_flops):
    """Llama 3.1 70B at TP 4: Bridge pads 128,256 to 128,512 (multiple of 128 x 4); an unpadded spec
    misses exactly the logits GEMM of the 256 padding rows."""
    recipe = next(r for r in RECIPES if r.name == "llama31_70b")
    assert recipe.padded_vocab() == 128512
    unpadded = ModelSpec.from_dict({**recipe.model_spec().to_dict(), "vocab_size": recipe.vocab_size})
    missing = bridge_flops(recipe.bridge_config()) - model_flops_per_sample(unpadded, "megatron")
    assert missing == 3 * 2 * recipe.hidden_size * (128512 - 128256) * recipe.seq_length


def test_the_design_worked_example_in_bridges_convention(bridge_flops):
    """The docs' Llama 3.1 70B worked example (dgxc, unpadded vocab 128,256, seq 8192) is 3.94e15 per sample;
    Bridge's count for the same shape at TP 1 is that minus the causal half."""
    recipe = next(r for r in RECIPES if r.name == "llama31_70b")
    config = recipe.bridge_config()
    config.model.tensor_model_parallel_size = 1
    dgxc = model_flops_per_sample(ModelSpec.from_dict({**recipe.model_spec().to_dict(), "vocab_size": 128256}),
                                  "dgxc")
    assert dgxc == pytest.approx(3.94e15, rel=2e-3)
    assert dgxc - bridge_flops(config) == causal_attention_flops_per_sample(recipe)


def test_the_real_bridge_logs_own_tflops_used_the_providers_seq_length(bridge_flops):
    """tests/data/import/megatron_bridge_llama32_1b_8gpu.log prints `GPU utilization: 59892.5TFLOP/s/GPU` on
    8 H100s (peak 989): Bridge's formula with the model provider's seq_length, 131,072 (Llama 3.2's
    max_position_embeddings, left in model.seq_length by that script, as its dumped config shows), while the
    data were 1,024 tokens long. The same formula at 1,024 gives 107.4, what `import` reports."""
    llama32_1b = Recipe("llama32_1b", "meta-llama/Llama-3.2-1B", num_layers=16, hidden_size=2048,
                        ffn_hidden_size=8192, num_attention_heads=32, num_query_groups=8, kv_channels=64,
                        vocab_size=128256, seq_length=131072, tensor_model_parallel_size=1)
    step_time_s, global_batch_size, gpus = 4.6478, 512, 8
    printed = bridge_flops(llama32_1b.bridge_config(), batch_size=global_batch_size) / step_time_s / gpus / 1e12
    assert printed == pytest.approx(59892.5, rel=2e-5)  # the step time is printed to 0.1 ms
    config = llama32_1b.bridge_config()
    config.model.seq_length = 1024
    actual = bridge_flops(config, batch_size=global_batch_size) / step_time_s / gpus / 1e12
    assert actual == pytest.approx(107.386, rel=1e-5)


def deepseek_v3(config_overrides: dict[str, Any] | None = None) -> tuple[Recipe, SimpleNamespace]:
    """DeepSeek-V3 (HF deepseek-ai/DeepSeek-V3; DeepSeekV3Bridge: first 3 layers dense, one shared expert of
    moe_intermediate_size, vocab padded to a multiple of 1280, one MTP layer; perf recipe TP 2, seq 4096)."""
    recipe = Recipe("deepseek_v3", "deepseek-ai/DeepSeek-V3", num_layers=61, hidden_size=7168, ffn_hidden_size=18432,
                    moe_ffn_hidden_size=2048, num_attention_heads=128, num_query_groups=128, kv_channels=128,
                    vocab_size=129280, seq_length=4096, tensor_model_parallel_size=2, num_moe_experts=256,
                    moe_router_topk=8)
    config = recipe.bridge_config()
    bridge_settings = dict(
        make_vocab_size_divisible_by=1280, moe_layer_freq=[0] * 3 + [1] * 58, moe_shared_expert_intermediate_size=2048,
        multi_latent_attention=True, q_lora_rank=1536, kv_lora_rank=512, qk_head_dim=128, qk_pos_emb_head_dim=64,
        v_head_dim=128, mtp_num_layers=1)
    config.model.__dict__.update({**bridge_settings, **(config_overrides or {})})
    return recipe, config


def test_deepseek_v3_moe_layers_match_once_mla_and_mtp_are_set_aside(bridge_flops):
    """Our ModelSpec has no multi-latent attention and no multi-token prediction. Without them (standard
    128-head attention of width 128 in their place), DeepSeek-V3's MoE accounting is the same number:
    3 dense layers then 58 MoE layers (moe_layer_freq as a list), 256 experts top-8 and a shared expert."""
    recipe, config = deepseek_v3({"multi_latent_attention": False, "mtp_num_layers": None})
    spec = ModelSpec.from_dict({**recipe.model_spec().to_dict(), "moe_layer_freq": [0] * 3 + [1] * 58,
                                "moe_shared_expert_intermediate_size": 2048,
                                "vocab_size": padded_vocab_size(129280, 1280, 2)})
    assert spec.vocab_size == 130560  # 1280 x TP 2 = 2560: 129,280 is not a multiple
    assert model_flops_per_sample(spec, "megatron") == bridge_flops(config)
    _, with_mla_and_mtp = deepseek_v3()
    assert bridge_flops(with_mla_and_mtp) != bridge_flops(config)  # what ours cannot express


def bridge_packed_batch() -> dict[str, Any]:
    """One pack as Bridge's packed SFT batches carry it (mbs 1): 5 + 3 real tokens in 16 slots, the tail
    padding a segment of cu_seqlens, the unpadded boundaries beside, each with its argmin."""
    import torch

    return {"tokens": torch.zeros(1, 16, dtype=torch.long),
            "cu_seqlens": torch.tensor([[0, 5, 8, 16, -1]], dtype=torch.int32), "cu_seqlens_argmin": torch.tensor(4),
            "cu_seqlens_unpadded": torch.tensor([[0, 5, 8, 8, -1]], dtype=torch.int32),
            "cu_seqlens_unpadded_argmin": torch.tensor(4)}


def test_a_packed_batch_counts_as_bridges_accumulators_count_it():
    """Bridge's own accumulate_flops_metadata (its forward step's) and our counter, on one pack."""
    batch = bridge_packed_batch()
    state = SimpleNamespace()
    bridge_flop_utils().accumulate_flops_metadata(
        state, batch["tokens"], config_seq_len=16, **{k: v for k, v in batch.items() if k.startswith("cu_")})
    counter = TokenCounter()
    counter.add_batch(batch)
    tokens, slots, seqlen_sq, *_ = counter.step_done().read()
    assert (slots, seqlen_sq) == (state._flops_seqlen_sum, state._flops_seqlen_sq_sum) == (16, 25 + 9)
    assert tokens == 8


@pytest.mark.parametrize("recipe", **by_name(FULL_ATTENTION))
def test_packed_flops_equal_bridge_for_the_same_squared_lengths(bridge_flops, recipe):
    """A step of 8 packs of the recipe's sequence length, each holding sequences of varied lengths:
    our GEMMs on every slot plus attention on the sum of squares is Bridge's count, to the FLOP."""
    s = recipe.seq_length
    packs = [[s // 2, s // 4, s // 8], [s], [s - 100, 37], [1, 2, 3], [s // 3] * 3, [1000], [s // 2, s // 2], [7]]
    slots, squares = 8 * s, sum(n * n for pack in packs for n in pack)
    per_token, per_token_pair = flops_terms(recipe.model_spec(), "megatron")
    ours = per_token * slots + per_token_pair * squares
    assert ours == bridge_flops(recipe.bridge_config(), batch_size=8, seqlen_sum=slots, seqlen_squared_sum=squares)
    assert ours < model_flops_per_sample(recipe.model_spec(), "megatron") * 8  # less attention than 8 full rows
