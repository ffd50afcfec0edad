"""The callback inside real Lightning Trainers (one process; multi-rank runs are in test_distributed)."""

import csv
import json
import re
import time

import pytest
import torch

from conftest import tiny_gpt_cfg
from lightning_modules import tiny_lm
from nemo_throughput import SCHEMA, ThroughputCallback
from nemo_throughput.demo.gpt import DemoGPT
from nemo_throughput.flops import ModelSpec, model_flops_per_sample


def fit_demo(tmp_path, quiet_trainer_kwargs, cfg=None, steps=12, accumulate=2, logger=False, **settings):
    import pytorch_lightning as pl

    cfg = cfg or tiny_gpt_cfg(global_batch_size=4)  # micro-batch 2 x accumulation 2
    callback = ThroughputCallback(output_dir=str(tmp_path / "throughput"), **settings)
    trainer = pl.Trainer(max_steps=steps, accumulate_grad_batches=accumulate, callbacks=[callback],
                         logger=logger, **quiet_trainer_kwargs)
    trainer.fit(DemoGPT(cfg))
    return callback, json.loads(open(callback.summary_path).read())


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
                                "tokens_per_step": 64, "token_count": "config", "layout": "fixed", "counted": None,
                                "uncounted": None, "uncounted_batches": 0, "rampup": None}
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
                                                     "dtype": None, "peak_tflops": None, "peak_source": None,
                                                     "precision_mix": None}
    assert summary["hardware"]["dtype"] in ("fp32", "tf32")
    assert timing["step_time_s"]["min"] <= timing["step_time_s"]["median"] <= timing["step_time_s"]["max"]
    breakdown = timing["breakdown_s"]
    assert sum(breakdown.values()) == pytest.approx(mean, rel=1e-6)  # the phases tile the step

    # the trainer's loggers got the live metrics, at the last step of each interval as Lightning numbers
    # it (the steps done before it ran)
    rows = list(csv.DictReader(open(logger.log_dir + "/metrics.csv")))
    logged = [r for r in rows if r.get("throughput/tokens_per_s")]
    # each exchange is read one interval late (steps 3, 7, 11); the end of training flushes the last two
    assert [int(r["step"]) for r in logged] == [2, 6, 10, 11]
    # and every step of every rank is in steps.jsonl
    steps = [json.loads(line) for line in open(tmp_path / "throughput" / "steps.jsonl")]
    assert [s["step"] for s in steps] == list(range(1, 13))
    assert [s["warmup"] for s in steps] == [True, True] + [False] * 10
    assert all(len(s["ranks"]) == 1 and s["ranks"][0]["step_s"] == s["step_time_s"] for s in steps)


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
    pl, model = tiny_lm(namespace)
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
    pl, model = tiny_lm()
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


def test_a_nemo_batch_size_ramp_s_steps_are_warm_up(tmp_path, quiet_trainer_kwargs, caplog):
    """NeMo 1's model.rampup_batch_size: [2, 2, 4] to a global batch of 4 trains steps 1-2 at 2 (NeMo stops
    and resumes at each change): counted at the full batch they were twice too fast."""
    import pytorch_lightning as pl

    callback = ThroughputCallback(output_dir=str(tmp_path), log_every_n_steps=3, warmup_steps=1)
    with caplog.at_level("WARNING", logger="nemo_throughput"):
        pl.Trainer(max_steps=8, callbacks=[callback], logger=False, **quiet_trainer_kwargs).fit(
            DemoGPT(tiny_gpt_cfg(rampup_batch_size=[2, 2, 4])))
    summary = json.loads(open(callback.summary_path).read())
    assert summary["batch"]["rampup"] == {"start": 2, "increment": 2, "samples": 4, "steps": 2}
    assert summary["timing"]["steps_measured"] == 8 - 2
    assert "ramps up from 2 over steps 1-2" in caplog.text


def test_reads_a_megatron_core_transformer_config_and_the_data_module(tmp_path, quiet_trainer_kwargs):
    """NeMo 2 style: the shape on ``pl_module.config`` (megatron-core), the batch on the data module."""
    import lightning.pytorch as pl
    from megatron.core.transformer.transformer_config import TransformerConfig

    class MockData(pl.LightningDataModule):  # the attributes NeMo 2's data modules carry
        seq_length, micro_batch_size, global_batch_size = 8, 2, 4

        def train_dataloader(self):
            return torch.utils.data.DataLoader(torch.randint(64, (64, 9)), batch_size=2)

    _, model = tiny_lm("lightning.pytorch")
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


@pytest.mark.parametrize("feature, message", [
    ({"window_size": (128, 0)}, r"sliding-window attention \(window_size=\(128, 0\)\)"),
    ({"multi_latent_attention": True}, r"multi-latent attention"),
    ({"mtp_num_layers": 1}, r"multi-token prediction \(mtp_num_layers=1\)"),
    ({"hybrid_override_pattern": "M-M-M*-"}, r"Mamba, Hyena or hybrid layers \(hybrid_override_pattern='M-M-M\*-'\)"),
    ({"is_hybrid_model": True}, r"Mamba, Hyena or hybrid layers"),
])
def test_a_model_the_formulas_cannot_describe_needs_its_flops_given(tmp_path, quiet_trainer_kwargs, feature, message):
    """GPT-OSS's sliding window, DeepSeek's MLA and MTP, Nemotron-H's Mamba layers: computed FLOPs would
    be wrong, so they are refused unless given (or counted); given, the run is measured as usual."""
    import lightning.pytorch as pl
    from megatron.core.transformer.transformer_config import TransformerConfig

    def fit(**settings):
        _, model = tiny_lm("lightning.pytorch")
        model.config = TransformerConfig(num_layers=2, hidden_size=64, num_attention_heads=8, ffn_hidden_size=96)
        for name, value in feature.items():
            setattr(model.config, name, value)
        callback = ThroughputCallback(model_spec={"vocab_size": 64}, seq_length=8, global_batch_size=2,
                                      output_dir=str(tmp_path / str(len(settings))), warmup_steps=1, **settings)
        pl.Trainer(max_steps=2, callbacks=[callback], logger=False, **quiet_trainer_kwargs).fit(model)
        return callback

    with pytest.raises(ValueError, match=message + ".*does not describe.*flops_per_sample"):
        fit()
    summary = json.loads(open(fit(flops_per_sample=1e9).summary_path).read())
    assert summary["model"]["flops_formula"] == "user" and summary["status"] == "completed"


