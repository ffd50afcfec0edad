"""The Megatron-Bridge adapter driven by the real megatron-bridge package (0.6.2).

What runs here is Bridge's own ``megatron.bridge.training.callbacks`` — ``Callback``,
``CallbackContext``, ``CallbackManager`` (its ``add``, which picks the overridden events, and its
``fire``) — around a tiny real torch model and optimizer, in one process and in a real gloo group
of two processes. What cannot run on Python 3.11 with megatron-core 0.16 is Bridge's
``ConfigContainer`` / ``GlobalState`` (``megatron.bridge.training.config`` imports
``megatron.training``, shipped with megatron-core >= 0.17, cp312 only, and transformers); the
state handed to the events is therefore a stand-in with the same attribute paths (``state.cfg.model``
a real megatron-core ``TransformerConfig`` subclass with GPTModelProvider's extra fields,
``state.cfg.train``, ``state.cfg.mixed_precision`` a Bridge recipe name, ``state.train_state.step``).
The full ``pretrain`` loop needs CUDA and Python 3.12: tests/gpu.
"""

import importlib.util
import itertools
import json
import logging
import os
import re
import sys
import time
import types
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from test_bridge_flops import bridge_flop_utils

from conftest import free_port, read_json


def _import_bridge_callbacks():
    """megatron.bridge's package __init__ imports every model bridge (transformers, diffusers, ...);
    its callbacks module imports nothing of that. Register the package by its path (its own
    modules stay the real ones) unless the full package imports (Python 3.12 with its deps)."""
    try:
        return importlib.import_module("megatron.bridge.training.callbacks")
    except ImportError:
        pass
    for name in [n for n in sys.modules if n.startswith("megatron.bridge")]:
        del sys.modules[name]
    spec = importlib.util.find_spec("megatron")
    if spec is None or not any(os.path.isdir(os.path.join(p, "bridge")) for p in spec.submodule_search_locations):
        pytest.skip("megatron-bridge is not installed (.ci/setup installs it)", allow_module_level=True)
    package = types.ModuleType("megatron.bridge")
    package.__path__ = [os.path.join(p, "bridge") for p in spec.submodule_search_locations]
    sys.modules["megatron.bridge"] = package
    return importlib.import_module("megatron.bridge.training.callbacks")


bridge_callbacks = _import_bridge_callbacks()
from megatron.core.transformer.transformer_config import TransformerConfig  # noqa: E402

from nemo_throughput import BridgeThroughputCallback as ThroughputCallback  # noqa: E402
from nemo_throughput import environment  # noqa: E402
from nemo_throughput.adapters.megatron_bridge import describe_bridge_run  # noqa: E402
from nemo_throughput.config import ThroughputConfig  # noqa: E402

CallbackContext, CallbackManager = bridge_callbacks.CallbackContext, bridge_callbacks.CallbackManager


@dataclass
class TinyGPTProvider(TransformerConfig):
    """GPTModelProvider's fields on top of megatron-core's TransformerConfig (as Bridge declares them)."""

    seq_length: int = 64
    vocab_size: int | None = None
    make_vocab_size_divisible_by: int = 128
    should_pad_vocab: bool = False


@dataclass
class TrainingConfig:  # cfg.train: the fields the adapter reads
    global_batch_size: int
    micro_batch_size: int
    train_iters: int


@dataclass
class ConfigContainer:  # stand-in: the real one cannot be imported on Python 3.11 (module docstring)
    model: TinyGPTProvider
    train: TrainingConfig
    mixed_precision: str | None = "bf16_mixed"
    dataset: Any = None  # its packing flags, as Bridge 0.6.2's training/config.py reads them


@dataclass
class TrainState:
    step: int = 0


@dataclass
class GlobalState:
    cfg: ConfigContainer
    train_state: TrainState = field(default_factory=TrainState)
    # Bridge's writers: properties there, each made on the last rank when cfg.logger configures it, else None.
    tensorboard_logger: Any = None
    wandb_logger: Any = None
    mlflow_logger: Any = None
    comet_logger: Any = None


