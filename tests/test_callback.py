"""The callback inside real Lightning Trainers (one process; multi-rank runs are in test_distributed)."""

import csv
import importlib
import json
import time

import pytest
import torch

from conftest import tiny_gpt_cfg
from nemo_throughput import SCHEMA, ThroughputCallback
from nemo_throughput.demo.gpt import DemoGPT


def fit_demo(tmp_path, quiet_trainer_kwargs, cfg=None, steps=12, accumulate=2, logger=False, **settings):
    import pytorch_lightning as pl

    cfg = cfg or tiny_gpt_cfg(global_batch_size=4)  # micro-batch 2 x accumulation 2
    callback = ThroughputCallback(output_dir=str(tmp_path / "throughput"), **settings)
    trainer = pl.Trainer(max_steps=steps, accumulate_grad_batches=accumulate, callbacks=[callback],
                         logger=logger, **quiet_trainer_kwargs)
    trainer.fit(DemoGPT(cfg))
    return callback, json.loads((tmp_path / "throughput" / "summary.json").read_text())


def test_completed_run_summary_reads_shape_and_batch_from_the_nemo_style_config(tmp_path, quiet_trainer_kwargs):
    from pytorch_lightning.loggers import CSVLogger

    logger = CSVLogger(tmp_path, name="csv")
    callback, summary = fit_demo(tmp_path, quiet_trainer_kwargs, logger=logger, log_every_n_steps=4,
                                 warmup_steps=2, per_step_jsonl=True)
    assert summary["schema"] == SCHEMA and summary["status"] == "completed" and summary["error"] is None
    timing, throughput = summary["timing"], summary["throughput"]
    assert timing["steps_measured"] == 10 and timing["warmup_steps"] == 2 and timing["last_step"] == 12
    assert timing["slowest_rank"] == 0 and len(timing["per_rank_step_time_s"]) == 1

    # batch: global 4 = micro 2 x accumulation 2 (from cfg.model), tokens from the config, not the batch
    assert summary["batch"] == {"global_batch_size": 4, "micro_batch_size": 2, "seq_length": 16,
                                "tokens_per_step": 64}
    spec = summary["model"]["spec"]
    assert (spec["num_layers"], spec["hidden_size"], spec["num_attention_heads"], spec["ffn_hidden_size"],
            spec["seq_length"], spec["vocab_size"], spec["gated_linear_unit"]) == (1, 32, 4, 64, 16, 128, False)
    assert summary["environment"]["model_config_source"] == "nemo1 cfg"

    mean = timing["step_time_s"]["mean"]
    assert throughput["tokens_per_s"] == pytest.approx(64 / mean)
    assert throughput["samples_per_s"] == pytest.approx(4 / mean)
    assert throughput["model_tflops_per_gpu"] == pytest.approx(4 * summary["model"]["flops_per_sample"] / mean / 1e12)
    assert throughput["mfu"] is None and summary["hardware"]["peak_tflops"] is None  # no peak for a CPU
    assert summary["hardware"] | {"dtype": None} == {"gpu_name": "cpu", "num_gpus": 1, "num_nodes": 1,
                                                     "dtype": None, "peak_tflops": None, "peak_source": None}
    assert summary["hardware"]["dtype"] in ("fp32", "tf32")
    assert timing["step_time_s"]["min"] <= timing["step_time_s"]["median"] <= timing["step_time_s"]["max"]
    breakdown = timing["breakdown_s"]
    assert sum(breakdown.values()) == pytest.approx(mean, rel=1e-6)  # the phases tile the step

    # the trainer's loggers got the live metrics, at the last step of each interval
    rows = list(csv.DictReader(open(logger.log_dir + "/metrics.csv")))
    logged = [r for r in rows if r.get("throughput/tokens_per_s")]
    # each exchange is read one interval late; the end of training flushes the last two
    assert [int(r["step"]) for r in logged] == [3, 7, 11, 12]
    # and every step of every rank is in steps.jsonl
    steps = [json.loads(line) for line in open(tmp_path / "throughput" / "steps.jsonl")]
    assert [s["step"] for s in steps] == list(range(1, 13))
    assert [s["warmup"] for s in steps] == [True, True] + [False] * 10
    assert all(len(s["ranks"]) == 1 and s["ranks"][0]["step_s"] == s["step_time_s"] for s in steps)


