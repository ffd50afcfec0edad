"""NeMo 2: a real recipe with `nemo_callback(...)` appended, `llm.pretrain` up to the GPU it
lacks, NeMo's MegatronStrategy layout, and the NeMo-Run CLI in --dryrun."""

import pytest

from nemo_scripts import NEMO_CLI, Run, run_dir, run_in_one_process
from nemo_throughput import ThroughputCallback, nemo_callback

# the first test's set-up runs every NeMo program of the module (one interpreter for all)
pytestmark = pytest.mark.timeout(900)


def nemo_cli(name: str, *args: str) -> Run:
    """`nemo llm pretrain --factory llama3_8b ARGS --dryrun -y`, NeMo-Run's CLI, as the shell runs it."""
    return Run(name, NEMO_CLI, ["llm", "pretrain", "--factory", "llama3_8b", *args, "--dryrun", "-y"])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The runs of this module that need a NeMo program of their own, in one interpreter."""
    base = tmp_path_factory.mktemp("nemo2")
    return run_in_one_process([
        *[Run(f"pretrain-fp8-{fp8}", "nemo2_pretrain.py",
              ["llama3_8b", "--log-dir", run_dir(base, f"pretrain-fp8-{fp8}")] + (["--fp8"] if fp8 else []))
          for fp8 in (False, True)],
        nemo_cli("cli-appends", "trainer.callbacks+=[nemo_throughput.nemo_callback(log_every_n_steps=5, "
                                "run_label=kubernetes)]"),
        nemo_cli("cli-misspelt", "trainer.callbacks+=[nemo_throughput.nemo_callback(log_every=5)]"),
    ], base)


def test_recipe_trainer_holds_exactly_one_callback_with_its_settings():
    import fiddle as fdl
    from nemo.collections import llm

    recipe = llm.llama3_8b.pretrain_recipe(name="t", num_nodes=1, num_gpus_per_node=1)
    recipe.trainer.callbacks.append(nemo_callback(log_every_n_steps=20, flops_formula="dgxc"))
    recipe.trainer.accelerator = "cpu"  # building a GPU trainer on a CPU machine fails
    trainer = fdl.build(recipe.trainer)
    ours = [c for c in trainer.callbacks if isinstance(c, ThroughputCallback)]
    assert len(ours) == 1
    assert ours[0].config.log_every_n_steps == 20 and ours[0].config.flops_formula == "dgxc"


def test_nemo_callback_rejects_a_misspelt_setting():
    with pytest.raises(ValueError, match=r"Unknown throughput setting\(s\) \['log_every'\]"):
        nemo_callback(log_every=5)


@pytest.mark.parametrize("fp8", [False, True])
def test_llm_pretrain_callback_reads_shape_batch_and_precision_from_nemo(runs, fp8):
    result = runs[f"pretrain-fp8-{fp8}"]
    record = result.record
    assert result.returncode == 0, result.stderr[-3000:]
    assert "CUDA" in result.stdout  # it went as far as building the model
    assert record["callbacks"].count("ThroughputCallback") == 1
    (facts,) = record["facts"]
    assert facts["environment"]["model_config_source"] == "megatron config"
    spec = facts["model_spec"]
    # Llama3Config8B shrunk in the recipe: SwiGLU and GQA come from NeMo's config class;
    # the NullTokenizer's 1001 tokens (1000 + EOD) padded by 128 as NeMo pads them
    assert (spec["num_layers"], spec["hidden_size"], spec["num_attention_heads"], spec["num_query_groups"],
            spec["ffn_hidden_size"], spec["gated_linear_unit"], spec["seq_length"], spec["vocab_size"]) == (
        2, 64, 4, 2, 160, True, 128, 1024)
    assert (facts["global_batch_size"], facts["micro_batch_size"]) == (8, 2)  # from the data module
    assert facts["dtype"] == ("fp8" if fp8 else "bf16")
    assert facts["label"] == "nemo2-recipe"


def test_megatron_strategy_layout_is_recorded(tmp_path):
    """Lightning's fit first connects the model to NeMo's strategy, then calls callbacks' setup.

    (32 CPU processes are not launched here; the layout needs no data module, so the batch and
    vocabulary are given.)"""
    import fiddle as fdl
    from nemo.collections import llm

    recipe = llm.llama3_70b.pretrain_recipe(name="t", dir=str(tmp_path), num_nodes=4, num_gpus_per_node=8)
    recipe.trainer.accelerator = "cpu"
    recipe.model.config.apply_rope_fusion = False
    trainer = fdl.build(recipe.trainer)
    model = fdl.build(recipe.model)
    strategy = trainer.strategy
    callback = ThroughputCallback(model_spec={"vocab_size": 128256}, global_batch_size=128, output_dir=str(tmp_path))
    strategy.connect(model)
    callback.setup(trainer, model, "fit")
    layout = (strategy.tensor_model_parallel_size, strategy.pipeline_model_parallel_size,
              strategy.context_parallel_size, strategy.virtual_pipeline_model_parallel_size)
    assert layout == (4, 4, 2, 5)  # the recipe's own choice for 32 GPUs
    assert callback.facts.parallel == {"data": 1, "tensor": 4, "pipeline": 4, "context": 2,
                                       "virtual_pipeline": 5, "expert": 1}
    assert callback.facts.num_gpus == 32 and callback.facts.num_nodes == 4
    assert callback.facts.model_spec.num_layers == 80 and callback.facts.dtype == "bf16"


def test_nemo_run_cli_dryrun_appends_the_callback(runs):
    result = runs["cli-appends"]
    assert result.returncode == 0, result.stderr[-3000:]
    shown = " ".join(result.stdout.replace("│", " ").split())
    assert "callbacks=[TimingCallback(), ThroughputCallback(log_every_n_steps=5, run_label='kubernetes')]" in shown


def test_nemo_run_cli_rejects_a_misspelt_setting(runs):
    result = runs["cli-misspelt"]
    assert result.returncode != 0
    assert "No parameter named 'log_every'" in result.stdout + result.stderr


def test_a_batch_size_ramp_is_read_from_nemo2_s_data_modules(tmp_path):
    """NeMo 2 keeps rampup_batch_size on a pre-training data module's MegatronDataSampler and on a
    fine-tuning data module itself: both are read, and the ramp's steps (NeMo stops and resumes at
    each change of batch) become warm-up."""
    from types import SimpleNamespace

    import torch
    from nemo.collections.common.tokenizers.null_tokenizer import NullTokenizer
    from nemo.collections.llm.gpt.data.fine_tuning import FineTuningDataModule
    from nemo.collections.llm.gpt.data.mock import MockDataModule

    from nemo_throughput.adapters.nemo import read_module
    from nemo_throughput.config import ThroughputConfig
    from nemo_throughput.run_facts import resolve_run_facts

    model = SimpleNamespace(config=SimpleNamespace(num_layers=2, hidden_size=64, num_attention_heads=4,
                                                   vocab_size=1024, seq_length=128))
    for data in (MockDataModule(seq_length=128, micro_batch_size=1, global_batch_size=16, rampup_batch_size=[4, 4, 96],
                                tokenizer=NullTokenizer(1024)),
                 FineTuningDataModule(dataset_root=tmp_path, seq_length=128, micro_batch_size=1, global_batch_size=16,
                                      rampup_batch_size=[4, 4, 96])):
        module = read_module(model, data)
        assert list(module.rampup_batch_size) == [4, 4, 96]
        facts = resolve_run_facts(ThroughputConfig(), spec_fields=module.spec_fields, source=module.source,
                                  parallel=module.parallel, global_batch_size=module.global_batch_size,
                                  micro_batch_size=module.micro_batch_size, batches_per_step=1, world_size=1,
                                  num_nodes=1, device=torch.device("cpu"), framework_dtype="bf16",
                                  rampup_batch_size=module.rampup_batch_size)
        assert facts.batch_ramp == {"start": 4, "increment": 4, "samples": 96, "steps": 15}