@pytest.mark.parametrize("size, shown", [(-2, "-2 (int)"), (0, "0 (int)"), (2.7, "2.7 (float)"), ("two", "'two' (str)"),
                                         (True, "True (bool)")])
def test_a_parallel_size_that_is_not_a_positive_integer_is_refused_naming_its_key(size, shown):
    """A tensor-parallel size of -2 made the data-parallel size -4; 2.7 was read as 2; "two" raised a
    bare int() error."""
    from omegaconf import OmegaConf

    from nemo_throughput.megatron_config import parallel_sizes

    config = OmegaConf.create({"tensor_model_parallel_size": size, "pipeline_model_parallel_size": 2})
    with pytest.raises(ValueError, match=re.escape(f"tensor_model_parallel_size in the model config must be a "
                                                   f"positive integer, got {shown}")):
        parallel_sizes(config)
    assert parallel_sizes(OmegaConf.create({"tensor_model_parallel_size": 4, "context_parallel_size": None})) == \
        {"tensor": 4}


# ---------------------------------------------------------------------- settings of the wrong type or value
@pytest.mark.parametrize("settings, message", [
    ({"peak_tflops": "abc"}, r"peak_tflops must be a number .*got 'abc' \(str\)"),
    ({"peak_tflops": 0}, "peak_tflops must be a positive"),
    ({"peak_tflops": float("inf")}, "peak_tflops must be a positive number"),
    ({"peak_tflops": True}, r"peak_tflops must be a number .*got True \(bool\)"),
    ({"dtype": 123}, r"dtype must be a string .*got 123 \(int\)"),
    ({"model_spec": 5}, r"model_spec must be a mapping of ModelSpec fields, got 5 \(int\)"),
    ({"model_spec": {"gated_linear_unit": "no"}}, r"model_spec.gated_linear_unit must be true or false, got 'no'"),
    ({"model_spec": {"num_layers": "2"}}, r"model_spec.num_layers must be a positive integer, got '2'"),
    ({"model_spec": {"num_layers": 0}}, r"model_spec.num_layers must be a positive integer, got 0"),
    ({"run_label": 123}, r"run_label must be a string .*got 123 \(int\)"),
    ({"run_name": 7}, r"run_name must be a string"),
    ({"model_name": 1.5}, r"model_name must be a string"),
    ({"output_dir": 3}, r"output_dir must be a string"),
    ({"flops_formula": 1}, r"flops_formula must be a string"),
    ({"per_step_jsonl": "no"}, r"per_step_jsonl must be true or false, got 'no' \(str\)"),
    ({"per_step_jsonl": 1}, r"per_step_jsonl must be true or false, got 1 \(int\)"),
    ({"log_every_n_steps": "10"}, "log_every_n_steps must be an integer >= 1, got '10'"),
    ({"warmup_steps": -1}, "warmup_steps must be an integer >= 0, got -1"),
    ({"global_batch_size": -4}, "global_batch_size must be a positive integer, got -4"),
    ({"global_batch_size": 4.0}, "global_batch_size must be a positive integer, got 4.0"),
    ({"flops_per_sample": 0}, "flops_per_sample must be a positive"),
    ({"flops_per_sample": "3.94e15"}, r"flops_per_sample must be a number .*got '3.94e15' \(str\)"),
    ({"flops_per_sample": float("nan")}, "flops_per_sample must be a positive number"),
    ({"stall_factor": -1}, "stall_factor must be a positive number"),
    ({"stall_factor": False}, r"stall_factor must be a number .*got False \(bool\)"),  # not 0: no watch
    ({"stall_factor": "10"}, r"stall_factor must be a number .*got '10' \(str\)"),
    ({"stall_factor": float("nan")}, "stall_factor must be a positive number"),
    ({"stall_min_s": 0}, "stall_min_s must be a positive number of seconds"),
    ({"stall_min_s": float("inf")}, "stall_min_s must be a positive number of seconds"),
    # beyond any run: a unit mix-up or a typo, which would give absurd figures or overflow at a log step
    ({"peak_tflops": 989e12}, r"peak_tflops must be at most 100000 TFLOPS per GPU, got 9.89e\+14 \(FLOPS given "
                              r"for TFLOPS\? an H100's dense BF16 peak is 989\)"),
    ({"flops_per_sample": 1e308}, "flops_per_sample must be at most 1e\\+21 model FLOPs per sample, got 1e\\+308"),
    ({"global_batch_size": 10**30}, "global_batch_size must be at most 16,777,216, got 10000"),
    ({"seq_length": 2**25}, "seq_length must be at most 16,777,216, got 33554432"),
    # two lengths for one run: the setting won and model_spec's was dropped without a word
    ({"seq_length": 2048, "model_spec": {"seq_length": 4096}}, r"seq_length 2048 and model_spec.seq_length 4096 "
                                                               r"disagree: give one of them"),
    # a name that cannot name a directory, refused at once, not on the second run into an output_dir
    ({"run_name": "r" * 300}, "run_name is 300 bytes long; it must be at most 200 bytes with no NUL"),
    ({"model_name": "\u00e9" * 101}, "model_name is 202 bytes long"),
    ({"run_name": "a\0b"}, "run_name holds a NUL character"),
])
def test_settings_of_the_wrong_type_or_impossible_value_fail_naming_the_setting(settings, message):
    with pytest.raises(ValueError, match=message):
        ThroughputCallback(**settings)