def llama_like_config(tensor_parallel=1, mixed_precision="bf16_mixed", steps=10, pad_vocab=True):
    model = TinyGPTProvider(num_layers=2, hidden_size=64, num_attention_heads=4, num_query_groups=2,
                            ffn_hidden_size=176, gated_linear_unit=True, vocab_size=1000,
                            should_pad_vocab=pad_vocab, tensor_model_parallel_size=tensor_parallel)
    return ConfigContainer(model=model, train=TrainingConfig(global_batch_size=8, micro_batch_size=2,
                                                             train_iters=steps),
                           mixed_precision=mixed_precision)


def run_bridge_loop(cfg, callback, skipped=(), eval_at=(), slow_s=0.0, losses_on_this_rank=True, packs=None,
                    writers=None):
    """Bridge's train loop's callback points (train.py) around a real tiny model and optimizer;
    ``losses_on_this_rank`` False: an empty loss_dict, as on a pipeline stage before the last;
    ``packs(step)``: the step's packed micro-batches, accumulated on the state by Bridge's own
    accumulate_flops_metadata as its forward step does, after train.py resets the accumulators;
    ``writers``: GlobalState's writers on this rank (tensorboard_logger, ...)."""
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    manager = CallbackManager()
    manager.add(callback)
    state = GlobalState(cfg, **(writers or {}))

    def context(**fields):
        return CallbackContext(state=state, model=[model], user_state=manager.user_state, optimizer=optimizer,
                               **fields)

    manager.fire("on_train_start", context())
    while state.train_state.step < cfg.train.train_iters:
        manager.fire("on_train_step_start", context())
        if packs is not None:
            state._flops_seqlen_sum = state._flops_seqlen_sq_sum = 0
            for batch in packs(state.train_state.step + 1):
                bridge_flop_utils().accumulate_flops_metadata(
                    state, batch["tokens"], config_seq_len=cfg.model.seq_length,
                    **{key: value for key, value in batch.items() if key.startswith("cu_")})
        loss = model(torch.randn(cfg.train.micro_batch_size, 16)).pow(2).mean()
        loss.backward()
        time.sleep(slow_s)
        skip = state.train_state.step + 1 in skipped
        if not skip:
            optimizer.step()
        optimizer.zero_grad()
        losses = {"lm loss": loss.detach()} if losses_on_this_rank else {}
        manager.fire("on_train_step_end", context(loss_dict=losses, grad_norm=1.0, skipped_iter=skip))
        state.train_state.step += 1
        if state.train_state.step in eval_at:
            manager.fire("on_eval_start", context())
            time.sleep(0.05)  # evaluation: no step's time
            manager.fire("on_eval_end", context(total_loss_dict={"lm loss": torch.tensor(1.0)}))
    manager.fire("on_train_end", context())


def lightning_summary_keys(tmp_path):
    """Every key path of a real Lightning run's summary, to compare schemas."""
    import pytorch_lightning as pl

    from conftest import tiny_gpt_cfg
    from nemo_throughput import ThroughputCallback as LightningCallback
    from nemo_throughput.demo.gpt import DemoGPT

    callback = LightningCallback(output_dir=str(tmp_path / "lightning"), log_every_n_steps=2, warmup_steps=1,
                                  per_step_jsonl=True)
    trainer = pl.Trainer(max_steps=6, accelerator="cpu", devices=1, default_root_dir=tmp_path, logger=False,
                         enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                         callbacks=[callback])
    trainer.fit(DemoGPT(tiny_gpt_cfg(global_batch_size=2)))
    return key_paths(json.loads(open(callback.summary_path).read()))


def key_paths(obj, prefix=""):
    """Key paths down to the sections whose keys vary with the run by design (rank lists, settings)."""
    if not isinstance(obj, dict) or prefix.rstrip(".") in ("settings", "environment", "model.spec", "parallel",
                                                           "hardware.precision_mix"):
        return {prefix.rstrip(".")}
    return {path for key, value in obj.items() for path in key_paths(value, f"{prefix}{key}.")} | {prefix.rstrip(".")}


