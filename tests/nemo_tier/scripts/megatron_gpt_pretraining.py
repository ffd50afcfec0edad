"""NeMo 1.x pretraining as NeMo's examples/nlp/language_modeling/megatron_gpt_pretraining.py does it
(hydra_runner -> MegatronTrainerBuilder -> MegatronGPTModel), on a CPU.

nemo-throughput is not mentioned here: `+callbacks=throughput` on the command line brings it.
Training itself cannot run on a CPU (Apex, Transformer Engine), so after building the Trainer
and the model this script does what `trainer.fit` does first for callbacks -- `setup("fit")`
-- and writes what the callbacks hold to $THROUGHPUT_PROBE.

CPU-only workarounds, each as narrow as it gets (none touches nemo-throughput):
- NLPDDPStrategy refuses to be constructed without Apex (HAVE_APEX); nothing of Apex is used
  before training, so the flag is set.
- NeMo builds the model in __init__ on a CPU accelerator, where megatron-core 0.14 layers need
  the parallel groups that NLPDDPStrategy would create at fit time: a one-process gloo group
  and `parallel_state.initialize_model_parallel()` stand in (made once per process).
- NeMo 2.5.0's `get_specs` builds every layer spec eagerly, Transformer Engine's too: the
  local (non-TE) spec is used, as NeMo does when transformer_engine=False.
- build_model imports one helper from Apex; megatron-core has the same function.
- NVIDIA_PYTORCH_VERSION must be set (as in NeMo containers): NeMo 2.5.0 crashes without it.
"""

import os

import torch
from megatron.core import num_microbatches_calculator, parallel_state
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.tensor_parallel import layers as mcore_layers
from nemo.collections.nlp.models.language_modeling import megatron_gpt_model
from nemo.collections.nlp.modules.common.megatron import build_model
from nemo.collections.nlp.parts import nlp_overrides
from nemo.collections.nlp.parts.megatron_trainer_builder import MegatronTrainerBuilder
from nemo.core.config import hydra_runner

from nemo_throughput import ThroughputCallback
from probe import dump, set_up_throughput_callbacks


def cpu_workarounds() -> None:
    nlp_overrides.HAVE_APEX = True
    megatron_gpt_model.get_specs = lambda *args, **kwargs: get_gpt_layer_local_spec()
    build_model.set_defaults_if_not_set_tensor_model_parallel_attributes = (
        mcore_layers.set_defaults_if_not_set_tensor_model_parallel_attributes)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29400 + os.getpid() % 1000))
    # once per process: the tests run several jobs of this script in one interpreter
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group("gloo", rank=0, world_size=1)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel()
    # NeMo sets Megatron's microbatch calculator (a process global) once per process and then
    # only checks the next job's batch sizes against it: each job starts as a fresh process would.
    num_microbatches_calculator.unset_num_microbatches_calculator()


@hydra_runner(config_path="../conf", config_name="megatron_gpt_config")
def main(cfg) -> None:
    cpu_workarounds()
    # A recipe that also adds the callback in code (THROUGHPUT_IN_CODE=1), to check there is one.
    in_code = [ThroughputCallback(log_every_n_steps=7)] if os.environ.get("THROUGHPUT_IN_CODE") else None
    trainer = MegatronTrainerBuilder(cfg).create_trainer(callbacks=in_code)
    model = megatron_gpt_model.MegatronGPTModel(cfg.model, trainer)
    set_up_throughput_callbacks(trainer, model)
    dump(trainer)


if __name__ == "__main__":
    main()
