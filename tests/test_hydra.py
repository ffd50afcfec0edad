"""`+callbacks=throughput` through real Hydra composition, the job callback and Lightning's
callbacks_factory entry points, from an editable install and from the built wheel."""

import dataclasses
import json
import os
import subprocess
import sys
import venv
from importlib.metadata import entry_points
from pathlib import Path

import pytest
from hydra import compose, initialize
from hydra.core.plugins import Plugins
from hydra.plugins.search_path_plugin import SearchPathPlugin
from omegaconf import OmegaConf

from nemo_throughput.config import ThroughputConfig

REPO = Path(__file__).parents[1]


def compose_callbacks(*overrides):
    with initialize(version_base=None, config_path=None):
        return compose(overrides=list(overrides), return_hydra_config=True)


def test_search_path_plugin_is_discovered():
    names = [plugin.__name__ for plugin in Plugins.instance().discover(SearchPathPlugin)]
    assert "NemoThroughputSearchPathPlugin" in names


def test_config_group_holds_every_setting_with_the_dataclass_default():
    cfg = compose_callbacks("+callbacks=throughput")
    composed = OmegaConf.to_container(cfg.callbacks.throughput)
    defaults = {f.name: f.default for f in dataclasses.fields(ThroughputConfig)}
    assert composed == defaults
    assert cfg.hydra.callbacks.nemo_throughput._target_ == "nemo_throughput.adapters.hydra.KeepThroughputConfig"


def test_overrides_and_the_debug_variant_compose():
    cfg = compose_callbacks("+callbacks=throughput", "callbacks.throughput.log_every_n_steps=20",
                            "callbacks.throughput.run_label=kubernetes")
    assert cfg.callbacks.throughput.log_every_n_steps == 20 and cfg.callbacks.throughput.run_label == "kubernetes"
    debug = compose_callbacks("+callbacks=throughput_debug").callbacks.throughput
    assert debug.log_every_n_steps == 1 and debug.per_step_jsonl is True and debug.warmup_steps == 10


def test_explain_settings_compose_from_the_command_line():
    cfg = compose_callbacks("+callbacks=throughput", "callbacks.throughput.profile_steps=[20,25]",
                            "callbacks.throughput.profile_trace_ranks=[0,8]", "callbacks.throughput.probe=true")
    config = ThroughputConfig.from_mapping(OmegaConf.to_container(cfg.callbacks.throughput))
    assert (config.profile_steps, config.profile_trace_ranks, config.probe) == ((20, 25), (0, 8), True)
    for bad, message in (("profile_steps=[25,20]", "first <= last"), ("profile_steps=20", r"\[first, last\]"),
                         ("profile_mode=nvprof", "Unknown profile_mode"), ("profile_trace_ranks=[-1]", "ranks"),
                         ("telemetry=maybe", "telemetry must be true or false")):
        section = OmegaConf.to_container(compose_callbacks("+callbacks=throughput",
                                                           f"callbacks.throughput.{bad}").callbacks.throughput)
        with pytest.raises(ValueError, match=message):
            ThroughputConfig.from_mapping(section)


def test_factories_are_registered_for_both_lightning_namespaces():
    for group in ("lightning.pytorch.callbacks_factory", "pytorch_lightning.callbacks_factory"):
        (ours,) = [ep for ep in entry_points(group=group) if ep.name == "nemo_throughput"]
        assert ours.value == "nemo_throughput.adapters.hydra:callbacks_factory"