def test_a_bridge_run_writes_the_lightning_summary_with_skipped_iterations_counted(tmp_path):
    callback = ThroughputCallback(output_dir=str(tmp_path / "bridge"), log_every_n_steps=2, warmup_steps=1,
                                  per_step_jsonl=True)
    cfg = llama_like_config(mixed_precision="bf16_with_fp8_current_scaling_mixed", steps=10)
    run_bridge_loop(cfg, callback, skipped=(4, 7), eval_at=(5,))
    summary = json.loads(open(callback.summary_path).read())

    assert summary["status"] == "completed" and summary["end"]["all_steps_exchanged"]
    timing = summary["timing"]
    assert timing["last_step"] == 10 and timing["skipped_steps"] == 2
    assert timing["steps_measured"] == 10 - 1 - 2  # warm-up step 1 and the skipped 4 and 7 left out
    assert timing["breakdown_s"]["data"] is not None and timing["breakdown_s"]["forward"] is None  # no inner events
    rows = [json.loads(line) for line in open(os.path.join(callback.output_dir, "steps.jsonl"))]
    assert [row["step"] for row in rows] == list(range(1, 11))
    assert [row["step"] for row in rows if row["skipped"]] == [4, 7]
    assert summary["batch"] == {"global_batch_size": 8, "micro_batch_size": 2, "seq_length": 64,
                                "tokens_per_step": 8 * 64, "token_count": "config",
                                "layout": None, "counted": None, "uncounted": None,
                                "uncounted_batches": None, "rampup": None}  # Bridge's callbacks see no batch
    spec = summary["model"]["spec"]
    shape = (spec["num_layers"], spec["hidden_size"], spec["num_query_groups"], spec["ffn_hidden_size"])
    assert shape == (2, 64, 2, 176)
    assert spec["gated_linear_unit"] is True and spec["vocab_size"] == 1024  # padded to a multiple of 128 x TP 1
    assert summary["hardware"]["dtype"] == "fp8" and summary["hardware"]["num_gpus"] == 1
    assert summary["hardware"]["precision_mix"] == {"mfu_relative_to": "fp8", "high_precision_layers": 0}
    assert summary["parallel"]["data"] == 1 and summary["parallel"]["tensor"] == 1
    assert summary["environment"]["model_config_source"] == "megatron-bridge ConfigContainer"
    tokens_per_s = summary["throughput"]["tokens_per_s"]
    assert tokens_per_s == pytest.approx(8 * 64 / timing["step_time_s"]["mean"])

    assert key_paths(summary) == lightning_summary_keys(tmp_path)


@pytest.mark.parametrize("mixed_precision, first_last_bf16, dtype, layers", [
    ("bf16_with_nvfp4_mixed", True, "fp4", 2),  # Bridge's NVFP4 recipe, first and last layer kept in bf16
    ("bf16_with_fp8_current_scaling_mixed", False, "fp8", 0),
    ("bf16_mixed", False, "bf16", None),
])
def test_an_fp4_or_fp8_run_says_which_peak_its_mfu_is_relative_to(tmp_path, mixed_precision, first_last_bf16,
                                                                  dtype, layers):
    callback = ThroughputCallback(output_dir=str(tmp_path), log_every_n_steps=2, warmup_steps=1, peak_tflops=100.0)
    cfg = llama_like_config(mixed_precision=mixed_precision, steps=4)
    cfg.model.first_last_layers_bf16 = first_last_bf16
    run_bridge_loop(cfg, callback)
    hardware = read_json(tmp_path / "summary.json")["hardware"]
    assert hardware["dtype"] == dtype
    expected = None if layers is None else {"mfu_relative_to": dtype, "high_precision_layers": layers}
    assert hardware["precision_mix"] == expected


@pytest.mark.parametrize("dataset, layout", [
    (types.SimpleNamespace(enable_offline_packing=True, enable_in_batch_packing=False), "packed"),  # packed SFT
    (types.SimpleNamespace(enable_offline_packing=False, enable_in_batch_packing=True), "packed"),
    (types.SimpleNamespace(enable_offline_packing=False, enable_in_batch_packing=False), None),
    (None, None),  # a pretraining config without those flags
])
def test_a_bridge_run_that_packs_sequences_says_its_tokens_count_padding(tmp_path, caplog, dataset, layout):
    callback = ThroughputCallback(output_dir=str(tmp_path), log_every_n_steps=2, warmup_steps=1)
    cfg = llama_like_config(steps=4)
    cfg.dataset = dataset
    with caplog.at_level(logging.WARNING, logger="nemo_throughput"):
        run_bridge_loop(cfg, callback)
    assert read_json(tmp_path / "summary.json")["batch"]["layout"] == layout
    warned = sum("the training batches are packed" in r.getMessage() for r in caplog.records)
    assert warned == (1 if layout else 0)


