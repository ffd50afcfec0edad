"""A NeMo 2 recipe with the callback appended, run through `llm.pretrain` as far as a CPU allows.

`llm.pretrain` needs CUDA to build the megatron-core model (configure_model). Everything
before that is real -- the recipe, NeMo's logger and resume set-up, Lightning's fit with
NeMo's MegatronStrategy and MegatronMixedPrecision, and the callbacks' setup("fit") -- so
the callback reads the shape, batch, precision and layout from NeMo's own objects; then the
run stops on the missing GPU and this script writes what the callbacks hold to $THROUGHPUT_PROBE.

CPU adaptations of the recipe: accelerator cpu, no RoPE fusion (needs Transformer Engine),
a NullTokenizer (no download), no checkpoints, and the model shrunk to CPU size.
"""

import argparse

import fiddle as fdl
import nemo_run as run
from nemo.collections import llm
from nemo.collections.common.tokenizers.null_tokenizer import NullTokenizer

from nemo_throughput import nemo_callback
from probe import dump


def main(recipe_name: str, fp8: bool, log_dir: str) -> None:
    recipe = getattr(llm, recipe_name).pretrain_recipe(name="throughput", dir=log_dir, num_nodes=1,
                                                        num_gpus_per_node=1)
    recipe.trainer.callbacks.append(nemo_callback(log_every_n_steps=5, run_label="nemo2-recipe"))

    recipe.trainer.accelerator = "cpu"
    recipe.trainer.strategy.context_parallel_size = 1
    recipe.trainer.max_steps = 4
    recipe.log.ckpt = None
    if fp8:
        recipe.trainer.plugins = llm.recipes.precision.mixed_precision.bf16_with_fp8_mixed()
    config = recipe.model.config
    config.apply_rope_fusion = False
    config.num_layers, config.hidden_size, config.ffn_hidden_size = 2, 64, 160
    config.num_attention_heads, config.num_query_groups = 4, 2
    recipe.data.seq_length = config.seq_length = 128
    recipe.data.global_batch_size, recipe.data.micro_batch_size = 8, 2
    recipe.data.tokenizer = run.Config(NullTokenizer, vocab_size=1000)

    pretrain = fdl.build(recipe)
    trainer = pretrain.keywords["trainer"]
    try:
        pretrain()
    except Exception as error:  # the missing GPU, once the model is built
        print(f"stopped: {type(error).__name__}: {error}")
    dump(trainer)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("recipe", help="a recipe of nemo.collections.llm, e.g. llama3_8b")
    parser.add_argument("--fp8", action="store_true", help="NeMo's bf16_with_fp8_mixed precision")
    parser.add_argument("--log-dir", required=True)
    args = parser.parse_args()
    main(args.recipe, args.fp8, args.log_dir)