def run_python(*args, python=sys.executable, cwd=None, timeout=180):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run([python, *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout)


TWO_JOBS_IN_ONE_PROCESS = """
import sys

import hydra
import pytorch_lightning as pl


@hydra.main(version_base=None, config_path=None)
def job(cfg) -> None:
    trainer = pl.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False)
    print(sys.argv[1], sorted(type(c).__name__ for c in trainer.callbacks), flush=True)


for override in ("+callbacks=throughput", "+other=1"):
    sys.argv = ["job", override, "hydra.run.dir=.", "hydra.output_subdir=null"]
    job()
"""


def demo_overrides(tmp_path, *extra):
    return ["-m", "nemo_throughput.demo.train", *demo_args(tmp_path, *extra)]


def demo_args(tmp_path, *extra):
    return ["trainer.devices=1", "trainer.max_steps=6", "model.global_batch_size=4", "model.num_layers=1",
            f"exp_manager.exp_dir={tmp_path}", f"hydra.run.dir={tmp_path}", *extra]


WRONG_SETTINGS = [
    ("callbacks.throughput.peak_tflops=abc", "peak_tflops must be a number"),
    ("callbacks.throughput.dtype=123", "dtype must be a string"),
    ("callbacks.throughput.model_spec=5", "model_spec must be a mapping"),
    ("callbacks.throughput.run_label=123", "run_label must be a string"),
    ("callbacks.throughput.per_step_jsonl=no", "per_step_jsonl must be true or false"),
    ("callbacks.throughput.peak_tflops=-1", "peak_tflops must be a positive"),
]


def trainer_without_asking(namespace):
    return (f"import {namespace} as pl\nt = pl.Trainer(logger=False)\n"
            "print(sorted(type(c).__name__ for c in t.callbacks))\n")


@dataclasses.dataclass
class Run:
    dir: Path
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """This module's programs, each as `python FILE` or `python -m nemo_throughput.demo.train ARGS`
    would run it, all in ONE fresh interpreter (tests/scripts/run_in_one_process.py), one after
    another: importing torch, Lightning and Hydra is most of each run's time. The Trainers that did
    not ask come first, before any job asked; the demo's jobs follow one another as in Hydra's
    multirun, so a setting must not leak from one job into the next."""
    base = tmp_path_factory.mktemp("runs")
    (base / "a-file").write_text("")
    programs = {
        "no_ask_lightning.pytorch": trainer_without_asking("lightning.pytorch"),
        "no_ask_pytorch_lightning": trainer_without_asking("pytorch_lightning"),
        "two_jobs": TWO_JOBS_IN_ONE_PROCESS,
    }
    jobs = {
        "misspelt_added": ["+callbacks=throughput", "+callbacks.throughput.log_every=3"],
        "misspelt": ["+callbacks=throughput", "callbacks.throughput.log_every=3"],
        **{override: ["+callbacks=throughput", override] for override, _ in WRONG_SETTINGS},
        "output_dir_under_a_file": ["+callbacks=throughput", f"callbacks.throughput.output_dir={base}/a-file/run"],
        "debug": ["+callbacks=throughput_debug", "callbacks.throughput.warmup_steps=2",
                  f"callbacks.throughput.output_dir={base}/debug/throughput"],
    }
    specs = []
    for index, (name, text) in enumerate(programs.items()):
        run_dir = base / f"program{index}"
        run_dir.mkdir()
        (run_dir / "program.py").write_text(text)
        specs.append({"name": name, "program": str(run_dir / "program.py"), "cwd": str(run_dir), "argv": []})
    for index, (name, extra) in enumerate(jobs.items()):
        run_dir = base / f"job{index}"  # its working, Hydra and experiment directory
        run_dir.mkdir()
        specs.append({"name": name, "module": "nemo_throughput.demo.train", "cwd": str(run_dir),
                      "argv": demo_args(run_dir, *extra)})
    (base / "runs.json").write_text(json.dumps(specs))
    driver = run_python(REPO / "tests" / "scripts" / "run_in_one_process.py", base / "runs.json", cwd=base,
                        timeout=600)
    assert driver.returncode == 0, driver.stderr[-3000:]
    results = {"base": base}
    for spec in specs:
        run_dir = Path(spec["cwd"])
        results[spec["name"]] = Run(run_dir, int((run_dir / "exit_code").read_text()),
                                    (run_dir / "stdout.txt").read_text(), (run_dir / "stderr.txt").read_text())
    return results


def test_a_later_job_in_the_same_process_that_did_not_ask_gets_no_callback(runs):
    result = runs["two_jobs"]
    assert result.returncode == 0, result.stderr
    asked, other = [line for line in result.stdout.splitlines() if line.startswith("+")]
    assert "ThroughputCallback" in asked and "ThroughputCallback" not in other


@pytest.mark.parametrize("namespace", ["lightning.pytorch", "pytorch_lightning"])
def test_a_trainer_that_did_not_ask_gets_no_callback(runs, namespace):
    result = runs[f"no_ask_{namespace}"]
    assert result.returncode == 0, result.stderr
    assert "ThroughputCallback" not in result.stdout and "[" in result.stdout


@pytest.mark.slow
def test_misspelt_keys_fail_at_start_up_with_the_valid_keys(runs):
    result = runs["misspelt_added"]
    assert result.returncode != 0
    assert "Unknown throughput setting(s) ['log_every']; valid keys: ['log_every_n_steps'" in result.stderr
    assert "Trainer" not in result.stderr  # it failed before any training was set up
    # without the +, Hydra itself refuses the key
    result = runs["misspelt"]
    assert result.returncode != 0 and "log_every" in result.stderr


@pytest.mark.slow
def test_debug_variant_writes_every_step(runs):
    out = runs["base"] / "debug" / "throughput"
    assert runs["debug"].returncode == 0, runs["debug"].stderr
    assert len((out / "steps.jsonl").read_text().splitlines()) == 6
    assert json.loads((out / "summary.json").read_text())["timing"]["steps_measured"] == 4


@pytest.mark.slow
def test_the_built_wheel_works_on_its_own(tmp_path):
    """Build the wheel, install it where the editable install cannot be seen, and run the demo."""
    dist = tmp_path / "dist"
    built = run_python("-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet", "-w", dist, str(REPO),
                       timeout=300)
    assert built.returncode == 0, built.stderr
    (wheel,) = dist.glob("nemo_throughput-*.whl")
    target = tmp_path / "site"
    installed = run_python("-m", "pip", "install", "--no-deps", "--quiet", "--target", target, wheel)
    assert installed.returncode == 0, installed.stderr
    assert (target / "nemo_throughput" / "conf" / "callbacks" / "throughput.yaml").is_file()
    assert (target / "hydra_plugins" / "nemo_throughput_searchpath" / "__init__.py").is_file()
    assert (target / "nemo_throughput" / "launchers" / "slurm" / "benchmark.sbatch").is_file()

    # A bare interpreter that sees the wheel first and this venv's dependencies, but not the
    # venv's .pth files (so not the editable install of the repository).
    isolated = tmp_path / "venv"
    venv.create(isolated, with_pip=False)
    site_packages = next(Path(p) for p in sys.path if p.endswith("site-packages") and Path(p).is_dir())
    (next(isolated.glob("lib/python*/site-packages")) / "paths.pth").write_text(f"{target}\n{site_packages}\n")
    python = isolated / "bin" / "python"
    where = run_python("-c", "import nemo_throughput; print(nemo_throughput.__file__)", python=python, cwd=tmp_path)
    assert where.stdout.startswith(str(target)), where.stdout + where.stderr

    out = tmp_path / "run"
    result = run_python(*demo_overrides(out, "+callbacks=throughput", f"callbacks.throughput.output_dir={out}",
                                        "callbacks.throughput.warmup_steps=1"), python=python, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads((out / "summary.json").read_text())["status"] == "completed"


@pytest.mark.slow
@pytest.mark.parametrize("override, message", WRONG_SETTINGS)
def test_a_wrong_setting_on_the_command_line_stops_the_job_before_training(runs, override, message):
    """Hydra turns exceptions of job callbacks into warnings: the job must still fail, not train unmeasured."""
    result = runs[override]
    assert result.returncode != 0, result.stderr
    assert f"nemo-throughput: {message}" in result.stderr
    assert "raised" not in result.stderr  # not a warning from Hydra's callback runner
    assert "GPU available" not in result.stderr  # no Trainer was built
    assert not list(result.dir.rglob("summary.json"))


@pytest.mark.slow
def test_an_output_directory_under_a_file_stops_the_job_with_one_line(runs):
    """Found at the Trainer's set-up, after the job callback: still one line, no traceback."""
    result, base = runs["output_dir_under_a_file"], runs["base"]
    assert result.returncode != 0
    said = [line for line in result.stderr.splitlines() if "cannot write to the output directory" in line]
    assert len(said) == 1 and said[0].startswith(f"nemo-throughput: cannot write to the output directory "
                                                 f"{base}/a-file/run: Not a directory."), result.stderr
    assert "Traceback" not in result.stderr and "HYDRA_FULL_ERROR" not in result.stderr


def test_the_job_callback_stops_the_job_on_any_bad_setting():
    from nemo_throughput.adapters.hydra import KeepThroughputConfig

    for bad in ("callbacks.throughput.peak_tflops=abc", "callbacks.throughput.model_spec=5",
                "+callbacks.throughput.model_spec.num_layers=two"):
        cfg = compose_callbacks("+callbacks=throughput", bad)
        with pytest.raises(SystemExit, match="nemo-throughput: .*(peak_tflops|model_spec)"):
            KeepThroughputConfig().on_job_start(config=cfg)


def test_the_prometheus_endpoint_composes_from_the_command_line():
    cfg = compose_callbacks("+callbacks=throughput", "callbacks.throughput.prometheus={port:9464,linger_s:30}")
    config = ThroughputConfig.from_mapping(OmegaConf.to_container(cfg.callbacks.throughput))
    assert config.prometheus == {"port": 9464, "addr": "0.0.0.0", "linger_s": 30.0}
    section = OmegaConf.to_container(compose_callbacks(
        "+callbacks=throughput", "callbacks.throughput.prometheus={port:http}").callbacks.throughput)
    with pytest.raises(ValueError, match="prometheus.port must be a TCP port"):
        ThroughputConfig.from_mapping(section)