def pack(*lengths, slots=64):
    """A packed micro-batch (mbs 1) of sequences of ``lengths``, the tail padding a segment of cu_seqlens."""
    bounds = [0, *itertools.accumulate(lengths)]
    return {"tokens": torch.zeros(1, slots, dtype=torch.long), "cu_seqlens": torch.tensor([[*bounds, slots]]),
            "cu_seqlens_unpadded": torch.tensor([[*bounds, bounds[-1]]])}


RANK_PACKS = {0: [pack(10, 20), pack(64)], 1: [pack(30), pack(5, 5, 5)]}  # two micro-batches a step per rank


def test_a_packed_bridge_run_counts_from_bridges_accumulators(tmp_path):
    """Bridge's forward step accumulates the step's slots and squared lengths; the callback reads them at
    the step's end. Real tokens stay the config's (Bridge counts slots, not tokens)."""
    callback = ThroughputCallback(output_dir=str(tmp_path), log_every_n_steps=2, warmup_steps=1)
    cfg = llama_like_config(steps=4)
    cfg.train.global_batch_size = 2  # micro-batch 1 x 2 micro-batches, one rank
    cfg.train.micro_batch_size = 1
    cfg.dataset = types.SimpleNamespace(enable_offline_packing=True, enable_in_batch_packing=False)
    run_bridge_loop(cfg, callback, packs=lambda step: RANK_PACKS[0])
    summary = read_json(tmp_path / "summary.json")
    assert summary["batch"]["counted"] == {"source": "megatron-bridge", "tokens_per_step": None,
                                           "slots_per_step": 128.0, "padding_share": None,
                                           "seqlen_sq_per_step": 100.0 + 400 + 64 * 64}
    assert summary["batch"]["token_count"] == "config" and summary["batch"]["uncounted"] is None
    expected = bridge_flop_utils().num_floating_point_operations(
        cfg, batch_size=2, seqlen_sum=128, seqlen_squared_sum=100 + 400 + 64 * 64)
    assert summary["model"]["flops_count"] == "batch"
    assert summary["model"]["flops_per_step"] == pytest.approx(expected, rel=1e-12)


def test_measured_flops_are_refused_with_what_to_do_instead():
    with pytest.raises(ValueError, match="flops_formula: measured is not available under Megatron-Bridge"):
        ThroughputCallback(flops_formula="measured")


def test_bridge_registers_only_the_events_the_adapter_handles():
    manager = CallbackManager()
    manager.add(ThroughputCallback())
    assert {e for e in manager.events if manager.has_callbacks(e)} == {
        "on_train_start", "on_train_step_start", "on_train_step_end", "on_eval_start", "on_eval_end",
        "on_checkpoint_save", "on_train_end"}


def test_the_dtype_follows_bridge_mixed_precision_and_the_vocabulary_the_provider_pads(tmp_path):
    for recipe, dtype in (("bf16_mixed", "bf16"), ("bf16_with_mxfp8_mixed", "fp8"), ("fp16_mixed", "fp16")):
        callback = ThroughputCallback(output_dir=str(tmp_path / recipe), log_every_n_steps=2)
        run_bridge_loop(llama_like_config(mixed_precision=recipe, steps=2, pad_vocab=False), callback)
        summary = json.loads(open(callback.summary_path).read())
        assert summary["hardware"]["dtype"] == dtype
        assert summary["model"]["spec"]["vocab_size"] == 1000  # should_pad_vocab off: the logits are 1000 wide


def on_two_gloo_ranks(worker, tmp_path):
    """``worker(rank, output_dir)`` in two spawned processes of a real gloo group; what each returned, by rank."""
    results = mp.Manager().dict()
    mp.start_processes(_in_gloo_group, args=(worker, free_port(), str(tmp_path / "out"), results), nprocs=2,
                       start_method="spawn", join=True)
    return results


