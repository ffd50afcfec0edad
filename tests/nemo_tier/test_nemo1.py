"""NeMo 1.x: `+callbacks=throughput` on a NeMo Megatron GPT pretraining script, through NeMo's real
hydra_runner and MegatronTrainerBuilder, and the real MegatronGPTModel's config."""

from pathlib import Path

import pytest

from nemo_scripts import Run, run_dir, run_in_one_process

SCRIPT = "megatron_gpt_pretraining.py"

# the first test's set-up runs every NeMo program of the module (one interpreter for all)
pytestmark = pytest.mark.timeout(900)

BAD_SETTINGS = [
    ("+callbacks.throughput.log_every=3", "Unknown throughput setting(s) ['log_every']; valid keys:"),
    ("callbacks.throughput.flops_formula=palm", "Unknown flops_formula 'palm'"),
]


def launcher_training_config(directory: Path) -> Path:
    """NeMo-Megatron-Launcher saves the `training` config to a file and runs the script with
    --config-path/--config-name; `+training.callbacks.throughput...` and
    `+training.hydra.callbacks.nemo_throughput._target_=...` on the launcher's command line put
    these two entries into that file."""
    import yaml

    config = yaml.safe_load((Path(__file__).parent / "conf" / "megatron_gpt_config.yaml").read_text())
    config["callbacks"] = {"throughput": {"log_every_n_steps": 20}}
    config["hydra"] = {"callbacks": {"nemo_throughput": {
        "_target_": "nemo_throughput.adapters.hydra.KeepThroughputConfig"}}}
    path = directory / "training.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    """Every job of this module, each a run of the script with its own overrides, in one process.

    The job without the override goes first: Hydra's job callback keeps the settings of the last
    job that had them in the process (as in a Hydra multirun), and that job must see none. The
    8-GPU layout goes last, so no job after it could inherit NeMo's parallel state."""
    base = tmp_path_factory.mktemp("nemo1")
    launcher_config = launcher_training_config(run_dir(base, "launcher"))
    runs = [
        Run("no-override", SCRIPT, []),
        Run("overrides", SCRIPT, ["+callbacks=throughput", "callbacks.throughput.log_every_n_steps=3",
                                  "callbacks.throughput.run_label=bare-metal"]),
        Run("debug", SCRIPT, ["+callbacks=throughput_debug"]),
        Run("in-code", SCRIPT, ["+callbacks=throughput"], env={"THROUGHPUT_IN_CODE": "1"}),
        *[Run(f"bad-{i}", SCRIPT, ["+callbacks=throughput", override]) for i, (override, _) in enumerate(BAD_SETTINGS)],
        Run("launcher", SCRIPT, [f"--config-path={launcher_config.parent}", f"--config-name={launcher_config.name}"]),
        Run("fp8-8-gpus", SCRIPT, ["+callbacks=throughput", "trainer.precision=bf16-mixed", "model.fp8=true",
                                   "model.fp8_hybrid=true", "trainer.devices=8", "model.tensor_model_parallel_size=2",
                                   "model.pipeline_model_parallel_size=2", "model.global_batch_size=16"]),
    ]
    return run_in_one_process(runs, base)


def test_one_callback_with_the_overrides_and_the_shape_read_from_nemo(jobs):
    result = jobs["overrides"]
    record = result.record
    assert result.returncode == 0, result.stderr[-3000:]
    assert record["callbacks"].count("ThroughputCallback") == 1
    (settings,) = record["settings"]
    assert settings["log_every_n_steps"] == 3 and settings["run_label"] == "bare-metal"
    assert settings["warmup_steps"] == 10  # the group's default
    (facts,) = record["facts"]
    assert facts["environment"]["model_config_source"] == "nemo1 cfg"
    spec = facts["model_spec"]
    # from cfg.model: fast-swiglu is gated, GQA groups, NeMo's padded byte-level vocabulary (512)
    assert (spec["num_layers"], spec["hidden_size"], spec["num_attention_heads"], spec["num_query_groups"],
            spec["ffn_hidden_size"], spec["gated_linear_unit"], spec["seq_length"], spec["vocab_size"]) == (
        2, 64, 4, 2, 224, True, 64, 512)
    assert (facts["global_batch_size"], facts["micro_batch_size"], facts["seq_length"]) == (8, 2, 64)
    assert facts["dtype"] in ("fp32", "tf32") and facts["label"] == "bare-metal"
    assert facts["parallel"] == {"data": 1, "tensor": 1, "pipeline": 1, "context": 1}


def test_precision_fp8_and_parallel_layout_follow_nemo_settings(jobs):
    result = jobs["fp8-8-gpus"]
    record = result.record
    assert result.returncode == 0, result.stderr[-3000:]
    (facts,) = record["facts"]
    assert facts["dtype"] == "fp8"
    assert facts["num_gpus"] == 8
    assert facts["parallel"] == {"data": 2, "tensor": 2, "pipeline": 2, "context": 1}
    assert facts["model_spec"]["vocab_size"] == 512  # 512 is already a multiple of 128 x TP 2


def test_debug_variant(jobs):
    result = jobs["debug"]
    record = result.record
    assert result.returncode == 0, result.stderr[-3000:]
    (settings,) = record["settings"]
    assert settings["log_every_n_steps"] == 1 and settings["per_step_jsonl"] is True


def test_without_the_override_nemo_gets_no_callback(jobs):
    result = jobs["no-override"]
    record = result.record
    assert result.returncode == 0, result.stderr[-3000:]
    assert "ThroughputCallback" not in record["callbacks"]


def test_a_recipe_that_adds_it_in_code_keeps_exactly_one(jobs):
    result = jobs["in-code"]
    record = result.record
    assert result.returncode == 0, result.stderr[-3000:]
    assert record["callbacks"].count("ThroughputCallback") == 1
    assert record["from_hydra_config"] == [False]  # the one in code wins
    assert record["settings"][0]["log_every_n_steps"] == 7
    assert "ignoring the one from `+callbacks=throughput`" in result.stderr + result.stdout


@pytest.mark.parametrize("index", range(len(BAD_SETTINGS)), ids=[override for override, _ in BAD_SETTINGS])
def test_bad_settings_stop_the_job_before_the_trainer_exists(jobs, index):
    message = BAD_SETTINGS[index][1]
    result = jobs[f"bad-{index}"]
    assert result.returncode != 0 and result.record is None
    assert message in result.stderr


def test_nemo_megatron_launcher_route(jobs):
    """The launcher's saved config (launcher_training_config) run with --config-path/--config-name."""
    result = jobs["launcher"]
    record = result.record
    assert result.returncode == 0, result.stderr[-3000:]
    assert record["callbacks"].count("ThroughputCallback") == 1
    assert record["settings"][0]["log_every_n_steps"] == 20 and record["settings"][0]["warmup_steps"] == 10