def plain_lm(namespace="pytorch_lightning"):
    """A LightningModule with no NeMo-style config: its shape must come from the callback's arguments."""
    pl = importlib.import_module(namespace)

    class PlainLM(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.embedding = torch.nn.Embedding(64, 16)
            self.head = torch.nn.Linear(16, 64)

        def training_step(self, batch, batch_idx):
            return torch.nn.functional.cross_entropy(self.head(self.embedding(batch[:, :-1])).flatten(0, 1),
                                                     batch[:, 1:].flatten())

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def train_dataloader(self):
            return torch.utils.data.DataLoader(torch.randint(64, (64, 9)), batch_size=2)

    return pl, PlainLM()


def test_megatron_style_one_training_step_is_one_global_batch(tmp_path, quiet_trainer_kwargs):
    """Under NeMo's Megatron strategy Lightning sees one training_step per global batch (it runs
    the micro-batches itself), so the batch comes from the config, not from Lightning's counters."""
    cfg = tiny_gpt_cfg(global_batch_size=8, micro_batch_size=2)  # 4 micro-batches inside each step
    _, summary = fit_demo(tmp_path, quiet_trainer_kwargs, cfg=cfg, steps=6, accumulate=1, warmup_steps=1)
    assert summary["batch"]["global_batch_size"] == 8 and summary["batch"]["tokens_per_step"] == 8 * 16
    assert summary["timing"]["steps_measured"] == 5
    assert summary["throughput"]["tokens_per_s"] == pytest.approx(8 * 16 / summary["timing"]["step_time_s"]["mean"])


@pytest.mark.parametrize("namespace", ["lightning.pytorch", "pytorch_lightning"])
def test_works_in_either_lightning_namespace_with_explicit_settings(namespace, tmp_path, quiet_trainer_kwargs):
    pl, model = plain_lm(namespace)
    callback = ThroughputCallback(
        model_spec={"num_layers": 1, "hidden_size": 16, "num_attention_heads": 2, "vocab_size": 64},
        seq_length=8, micro_batch_size=2, log_every_n_steps=3, warmup_steps=1, model_name="tiny",
        peak_tflops=0.5, run_label="laptop", output_dir=str(tmp_path))
    trainer = pl.Trainer(max_steps=7, accumulate_grad_batches=3, callbacks=[callback], logger=False,
                         **quiet_trainer_kwargs)
    trainer.fit(model)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["timing"]["steps_measured"] == 6
    assert summary["batch"]["global_batch_size"] == 6  # micro 2 x accumulation 3 x 1 rank
    assert summary["run"]["label"] == "laptop" and summary["model"]["name"] == "tiny"
    assert summary["hardware"]["peak_source"] == "user" and summary["hardware"]["peak_tflops"] == 0.5
    assert summary["throughput"]["mfu"] == pytest.approx(summary["throughput"]["model_tflops_per_gpu"] / 0.5)
    assert summary["environment"]["model_config_source"] is None


def test_validation_time_stays_out_of_the_step_times(tmp_path, quiet_trainer_kwargs):
    import pytorch_lightning as pl

    class SlowValidation(DemoGPT):
        def validation_step(self, batch, batch_idx):
            time.sleep(1.0)

        def val_dataloader(self):
            return self.train_dataloader()

    callback = ThroughputCallback(output_dir=str(tmp_path), log_every_n_steps=2, warmup_steps=0)
    quiet_trainer_kwargs.update(val_check_interval=3, limit_val_batches=1, num_sanity_val_steps=0)
    trainer = pl.Trainer(max_steps=9, callbacks=[callback], logger=False, **quiet_trainer_kwargs)
    trainer.fit(SlowValidation(tiny_gpt_cfg(global_batch_size=2)))
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["timing"]["steps_measured"] == 9
    assert summary["timing"]["step_time_s"]["max"] < 1.0  # three validations of 1 s happened in between


@pytest.mark.parametrize("settings, message", [
    ({"global_batch_size": 0}, "global_batch_size must be a positive integer, got 0"),
    ({"micro_batch_size": -2}, "micro_batch_size must be a positive integer, got -2"),
    ({"seq_length": 1.5}, "seq_length must be a positive integer"),
    ({"log_every_n_steps": 0}, "log_every_n_steps must be an integer >= 1"),
    ({"flops_formula": "palm"}, r"Unknown flops_formula 'palm'; choose one of \['megatron', 'dgxc'\]"),
    ({"dtype": "int4"}, r"Unknown dtype 'int4'.*'bf16'"),
    ({"peak_tflops": -1}, "peak_tflops must be a positive number"),
    ({"log_every": 5}, r"Unknown throughput setting\(s\) \['log_every'\]; valid keys: \['log_every_n_steps'"),
    ({"model_spec": {"layers": 2}}, r"Unknown model_spec key\(s\) \['layers'\]; valid keys: \['num_layers'"),
])
def test_bad_settings_fail_at_construction_with_the_fix(settings, message):
    with pytest.raises(ValueError, match=message):
        ThroughputCallback(**settings)


def test_missing_model_shape_names_the_arguments_to_pass(tmp_path, quiet_trainer_kwargs):
    pl, model = plain_lm()
    callback = ThroughputCallback(model_spec={"num_layers": 1}, micro_batch_size=2)
    trainer = pl.Trainer(max_steps=2, callbacks=[callback], logger=False, **quiet_trainer_kwargs)
    with pytest.raises(ValueError, match=r"cannot tell the model shape: missing \['hidden_size', "
                                         r"'num_attention_heads', 'seq_length', 'vocab_size'\].*model_spec="):
        trainer.fit(model)


def test_missing_batch_size_names_the_arguments_to_pass(tmp_path, quiet_trainer_kwargs):
    import pytorch_lightning as pl

    cfg = tiny_gpt_cfg()
    del cfg["global_batch_size"], cfg["micro_batch_size"]
    model = DemoGPT(tiny_gpt_cfg())
    model.cfg = cfg
    trainer = pl.Trainer(max_steps=2, callbacks=[ThroughputCallback()], logger=False, **quiet_trainer_kwargs)
    with pytest.raises(ValueError, match="global batch size.*pass global_batch_size=... or micro_batch_size="):
        trainer.fit(model)


def test_one_callback_per_trainer(tmp_path, quiet_trainer_kwargs):
    import pytorch_lightning as pl

    from nemo_throughput.adapters import hydra

    explicit = ThroughputCallback(output_dir=str(tmp_path))
    hydra._kept_settings = {"log_every_n_steps": 3}  # as `+callbacks=throughput` leaves it
    try:
        trainer = pl.Trainer(max_steps=2, callbacks=[explicit], logger=False, **quiet_trainer_kwargs)
    finally:
        hydra._kept_settings = None
    assert sum(isinstance(c, ThroughputCallback) for c in trainer.callbacks) == 2  # before set-up
    trainer.fit(DemoGPT(tiny_gpt_cfg()))
    assert [c for c in trainer.callbacks if isinstance(c, ThroughputCallback)] == [explicit]

    twice = [ThroughputCallback(), ThroughputCallback()]
    trainer = pl.Trainer(max_steps=2, callbacks=twice, logger=False, **quiet_trainer_kwargs)
    with pytest.raises(ValueError, match="More than one ThroughputCallback"):
        trainer.fit(DemoGPT(tiny_gpt_cfg()))


def test_reads_a_megatron_core_transformer_config_and_the_data_module(tmp_path, quiet_trainer_kwargs):
    """NeMo 2 style: the shape on ``pl_module.config`` (megatron-core), the batch on the data module."""
    import lightning.pytorch as pl
    from megatron.core.transformer.transformer_config import TransformerConfig

    class MockData(pl.LightningDataModule):  # the attributes NeMo 2's data modules carry
        seq_length, micro_batch_size, global_batch_size = 8, 2, 4

        def train_dataloader(self):
            return torch.utils.data.DataLoader(torch.randint(64, (64, 9)), batch_size=2)

    _, model = plain_lm("lightning.pytorch")
    model.config = TransformerConfig(num_layers=3, hidden_size=64, num_attention_heads=8, num_query_groups=2,
                                     ffn_hidden_size=96, gated_linear_unit=True, tensor_model_parallel_size=1)
    # TransformerConfig has no vocabulary: the one field left to give
    callback = ThroughputCallback(model_spec={"vocab_size": 64}, output_dir=str(tmp_path), warmup_steps=1)
    trainer = pl.Trainer(max_steps=4, accumulate_grad_batches=2, callbacks=[callback], logger=False,
                         **quiet_trainer_kwargs)
    trainer.fit(model, datamodule=MockData())
    summary = json.loads((tmp_path / "summary.json").read_text())
    spec = summary["model"]["spec"]
    assert summary["environment"]["model_config_source"] == "megatron config"
    assert (spec["num_layers"], spec["hidden_size"], spec["num_attention_heads"], spec["num_query_groups"],
            spec["ffn_hidden_size"], spec["gated_linear_unit"], spec["seq_length"], spec["vocab_size"]) == (
        3, 64, 8, 2, 96, True, 8, 64)
    assert summary["batch"]["global_batch_size"] == 4 and summary["batch"]["micro_batch_size"] == 2
    assert summary["parallel"]["tensor"] == 1 and summary["timing"]["steps_measured"] == 3