def _in_gloo_group(rank, worker, port, output_dir, results):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    results[rank] = worker(rank, output_dir)
    dist.destroy_process_group()


def _slow_rank_worker(rank, output_dir):
    callback = ThroughputCallback(output_dir=output_dir, log_every_n_steps=3, warmup_steps=1)
    # Rank 1 is ten times slower on purpose: the straggler must be named.
    run_bridge_loop(llama_like_config(tensor_parallel=2, steps=9), callback, skipped=(5,),
                    slow_s=0.05 if rank == 1 else 0.005)
    return callback.summary_path


def _packing_worker(rank, output_dir):
    callback = ThroughputCallback(output_dir=output_dir, log_every_n_steps=2, warmup_steps=1)
    cfg = llama_like_config(steps=4)
    cfg.train.global_batch_size, cfg.train.micro_batch_size = 4, 1  # 2 data-parallel ranks x 2 micro-batches
    cfg.dataset = types.SimpleNamespace(enable_offline_packing=True, enable_in_batch_packing=False)
    run_bridge_loop(cfg, callback, packs=lambda step: RANK_PACKS[rank])
    return callback.summary_path


@pytest.mark.slow
def test_two_data_parallel_ranks_packing_differently_add_up(tmp_path):
    results = on_two_gloo_ranks(_packing_worker, tmp_path)
    counted = read_json(results[0])["batch"]["counted"]
    assert counted["slots_per_step"] == 4 * 64
    assert counted["seqlen_sq_per_step"] == (100 + 400 + 64 * 64) + (900 + 3 * 25)


@pytest.mark.slow
def test_two_ranks_in_a_real_gloo_group_name_the_slow_rank_and_agree_on_skipped_steps(tmp_path):
    results = on_two_gloo_ranks(_slow_rank_worker, tmp_path)
    summary = json.loads(open(results[0]).read())
    assert summary["status"] == "completed" and summary["end"]["all_steps_exchanged"]
    assert summary["hardware"]["num_gpus"] == 2
    assert summary["parallel"]["tensor"] == 2 and summary["parallel"]["data"] == 1
    assert summary["model"]["spec"]["vocab_size"] == 1024  # multiple of 128 x TP 2 = 256
    timing = summary["timing"]
    assert timing["last_step"] == 9 and timing["skipped_steps"] == 1 and timing["steps_measured"] == 9 - 1 - 1
    assert timing["slowest_rank"] == 1 and len(timing["per_rank_step_time_s"]) == 2
    assert not os.path.exists(os.path.join(os.path.dirname(results[0]), "summary.rank1.json"))


def test_a_target_reads_bridge_losses(tmp_path):
    callback = ThroughputCallback(output_dir=str(tmp_path / "target"), log_every_n_steps=2,
                                  target={"metric": "lm loss", "value": 1e9, "mode": "min"})
    run_bridge_loop(llama_like_config(steps=4), callback, eval_at=(3,))
    section = json.loads(open(callback.summary_path).read())["time_to_target"]
    assert section["status"] == "target_reached" and section["step"] == 2  # the first log step's loss_dict


def test_a_target_with_stop_ends_bridge_training_there_as_a_normal_end(tmp_path):
    callback = ThroughputCallback(output_dir=str(tmp_path / "stop"), log_every_n_steps=2, warmup_steps=1,
                                  target={"metric": "lm loss", "value": 1e9, "mode": "min", "stop": True})
    cfg = llama_like_config(steps=10)
    run_bridge_loop(cfg, callback)
    summary = json.loads(open(callback.summary_path).read())
    assert summary["status"] == "completed" and summary["timing"]["last_step"] == 2  # not 10
    assert summary["time_to_target"]["status"] == "target_reached" and summary["time_to_target"]["step"] == 2
    assert cfg.train.train_iters == 2