def test_the_longest_run_name_names_the_directories_of_repeated_runs(tmp_path):
    """A name of the longest length allowed, with characters of several bytes: the second and third
    runs into one output_dir write to <name>/ and <name>-2/."""
    from nemo_throughput.config import LONGEST_NAME_BYTES
    from nemo_throughput.summary import claim_output_dir

    name = "\u00e9" * (LONGEST_NAME_BYTES // 2)
    ThroughputCallback(run_name=name)
    claimed = [claim_output_dir(tmp_path, name, f"id{i}") for i in range(3)]
    for directory in claimed:
        (directory / "summary.json").write_text("{}")
    assert claimed == [tmp_path, tmp_path / name, tmp_path / f"{name}-2"]


def test_an_output_dir_under_home_is_the_home_s_and_a_blank_one_is_refused(tmp_path, quiet_trainer_kwargs,
                                                                            monkeypatch):
    """Hydra and Kubernetes pass `~/runs` on as typed: it is the home's, not a `./~` beside the job."""
    import pytorch_lightning as pl

    from nemo_throughput.run.startup import requested_output_dir

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    callback = ThroughputCallback(output_dir="~/runs", log_every_n_steps=2, warmup_steps=1)
    pl.Trainer(max_steps=3, callbacks=[callback], logger=False, **quiet_trainer_kwargs).fit(
        DemoGPT(tiny_gpt_cfg(global_batch_size=2)))
    assert callback.summary_path == str(tmp_path / "home" / "runs" / "summary.json")
    assert not (tmp_path / "~").exists()
    assert requested_output_dir(None, "~/from-env") == str(tmp_path / "home" / "from-env")
    assert requested_output_dir("", None) is None  # neither given: the adapter's default
    for setting, variable, name in (("  ", None, "output_dir"), (None, "\t\n", "NEMO_THROUGHPUT_OUTPUT_DIR")):
        with pytest.raises(ValueError, match=f"{name} .* is blank: give a directory path"):
            requested_output_dir(setting, variable)


@pytest.mark.parametrize("settings, accumulate, said", [
    ({"seq_length": 8, "micro_batch_size": 2}, 1, None),  # rows of 9: 8 tokens and the next one
    ({"seq_length": 9, "micro_batch_size": 2}, 1, None),
    ({"seq_length": 32, "micro_batch_size": 2}, 1, "holds 2 row(s) of 9 tokens, but the run's seq_length is 32:"),
    ({"seq_length": 8, "micro_batch_size": 4}, 1, "holds 2 row(s) of 9 tokens, but the run's micro_batch_size is 4:"),
    ({"seq_length": 4, "micro_batch_size": 1}, 1, "holds 2 row(s) of 9 tokens, but the run's seq_length is 4 and its "
                                                  "micro_batch_size is 1:"),
    # No micro_batch_size: the global batch against the rows, the trainer's accumulation and data parallelism.
    ({"seq_length": 8, "global_batch_size": 2}, 1, None),
    ({"seq_length": 8, "global_batch_size": 6}, 3, None),
    ({"seq_length": 8, "global_batch_size": 64}, 1, "holds 2 row(s) of 9 tokens, but the run's global_batch_size is "
                                                    "64, where 2 row(s) x 1 micro-batch(es) per step x 1 "
                                                    "data-parallel rank(s) train 2:"),
    ({"seq_length": 8, "global_batch_size": 2}, 2, "holds 2 row(s) of 9 tokens, but the run's global_batch_size is "
                                                   "2, where 2 row(s) x 2 micro-batch(es) per step x 1 "
                                                   "data-parallel rank(s) train 4:"),
])
def test_settings_the_first_batch_contradicts_are_said(tmp_path, quiet_trainer_kwargs, caplog, settings, accumulate,
                                                       said):
    """seq_length=32 over rows of 9 tokens would quadruple tokens/s without a word; so would a
    global_batch_size of 64 over steps of one micro-batch of 2 rows."""
    pl, module = tiny_lm()
    callback = ThroughputCallback(output_dir=str(tmp_path / "throughput"), log_every_n_steps=2, warmup_steps=1,
                                  model_name="tiny", flops_per_sample=1e6, **settings)
    with caplog.at_level("WARNING", logger="nemo_throughput"):
        pl.Trainer(max_steps=3, callbacks=[callback], logger=False, accumulate_grad_batches=accumulate,
                   **quiet_trainer_kwargs).fit(module)
    warned = [r.getMessage() for r in caplog.records if "the first training batch" in r.getMessage()]
    assert warned == ([] if said is None else [f"nemo-throughput: the first training batch {said} tokens/s, TFLOPS "
                                               "and MFU are computed from the settings. Correct them if this batch is "
                                               "what a micro-batch trains (callbacks.throughput.seq_length=..., "
                                               "micro_batch_size=... and global_batch_size=... with Hydra)."])


def test_numbers_may_be_given_as_int_or_float_and_paths_as_pathlike(tmp_path):
    callback = ThroughputCallback(peak_tflops=989, flops_per_sample=3.94e15, output_dir=tmp_path)
    assert callback.config.peak_tflops == 989 and callback.config.output_dir == str(tmp_path)
    assert json.dumps(callback.config.to_dict())  # recorded in the summary as is


def test_the_hydra_factory_fails_the_trainer_on_settings_the_job_callback_did_not_see(quiet_trainer_kwargs):
    """A kept setting that is wrong makes Trainer.__init__ fail; it never yields a trainer without the callback."""
    import pytorch_lightning as pl

    from nemo_throughput.adapters import hydra

    hydra._kept_settings = {"peak_tflops": "abc"}
    try:
        with pytest.raises(ValueError, match="peak_tflops"):
            pl.Trainer(max_steps=2, logger=False, **quiet_trainer_kwargs)
    finally:
        hydra._kept_settings = None


# ---------------------------------------------------------------------- flops_per_sample given by the user
def test_flops_per_sample_given_is_used_and_recorded_as_user(tmp_path, quiet_trainer_kwargs):
    pl, model = tiny_lm()
    callback = ThroughputCallback(flops_per_sample=1.5e6, seq_length=8, micro_batch_size=2, model_name="tiny",
                                  peak_tflops=0.5, output_dir=str(tmp_path), warmup_steps=1, log_every_n_steps=2)
    trainer = pl.Trainer(max_steps=4, callbacks=[callback], logger=False, **quiet_trainer_kwargs)
    trainer.fit(model)  # no model_spec: the shape is not needed when the FLOPs are given
    summary = json.loads((tmp_path / "summary.json").read_text())
    model_section, throughput = summary["model"], summary["throughput"]
    assert model_section == {"name": "tiny", "flops_per_sample": 1.5e6, "flops_formula": "user", "spec": None,
                             "flops_per_step": summary["batch"]["global_batch_size"] * 1.5e6, "flops_count": "config",
                             "mfu_convention": {"formula": "user", "causal_attention": None}}
    assert (summary["hardware"]["peak_tflops"], summary["hardware"]["peak_source"]) == (0.5, "user")
    mean = summary["timing"]["step_time_s"]["mean"]
    assert throughput["model_tflops_per_gpu"] == pytest.approx(2 * 1.5e6 / mean / 1e12)
    assert throughput["mfu"] == pytest.approx(throughput["model_tflops_per_gpu"] / 0.5)
    assert summary["batch"]["seq_length"] == 8


def test_flops_per_sample_given_with_a_known_shape_keeps_the_shape_but_not_its_flops(tmp_path, quiet_trainer_kwargs):
    _, summary = fit_demo(tmp_path, quiet_trainer_kwargs, steps=3, flops_per_sample=1e9, warmup_steps=1)
    assert summary["model"]["flops_formula"] == "user" and summary["model"]["flops_per_sample"] == 1e9
    assert summary["model"]["spec"]["num_layers"] == 1


def test_flops_per_sample_given_per_token_is_said_against_the_model_s_shape(tmp_path, quiet_trainer_kwargs, caplog):
    """A count per token passes the 6-per-token floor and made MFU seq_length times too small without a word."""
    demo = ModelSpec(num_layers=1, hidden_size=32, num_attention_heads=4, ffn_hidden_size=64, seq_length=16,
                     vocab_size=128)  # tiny_gpt_cfg's shape, its vocabulary padded to 128
    per_token = model_flops_per_sample(demo) / 16
    with caplog.at_level("WARNING", logger="nemo_throughput"):
        _, summary = fit_demo(tmp_path, quiet_trainer_kwargs, steps=2, flops_per_sample=per_token, warmup_steps=1)
    assert f"flops_per_sample {per_token:.4g} is 0.06" in caplog.text, caplog.text
    assert "per 16-token sample ('megatron'): per token rather than per sample? MFU divides by" in caplog.text
    assert summary["model"]["flops_per_sample"] == per_token  # the user's count is still the one used


def test_flops_per_sample_given_in_tflops_is_refused_before_training(tmp_path, quiet_trainer_kwargs):
    """3.94 for a published 3.94e15 (TFLOPs): an MFU 1e15 times too small, written as if fine. The demo's
    samples are 16 tokens (read from its config), so fewer than 6 x 16 FLOPs cannot train one."""
    with pytest.raises(ValueError, match=r"flops_per_sample 3\.94 is less than 6 FLOPs per token of a 16-token "
                                         r"sample \(96\).*not TFLOPs or GFLOPs"):
        fit_demo(tmp_path, quiet_trainer_kwargs, steps=2, flops_per_sample=3.94, peak_tflops=1.0)
    with pytest.raises(ValueError, match=r"flops_per_sample 5e-06 is less than 6 FLOPs per token of a 8,192-token"):
        ThroughputCallback(flops_per_sample=5e-6, seq_length=8192)  # PFLOPs: refused where both are given
    _, summary = fit_demo(tmp_path, quiet_trainer_kwargs, steps=2, flops_per_sample=96, warmup_steps=1)
    assert summary["model"]["flops_per_sample"] == 96  # the least a 16-token sample can cost


def test_flops_per_sample_still_needs_the_sequence_length_and_a_model_name(tmp_path, quiet_trainer_kwargs):
    pl, model = tiny_lm()
    trainer = pl.Trainer(max_steps=2, logger=False, **quiet_trainer_kwargs,
                         callbacks=[ThroughputCallback(flops_per_sample=1e6, micro_batch_size=2, model_name="x",
                                                       rate="tokens")])  # (auto: samples/s without a seq_length)
    with pytest.raises(ValueError, match=r"missing \['seq_length'\]"):
        trainer.fit(model)
    trainer = pl.Trainer(max_steps=2, logger=False, **quiet_trainer_kwargs,
                         callbacks=[ThroughputCallback(flops_per_sample=1e6, micro_batch_size=2, seq_length=8)])
    with pytest.raises(ValueError, match="model_name"):
        trainer.fit(model)


# ---------------------------------------------------------------------- model config readers
@pytest.mark.parametrize("where, key, value", [
    ("config", "gated_linear_unit", "no"),  # a string is not a flag, and "no" is truthy
    ("config", "fp8", "yes"),  # megatron-core: None, "e4m3" or "hybrid"
    ("cfg", "fp8", "False"),
])
def test_model_config_readers_reject_strings_where_flags_are_expected(where, key, value):
    from types import SimpleNamespace

    from nemo_throughput.adapters.nemo import read_module

    shape = {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, key: value}
    module = SimpleNamespace(**{where: shape if where == "cfg" else SimpleNamespace(**shape)})
    with pytest.raises(ValueError, match=f"{key}.*{value!r}"):
        read_module(module)


def test_model_config_readers_accept_megatron_fp8_recipes():
    from types import SimpleNamespace

    from nemo_throughput.adapters.nemo import read_module

    shape = {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "gated_linear_unit": True}
    assert read_module(SimpleNamespace(config=SimpleNamespace(**shape, fp8="hybrid"))).low_precision == "fp8"
    assert read_module(SimpleNamespace(config=SimpleNamespace(**shape, fp8=None))).low_precision is None
    assert read_module(SimpleNamespace(config=SimpleNamespace(**shape, fp4="e2m1"))).low_precision == "fp4"
    with pytest.raises(ValueError, match="fp4 in the model config must be null, true/false or one of"):
        read_module(SimpleNamespace(config=SimpleNamespace(**shape, fp4="mxfp8")))
    assert read_module(SimpleNamespace(config=SimpleNamespace(**shape))).spec_fields["gated_linear_unit"] is True


# ---------------------------------------------------------------------- output directory: checked early, one run each
class CountingGPT(DemoGPT):
    steps_run = 0

    def training_step(self, batch, batch_idx):
        CountingGPT.steps_run += 1
        return super().training_step(batch, batch_idx)


def test_an_output_directory_that_cannot_be_written_fails_at_set_up_naming_it(tmp_path, quiet_trainer_kwargs):
    import pytorch_lightning as pl

    (tmp_path / "a-file").write_text("in the way")
    unwritable = tmp_path / "a-file" / "throughput"
    CountingGPT.steps_run = 0
    trainer = pl.Trainer(max_steps=4, callbacks=[ThroughputCallback(output_dir=str(unwritable))], logger=False,
                         **quiet_trainer_kwargs)
    with pytest.raises(OSError, match=f"cannot write to the output directory {unwritable}.*output_dir="):
        trainer.fit(CountingGPT(tiny_gpt_cfg()))
    assert CountingGPT.steps_run == 0  # before any training


def test_two_runs_into_one_output_directory_do_not_mix(tmp_path, quiet_trainer_kwargs):
    out = tmp_path / "throughput"
    first, first_summary = fit_demo(tmp_path, quiet_trainer_kwargs, steps=4, warmup_steps=1, per_step_jsonl=True,
                                    run_name="first")
    first_steps = (out / "steps.jsonl").read_text()
    second, _ = fit_demo(tmp_path, quiet_trainer_kwargs, steps=6, warmup_steps=1, per_step_jsonl=True,
                         run_name="second")
    # the first run's files are untouched; the second run went to a directory of its own, named after it
    assert json.loads((out / "summary.json").read_text()) == first_summary
    assert (out / "steps.jsonl").read_text() == first_steps
    assert second.output_dir == str(out / "second")
    second_summary = json.loads((out / "second" / "summary.json").read_text())
    assert second_summary["run"]["name"] == "second" and second_summary["timing"]["last_step"] == 6
    # every run has an id; the summary names its steps file and every row carries the id
    first_id, second_id = first_summary["run"]["id"], second_summary["run"]["id"]
    assert first_id != second_id and len(first_id) >= 12
    assert second_summary["files"]["steps_jsonl"] == {"path": "steps.jsonl", "complete": True, "error": None}
    rows = [json.loads(line) for line in (out / "second" / "steps.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 7)) and {r["run_id"] for r in rows} == {second_id}
    # so `report --window` averages each run's own steps, never two runs' together
    from nemo_throughput.report.runs import Window, load_run

    counted = {load_run(path, Window.parse("2:")).steps_counted for path in out.rglob("summary.json")}
    assert counted == {3, 5}  # steps 2-4 of the first run, 2-6 of the second
    # a third run of the same name gets a suffix, never another run's directory
    third, _ = fit_demo(tmp_path, quiet_trainer_kwargs, steps=2, warmup_steps=1, run_name="second")
    assert third.output_dir == str(out / "second-2")
    assert json.loads((out / "second" / "summary.json").read_text())["run"]["id"] == second_id


def test_a_summary_left_by_an_older_version_also_counts_as_another_run(tmp_path, quiet_trainer_kwargs):
    out = tmp_path / "throughput"
    out.mkdir()
    (out / "steps.jsonl").write_text('{"step": 1, "warmup": false, "step_time_s": 9.0, "ranks": []}\n')
    callback, _ = fit_demo(tmp_path, quiet_trainer_kwargs, steps=2, warmup_steps=1, run_name="new")
    assert callback.output_dir == str(out / "new")


@pytest.mark.slow
def test_an_unwritable_output_directory_stops_every_rank(tmp_path):
    """Only rank 0 writes; the others learn of its failure at set-up instead of waiting for it forever."""
    from conftest import run_train_tiny

    (tmp_path / "a-file").write_text("in the way")
    process = run_train_tiny("--output-dir", tmp_path / "a-file" / "out", "--devices", 2, "--steps", 4)
    output, _ = process.communicate(timeout=120)
    assert process.returncode != 0
    assert output.count(f"cannot write to the output directory {tmp_path / 'a-file' / 'out'}") >= 2, output


def test_the_nemo_run_factory_names_a_wrong_setting_before_anything_is_submitted():
    from nemo_throughput import nemo_callback

    with pytest.raises(ValueError, match=r"peak_tflops must be a number of TFLOPS per GPU, got 'abc' \(str\)"):
        nemo_callback(peak_tflops="abc")


@pytest.mark.parametrize("argument, recorded", [
    ("+exp_manager.wandb_api_key=sk-live-1", "+exp_manager.wandb_api_key=<redacted>"),
    ("--hf_token=hf_abc", "--hf_token=<redacted>"),
    ("apiKey=zz", "apiKey=<redacted>"),
    ("exp_manager.wandb_logger_kwargs={project:p,api_key:k1,auth:{password:'p w'}}",
     "exp_manager.wandb_logger_kwargs={project:p,api_key:<redacted>,auth:{password:<redacted>}}"),
    ("model.data.data_prefix=https://user:pa55@host/data", "model.data.data_prefix=https://<redacted>@host/data"),
    ("--container-image=user:pa55@nvcr.io/nvidia/nemo:24.05", "--container-image=<redacted>@nvcr.io/nvidia/nemo:24.05"),
    # an image's digest, enroot's user before its registry, an address: no password in them
    ("--container-image=nemo:24.05@sha256:0f1e", "--container-image=nemo:24.05@sha256:0f1e"),
    ("--container-image=$oauthtoken@nvcr.io#nvidia/nemo", "--container-image=$oauthtoken@nvcr.io#nvidia/nemo"),
    ("--mail-user=me@example.com", "--mail-user=me@example.com"),
    ("model.tokenizer.library=megatron", "model.tokenizer.library=megatron"),  # a tokenizer is no token
    ("model.data.num_tokens=5", "model.data.num_tokens=5"),
])
def test_secret_values_are_redacted_from_the_recorded_command(argument, recorded):
    from nemo_throughput.redact import redact_command

    assert redact_command(["train.py", argument]) == f"train.py {recorded}"


def test_a_container_image_written_with_its_login_is_recorded_without_it(monkeypatch):
    from nemo_throughput import environment

    monkeypatch.setenv(environment.ENV_IMAGE, "robot:tok3n@registry.example.com:5000/team/nemo:25.02")
    assert environment.capture()["container_image"] == "<redacted>@registry.example.com:5000/team/nemo:25.02"


def test_an_option_naming_a_secret_redacts_its_value_but_not_the_next_option():
    from nemo_throughput.redact import redact_command

    assert redact_command(["x", "--api-key", "k", "--token", "--verbose", "--steps", "4"]) == \
        "x --api-key <redacted> --token --verbose --steps 4"


@pytest.mark.slow
def test_a_run_summary_never_holds_the_secrets_of_its_command_line_or_environment(tmp_path):
    """The real demo (Hydra, Lightning) with a W&B key as NeMo users pass it, and a secret-named variable."""
    import os

    from conftest import nemo_throughput_cli

    env = {**os.environ, "NCCL_TEST_AUTH_TOKEN": "secret-env-3"}
    result = nemo_throughput_cli("demo", "--devices", "1", "--steps", "3", "--output-dir", tmp_path,
                                 "+exp_manager.wandb_api_key=secret-key-1",
                                 "+exp_manager.wandb_logger_kwargs={project:p,api_key:secret-key-2}",
                                 cwd=tmp_path, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "secret-" not in result.stdout and "wandb_api_key=<redacted>" in result.stdout  # the command it shows
    text = (tmp_path / "throughput" / "summary.json").read_text()
    assert "secret-" not in text
    environment = json.loads(text)["environment"]
    assert "+exp_manager.wandb_api_key=<redacted>" in environment["command"]
    assert "{project:p,api_key:<redacted>}" in environment["command"]
    assert environment["nodes"][0]["communication_env"]["NCCL_TEST_AUTH_TOKEN"] == "<redacted>"


@pytest.mark.parametrize("settings, message", [
    ({"global_batch_size": 3}, r"global_batch_size 3 is not a positive multiple of micro_batch_size 2 x "
                               r"data-parallel size 1 = 2"),
    ({"global_batch_size": 4, "micro_batch_size": 8}, r"global_batch_size 4 is not a positive multiple of "
                                                      r"micro_batch_size 8 x data-parallel size 1 = 8"),
])
def test_a_global_batch_smaller_or_not_a_multiple_of_one_step_is_refused(tmp_path, quiet_trainer_kwargs, settings,
                                                                        message):
    with pytest.raises(ValueError, match=message):
        fit_demo(tmp_path, quiet_trainer_kwargs, steps=2, **settings)



@pytest.mark.parametrize("window, message", [
    ((2, 3), r"profile_steps \[2, 3\] starts inside the warm-up or before this run: it starts at step 1 with 2 "
             r"warm-up steps, so profile from step 3 on"),
    ((8, 20), r"profile_steps \[8, 20\] ends after the run's last step 12: choose a window inside steps 3-12"),
])
def test_a_profile_window_outside_the_measured_run_is_refused_before_training(tmp_path, quiet_trainer_kwargs, window,
                                                                             message):
    with pytest.raises(ValueError, match=message):
        fit_demo(tmp_path, quiet_trainer_kwargs, steps=12, warmup_steps=2, profile_steps=window)


@pytest.mark.parametrize("steps, warned", [(4, True), (5, False)])
def test_a_run_whose_every_step_is_warm_up_is_said_at_train_start(tmp_path, quiet_trainer_kwargs, caplog, steps,
                                                                    warned):
    with caplog.at_level("WARNING", logger="nemo_throughput"):
        _, summary = fit_demo(tmp_path, quiet_trainer_kwargs, steps=steps, warmup_steps=4)
    said = [r.getMessage() for r in caplog.records if "are all warm-up" in r.getMessage()]
    assert said == (["nemo-throughput: steps 1-4 are all warm-up (warmup_steps 4): this run measures no step, and "
                     "every figure of its summary will be null. Lower warmup_steps or train more steps."]
                    if warned else [])
    assert (summary["timing"]["steps_measured"] == 0) is warned


def test_trace_ranks_a_run_does_not_have_are_said_at_train_start(tmp_path, quiet_trainer_kwargs, caplog):
    with caplog.at_level("WARNING", logger="nemo_throughput"):
        fit_demo(tmp_path, quiet_trainer_kwargs, steps=6, warmup_steps=2, profile_steps=[4, 5],
                 profile_trace_ranks=[0, 5])
    assert [r.getMessage() for r in caplog.records if "profile_trace_ranks" in r.getMessage()] == [
        "nemo-throughput: profile_trace_ranks names rank(s) [5] of a run of 1: they write no trace"]


def test_a_window_the_run_cannot_hold_is_one_line_at_train_start_from_hydra(tmp_path, quiet_trainer_kwargs):
    """Refused at train start, where the last step is known, as a setting refused at set-up is: from
    `+callbacks=throughput`, one line (SystemExit through Lightning's handler), not a traceback."""
    import pytorch_lightning as pl

    callback = ThroughputCallback(output_dir=str(tmp_path / "throughput"), profile_steps=[30, 32])
    callback.from_hydra_config = True  # as the `+callbacks=throughput` factory makes it
    trainer = pl.Trainer(max_steps=3, callbacks=[callback], logger=False, **quiet_trainer_kwargs)
    with pytest.raises(SystemExit) as stopped:
        trainer.fit(DemoGPT(tiny_gpt_cfg(global_batch_size=2)))
    assert stopped.value.code == ("nemo-throughput: profile_steps [30, 32]: this run measures no step to profile "
                                  "(steps 1-3 are all warm-up, warmup_steps 10); train more steps, lower "
                                  "warmup_steps, or drop profile_steps")


def test_an_mfu_above_100_percent_is_nulled_flagged_and_warned_naming_the_likely_causes(tmp_path,
                                                                                       quiet_trainer_kwargs, caplog):
    """A peak of 1 kFLOP/s per GPU (as a peak given in the wrong unit would be): no CPU step is that slow."""
    with caplog.at_level("WARNING", logger="nemo_throughput"):
        _, summary = fit_demo(tmp_path, quiet_trainer_kwargs, steps=8, log_every_n_steps=2, warmup_steps=1,
                              peak_tflops=1e-9)
    throughput = summary["throughput"]
    assert throughput["mfu"] is None and throughput["mfu_above_peak"] > 1
    assert throughput["mfu_above_peak"] == pytest.approx(throughput["model_tflops_per_gpu"] / 1e-9)
    warnings = [r.getMessage() for r in caplog.records if "above the GPU's peak" in r.getMessage()]
    assert len(warnings) == 1  # once per run, not per interval
    assert "peak of 1e-09 TFLOPS per GPU (user, dtype" in warnings[0] and "'megatron' FLOPs model" in warnings[0]
    assert "MFU is reported as null; throughput.mfu_above_peak keeps the figure" in warnings[0]


def test_an_mfu_within_the_peak_is_reported_and_not_flagged():
    from nemo_throughput.throughput import Workload

    workload = Workload(global_batch_size=8, seq_length=None, num_gpus=2, flops_per_sample=1e12, peak_tflops=10)
    assert workload.metrics(1.0)["mfu"] == pytest.approx(0.4) and workload.metrics(1.0)["mfu_above_peak"] is None
    assert workload.metrics(0.1)["mfu"] is None and workload.metrics(0.1)["mfu_above_peak"] == pytest.approx(4.0)


def test_a_file_name_with_terminal_escapes_is_shown_without_them(tmp_path, quiet_trainer_kwargs, caplog):
    import pytorch_lightning as pl

    output_dir = tmp_path / "runs\x1b]0;owned\x07\x1b[31m"
    callback = ThroughputCallback(output_dir=str(output_dir), log_every_n_steps=2)
    trainer = pl.Trainer(max_steps=2, callbacks=[callback], logger=False, **quiet_trainer_kwargs)
    with caplog.at_level("INFO", logger="nemo_throughput"):
        trainer.fit(DemoGPT(tiny_gpt_cfg()))
    written = [r.getMessage() for r in caplog.records if "run summary written to" in r.getMessage()]
    assert written == [f"nemo-throughput: completed run summary written to {tmp_path}/runs/summary.json"]


def test_a_step_held_by_another_callback_is_named_an_outlier_beside_the_median(tmp_path, quiet_trainer_kwargs,
                                                                               caplog):
    """One step's start is held 1.5 s by another callback's hook (a profiler export, a checkpoint to a
    slow file system): the summary names it, with the phase, and the headline, the final log line and
    report say so beside the median; the mean still counts it."""
    import logging
    import statistics
    import subprocess
    import sys

    import pytorch_lightning as pl

    from nemo_throughput.demo.command import headline

    class HoldsStepSeven(pl.Callback):
        """Holds step 7 at least 1.5 s, and long enough to be an outlier however slow the steps before it
        ran (a loaded machine): over 3x their median and 1 s over it."""
        def __init__(self):
            self.starts: list[float] = []

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            self.starts.append(time.perf_counter())
            if trainer.global_step + 1 == 7:
                median = statistics.median(b - a for a, b in zip(self.starts[2:], self.starts[3:]))
                time.sleep(max(1.5, 4 * median + 1.5))

    callback = ThroughputCallback(output_dir=str(tmp_path / "throughput"), log_every_n_steps=4, warmup_steps=2)
    trainer = pl.Trainer(max_steps=12, callbacks=[HoldsStepSeven(), callback], logger=False, **quiet_trainer_kwargs)
    with caplog.at_level(logging.WARNING, logger="nemo_throughput"):
        trainer.fit(DemoGPT(tiny_gpt_cfg(global_batch_size=2)))
    summary = json.loads(open(callback.summary_path).read())
    timing = summary["timing"]
    assert timing["outlier_count"] == 1 and len(timing["outlier_steps"]) == 1
    (outlier,) = timing["outlier_steps"]
    assert outlier["step"] == 7 and outlier["step_time_s"] >= 1.5 and outlier["phase"] == "data"
    assert timing["step_time_s"]["max"] == outlier["step_time_s"] > timing["step_time_s"]["mean"]
    said = (f"1 (the longest: step 7, {outlier['step_time_s']:.4g} s, in data); the mean step time "
            f"{timing['step_time_s']['mean']:.4g} s counts it, the median is {timing['step_time_s']['median']:.4g} s")
    assert f"outlier steps  {said}" in headline(summary).splitlines()
    assert f"nemo-throughput: outlier steps: {said} (timing.outlier_steps)" in caplog.text
    report = subprocess.run([sys.executable, "-m", "nemo_throughput.cli", "report", callback.summary_path],
                            capture_output=True, text=True, timeout=120)
    assert report.returncode == 0 and f"note: {callback.summary_path}: outlier steps: {said}" in report.stderr


# Python frames an ordinary step (not a log step, fixed-length batches) enters in our four hooks,
# ours and the frameworks' (Lightning's global_step alone is six), the goodput ledger included.
# Between the model's kernels each one costs cache misses, not nanoseconds (docs/performance.md):
# a change that adds one should say why.
ORDINARY_STEP_FRAMES = {"tensor": 16, "dict": 19}


@pytest.mark.parametrize("batches", ["tensor", "dict"])
def test_an_ordinary_step_enters_few_frames_of_ours(batches, tmp_path, quiet_trainer_kwargs):
    """Counted with sys.setprofile in a real fit, at steps 6 and 7 (log steps are 4 and 8): the
    hooks of an ordinary step, fixed-length batches whose layout is checked, no profile window."""
    import sys

    rows = torch.randint(64, (64, 9))
    data = [{"tokens": rows[i:i + 2]} for i in range(0, 64, 2)] if batches == "dict" else rows
    pl, module = tiny_lm(data=data, batch_size=None if batches == "dict" else 2,
                         tokens=(lambda batch: batch["tokens"]) if batches == "dict" else (lambda batch: batch))
    callback = ThroughputCallback(output_dir=str(tmp_path / "throughput"), log_every_n_steps=4, warmup_steps=1,
                                  model_name="tiny", seq_length=8, global_batch_size=2, flops_per_sample=1e6)
    frames: dict[int, list[str]] = {}
    hooks = ("on_train_batch_start", "on_before_backward", "on_before_optimizer_step", "on_train_batch_end")

    def counted(hook, name):
        def run(trainer, *args):
            step = trainer.global_step + (name != "on_train_batch_end")  # the step this call belongs to
            if step not in (6, 7):
                return hook(trainer, *args)

            def profile(frame, event, arg):
                if event == "call":
                    frames.setdefault(step, []).append(f"{name}: {frame.f_code.co_filename}:{frame.f_code.co_name}")
            sys.setprofile(profile)
            try:
                return hook(trainer, *args)
            finally:
                sys.setprofile(None)
        return run

    for name in hooks:
        setattr(callback, name, counted(getattr(callback, name), name))
    trainer = pl.Trainer(max_steps=9, callbacks=[callback], logger=False, **quiet_trainer_kwargs)
    trainer.fit(module)
    assert callback.summary_path and json.loads(open(callback.summary_path).read())["status"] == "completed"
    assert callback.measurement._ledger is None  # closed at the end: it was on the hot path (rank 0) until then
    for step in (6, 7):
        entered = frames[step]
        assert len(entered) <= ORDINARY_STEP_FRAMES[batches], "\n".join(entered)
        assert not any(name.endswith(("_sample", "collect", "read_micro_batch")) for name in entered), entered


def test_steps_are_lightning_s_global_step_under_manual_optimization_with_two_optimizers(tmp_path,
                                                                                       quiet_trainer_kwargs):
    """Two optimizers stepped by hand each batch: global_step moves by two per batch, and so do the
    steps the callback reads from Lightning's step counter on the hot path."""
    import pytorch_lightning as pl

    class TwoOptimizers(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.automatic_optimization = False
            self.embedding, self.head = torch.nn.Embedding(64, 16), torch.nn.Linear(16, 64)

        def training_step(self, batch, batch_idx):
            loss = torch.nn.functional.cross_entropy(self.head(self.embedding(batch[:, :-1])).flatten(0, 1),
                                                     batch[:, 1:].flatten())
            self.manual_backward(loss)
            for optimizer in self.optimizers():
                optimizer.step()
                optimizer.zero_grad()

        def configure_optimizers(self):
            return [torch.optim.SGD(self.embedding.parameters(), lr=0.1),
                    torch.optim.SGD(self.head.parameters(), lr=0.1)]

        def train_dataloader(self):
            return torch.utils.data.DataLoader(torch.randint(64, (64, 9)), batch_size=2)

    seen = []

    class Watch(pl.Callback):
        def on_train_batch_end(self, trainer, *args):
            seen.append(trainer.global_step)

    callback = ThroughputCallback(output_dir=str(tmp_path / "throughput"), log_every_n_steps=4, warmup_steps=1,
                                  model_name="tiny", seq_length=8, global_batch_size=2, flops_per_sample=1e6)
    trainer = pl.Trainer(max_steps=12, callbacks=[callback, Watch()], logger=False, **quiet_trainer_kwargs)
    trainer.fit(TwoOptimizers())
    assert seen == [2, 4, 6, 8, 10, 12]
    assert callback._step_counter is not None  # read on the hot path, and never found to disagree
    summary = json.loads(open(callback.summary_path).read())
    assert summary["status"] == "completed" and summary["timing"]["last_step"] == 12
    assert summary["timing"]["steps_measured"] == 6  # the ends at steps 2, 4 .. 12 (warm-up: step 1)


def test_a_step_counter_that_stops_agreeing_with_global_step_is_dropped_with_a_warning(tmp_path, quiet_trainer_kwargs,
                                                                                    monkeypatch, caplog):
    """A Lightning whose step counter is not the one read (stood in for by replacing it mid-run with one
    that stays at 3): the periodic check finds it, says so, and global_step is read from then on."""
    import logging
    import types

    import pytorch_lightning as pl

    from nemo_throughput.adapters import lightning as adapter

    monkeypatch.setattr(adapter, "STEP_COUNTER_CHECK_EVERY", 8)

    class Stale(pl.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if trainer.global_step == 3:
                callback._step_counter = types.SimpleNamespace(completed=3)

    pl_, module = tiny_lm()
    callback = ThroughputCallback(output_dir=str(tmp_path / "throughput"), log_every_n_steps=4, warmup_steps=1,
                                  model_name="tiny", seq_length=8, global_batch_size=2, flops_per_sample=1e6)
    trainer = pl.Trainer(max_steps=20, callbacks=[Stale(), callback], logger=False, **quiet_trainer_kwargs)
    with caplog.at_level(logging.WARNING, logger="nemo_throughput"):
        trainer.fit(module)
    assert callback._step_counter is None
    said = "Lightning's optimizer-step counter says 3, trainer.global_step 9: reading trainer.global_step"
    assert said in caplog.text
    summary = json.loads(open(callback.summary_path).read())
    assert summary["status"] == "completed" and summary["timing"]["last_step"] == 20