def _stop_worker(rank, output_dir):
    """Only the last pipeline stage has the loss (rank 1 here): the other rank must stop with it."""
    callback = ThroughputCallback(output_dir=output_dir, log_every_n_steps=2, warmup_steps=1,
                                  target={"metric": "lm loss", "value": 1e9, "mode": "min", "stop": True})
    cfg = llama_like_config(steps=10)
    cfg.model.pipeline_model_parallel_size = 2
    run_bridge_loop(cfg, callback, eval_at=(99,), losses_on_this_rank=rank == 1)
    return cfg.train.train_iters, callback.summary_path


@pytest.mark.slow
def test_a_stop_seen_on_one_rank_stops_every_rank_in_a_real_gloo_group(tmp_path):
    results = on_two_gloo_ranks(_stop_worker, tmp_path)
    assert results[0][0] == results[1][0] == 2
    summary = json.loads(open(results[0][1]).read())
    assert summary["status"] == "completed" and summary["timing"]["last_step"] == 2


def test_importing_the_adapter_needs_nothing_of_bridge():
    """`import megatron.bridge` pulls in transformers, diffusers, ... (missing here): the adapter must not."""
    import subprocess

    code = ("import sys; from nemo_throughput import BridgeThroughputCallback; "
            "BridgeThroughputCallback(); print(sorted(m for m in sys.modules if m.startswith('megatron.bridge')))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "[]"


def test_the_bridge_callback_has_its_own_name_and_keeps_its_old_path():
    import nemo_throughput
    from nemo_throughput.adapters import megatron_bridge

    assert nemo_throughput.BridgeThroughputCallback is megatron_bridge.ThroughputCallback
    assert nemo_throughput.BridgeThroughputCallback is not nemo_throughput.ThroughputCallback
    assert nemo_throughput.BridgeThroughputCallback.__name__ == "BridgeThroughputCallback"


def test_the_adapters_stand_on_the_core_alone():
    """Each framework adapter stands on the framework-free core and on nothing beside it."""
    import ast
    from pathlib import Path

    import nemo_throughput

    package = Path(nemo_throughput.__file__).parent

    def imported(path):
        tree = ast.parse(path.read_text())
        return {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module} | {
            alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}

    core = imported(package / "run_facts.py").union(*(imported(path) for path in (package / "run").glob("*.py")))
    frameworks = ("lightning", "pytorch_lightning", "megatron", "nemo", "hydra")
    assert not {m for m in core if m.startswith("nemo_throughput.adapters") or m.split(".")[0] in frameworks}
    bridge = imported(package / "adapters" / "megatron_bridge.py")
    assert not {m for m in bridge if m.startswith(("nemo_throughput.adapters", "lightning", "pytorch_lightning"))}


def test_a_sliding_window_model_needs_its_flops_given(tmp_path):
    """GPT-OSS's sliding-window layers: the formulas would count them as full attention (about +5 %)."""
    cfg = llama_like_config(steps=2)
    cfg.model.window_size = (128, 0)
    with pytest.raises(ValueError, match=r"sliding-window attention \(window_size=\(128, 0\)\).*flops_per_sample"):
        run_bridge_loop(cfg, ThroughputCallback(output_dir=str(tmp_path / "computed"), log_every_n_steps=2))
    given = ThroughputCallback(output_dir=str(tmp_path / "given"), log_every_n_steps=2, flops_per_sample=9.4e13)
    run_bridge_loop(cfg, given)
    summary = json.loads(open(given.summary_path).read())
    assert summary["model"]["flops_per_sample"] == 9.4e13 and summary["model"]["flops_formula"] == "user"


def test_impossible_bridge_settings_are_refused_before_the_first_step(tmp_path):
    cfg = llama_like_config(steps=6)
    cfg.train.global_batch_size, cfg.train.micro_batch_size = 6, 4
    with pytest.raises(ValueError, match="global_batch_size 6 is not a positive multiple of micro_batch_size 4"):
        run_bridge_loop(cfg, ThroughputCallback(output_dir=str(tmp_path / "batch")))
    beyond = ThroughputCallback(output_dir=str(tmp_path / "window"), warmup_steps=1, profile_steps=(4, 8))
    with pytest.raises(ValueError, match=r"ends after the run's last step 6: choose a window inside steps 2-6"):
        run_bridge_loop(llama_like_config(steps=6), beyond)


def test_a_batch_size_ramp_is_warm_up_and_a_decreased_batch_is_the_one_trained(tmp_path, caplog):
    """Bridge ramps the global batch within its loop: the rates are the full batch's, so the ramp's steps
    (counted as megatron-core's calculator counts them) are warm-up; with decrease_batch_size_if_needed
    the batch trained is the global one rounded down to whole micro-batches (before: refused)."""
    cfg = llama_like_config(steps=24)
    cfg.train.global_batch_size, cfg.train.rampup_batch_size = 16, [4, 4, 96]  # 4 x 8, 8 x 4, 12 x 3: 15 steps
    callback = ThroughputCallback(output_dir=str(tmp_path / "ramp"), log_every_n_steps=4, warmup_steps=2)
    with caplog.at_level("WARNING", logger="nemo_throughput"):
        run_bridge_loop(cfg, callback)
    summary = read_json(callback.summary_path)
    assert summary["batch"]["rampup"] == {"start": 4, "increment": 4, "samples": 96, "steps": 15}
    assert summary["timing"]["steps_measured"] == 24 - 15 and summary["batch"]["global_batch_size"] == 16
    assert "the global batch ramps up from 4 over steps 1-15 (rampup_batch_size [4, 4, 96]): they are warm-up" \
        in caplog.text

    cfg = llama_like_config(steps=4)
    cfg.train.global_batch_size, cfg.train.decrease_batch_size_if_needed = 9, True  # micro-batch 2, one rank
    callback = ThroughputCallback(output_dir=str(tmp_path / "decreased"), log_every_n_steps=2, warmup_steps=1)
    run_bridge_loop(cfg, callback)
    assert read_json(callback.summary_path)["batch"]["global_batch_size"] == 8


@pytest.mark.parametrize("decrease", [False, True])
def test_the_ramp_s_steps_are_those_megatron_core_trains_below_the_full_batch(decrease):
    """megatron-core's own calculator, stepped as its training loop steps it (update at the samples
    consumed, then consume the running batch), over 300 ramps: the same count of smaller steps."""
    import random

    from megatron.core.num_microbatches_calculator import RampupBatchsizeNumMicroBatchesCalculator

    from nemo_throughput.megatron_config import BatchRamp

    rng = random.Random(decrease)
    for _ in range(300):
        micro, data_parallel = rng.choice([1, 2, 4]), rng.choice([1, 2, 3])
        per_pass = micro * data_parallel
        if decrease:  # any batches: Megatron rounds each down to whole micro-batches on every rank
            start, increment = rng.randint(per_pass, 40), rng.randint(1, 12)
        else:
            start, increment = per_pass * rng.randint(1, 8), per_pass * rng.randint(1, 4)
        final, samples = start + increment * rng.randint(1, 10), rng.randint(0, 3000)
        calculator = RampupBatchsizeNumMicroBatchesCalculator(final, micro, data_parallel, decrease, 1, start,
                                                              increment, samples)
        consumed = smaller = 0
        while True:
            calculator.update(consumed, consistency_check=True)
            if calculator.get_current_global_batch_size() == final:
                break
            consumed += calculator.get_current_running_global_batch_size()
            smaller += 1
        assert BatchRamp(start, increment, samples).steps_below(final, per_pass if decrease else None) == smaller


@pytest.mark.parametrize("ramp, message", [
    ([4, 4], "must be [start, increment, samples]"), ("4 4 96", "must be [start, increment, samples]"),
    ([0, 4, 96], "must be [start, increment, samples]"), ([4, 4, -1], "must be [start, increment, samples]"),
    ([4.0, 4, 96], "must be [start, increment, samples]"), ([True, 4, 96], "must be [start, increment, samples]"),
    ([20, 4, 96], "cannot reach the global batch size 16"), ([4, 5, 96], "cannot reach the global batch size 16"),
])
def test_a_ramp_megatron_could_not_run_is_refused_naming_it(tmp_path, ramp, message):
    cfg = llama_like_config(steps=2)
    cfg.train.global_batch_size, cfg.train.rampup_batch_size = 16, ramp
    with pytest.raises(ValueError, match="rampup_batch_size .*" + re.escape(message)):
        describe_bridge_run(ThroughputConfig(), cfg, torch.device("cpu"), [environment.rank_record()])
