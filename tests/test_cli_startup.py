"""The commands that do not train start without loading torch, Lightning, matplotlib or Megatron.

Not a timing test (the machine is shared): each command runs for real in a fresh interpreter, which
then reports what it imported. Loading torch alone takes seconds; that is what kept `--help`,
`launch`, `report`, `compare` and `import` from starting in under half a second.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LOG = REPO / "tests" / "data" / "import" / "megatron_lm_mixtral_issue756.log"  # real log, see ORIGIN.md
MLPERF = REPO / "tests" / "data" / "mlperf" / "NVIDIA" / "eos_ngc24.04_nemo" / "llama2_70b_lora"  # real results
HEAVY = ("torch", "lightning", "pytorch_lightning", "matplotlib", "megatron", "nemo", "mlperf_logging", "hydra",
         "omegaconf", "numpy")

# Runs the CLI in-process in a fresh interpreter; prints its exit code, stdout and the heavy modules loaded.
RUN_CLI = f"""
import contextlib, io, json, sys
from nemo_throughput.cli import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    try:
        code = main(json.loads(sys.argv[1]))
    except SystemExit as exit:
        code = exit.code
print(json.dumps({{"code": code, "stdout": out.getvalue(),
                  "loaded": [m for m in {HEAVY!r} if m in sys.modules]}}))
"""


def run_fresh(code: str, *args: str, cwd: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return {**json.loads(done.stdout.splitlines()[-1]), "stderr": done.stderr}


def run_cli(argv: list[str], cwd: Path) -> dict:
    return run_fresh(RUN_CLI, json.dumps(argv), cwd=cwd)


@pytest.fixture(scope="module")
def imported_runs(tmp_path_factory) -> Path:
    """Summaries of a real log, written by `nemo-throughput import` in a fresh interpreter: counting
    its steps (the run statistics the callback uses too) loads no torch."""
    out = tmp_path_factory.mktemp("imported")
    result = run_cli(["import", str(LOG), "--label", "bare-metal", "--model", "gpt3-126m", "--seq-length", "2048",
                      "--num-gpus", "16", "--output-dir", str(out)], cwd=out)
    assert result["code"] == 0, result["stderr"]
    assert result["loaded"] == []
    return out


def test_import_of_a_real_log_counts_its_steps_without_torch(imported_runs):
    summary = json.loads(next(imported_runs.rglob("summary.json")).read_text())
    assert summary["timing"]["steps_measured"] > 0 and summary["timing"]["step_time_s"]["mean"] > 0


def test_import_of_real_mlperf_results_loads_only_the_mlperf_logger(tmp_path):
    out = tmp_path / "out"
    result = run_cli(["import", "--format", "mlperf", str(MLPERF), "--ruleset", "4.0.0", "--output-dir", str(out)],
                     tmp_path)
    assert result["code"] == 0, result["stderr"]
    assert len(list(out.rglob("summary.json"))) == len(list(MLPERF.glob("result_*.txt")))
    assert result["loaded"] == ["mlperf_logging"]


@pytest.mark.parametrize("argv, usage", [
    ([], "usage: nemo-throughput"),  # no command: argparse's error, exit 2
    (["--help"], "usage: nemo-throughput"),
    (["launch", "--help"], "usage: nemo-throughput launch"),
    (["launch", "slurm", "--help"], "usage: nemo-throughput launch slurm"),
    (["launch", "k8s", "--help"], "usage: nemo-throughput launch k8s"),
    (["report", "--help"], "usage: nemo-throughput report"),
    (["compare", "--help"], "usage: nemo-throughput compare"),
    (["import", "--help"], "usage: nemo-throughput import"),
    (["demo", "--help"], "usage: nemo-throughput demo"),
    (["bench", "--help"], "usage: nemo-throughput bench"),
    (["probe", "--help"], "usage: nemo-throughput probe"),
])
def test_help_loads_nothing_heavy(argv, usage, tmp_path):
    result = run_cli(argv, tmp_path)
    assert usage in result["stdout"] + result["stderr"]
    assert result["code"] == (0 if argv else 2)
    assert result["loaded"] == []


def test_report_on_real_summaries_loads_nothing_heavy(imported_runs, tmp_path):
    result = run_cli(["report", str(imported_runs)], tmp_path)
    assert result["code"] == 0, result["stderr"]
    assert "bare-metal" in result["stdout"]
    assert result["loaded"] == []


def test_compare_of_real_summaries_loads_nothing_heavy(imported_runs, tmp_path):
    result = run_cli(["compare", str(imported_runs), str(imported_runs)], tmp_path)
    assert result["code"] == 0, result["stderr"]
    assert "inconclusive" in result["stdout"]
    assert result["loaded"] == []


def test_report_window_counting_from_the_end_is_the_value_of_window(imported_runs, tmp_path):
    """`--window -1:` starts with '-', as an option would: it is still the window (the last step)."""
    last_step = run_cli(["report", str(imported_runs), "--window", "-1:", "--format", "csv"], tmp_path)
    assert last_step["code"] == 0, last_step["stderr"]
    assert last_step["stdout"] == run_cli(["report", str(imported_runs), "--window", "last", "--format", "csv"],
                                          tmp_path)["stdout"]
    assert last_step["stdout"] != run_cli(["report", str(imported_runs), "--format", "csv"], tmp_path)["stdout"]
    assert last_step["loaded"] == []


@pytest.mark.parametrize("target, extra", [("slurm", []), ("k8s", ["--image", "nemo:1"])])
def test_launch_writes_its_job_without_loading_anything_heavy(target, extra, tmp_path):
    job = tmp_path / f"job.{target}"
    result = run_cli(["launch", target, *extra, "--nodes", "2", "--output", str(job), "--", "python", "t.py"],
                     tmp_path)
    assert result["code"] == 0, result["stderr"]
    assert job.is_file() and "t.py" in job.read_text()
    assert result["loaded"] == []


@pytest.mark.parametrize("options, refusal, needed", [
    (["--model", "gpt3-126m"], "give --seq-length", []),  # checked before any log is read
    (["--format", "mlperf"], "no `:::MLLOG` lines", ["mlperf_logging"]),  # read: it loads only what it uses
])
def test_import_refusals_load_nothing_heavy(options, refusal, needed, tmp_path):
    """A refused `import` stops before reading more than it needs."""
    result = run_cli(["import", str(LOG), "--label", "x", *options, "--output-dir", str(tmp_path / "out")], tmp_path)
    assert result["code"] == 2
    assert result["stderr"].startswith("nemo-throughput import: ") and refusal in result["stderr"]
    assert result["loaded"] == needed


def test_package_import_is_light_and_its_public_names_still_resolve(tmp_path):
    probe = """
import json, sys
import nemo_throughput
light = [m for m in ("torch", "lightning", "pytorch_lightning") if m in sys.modules]
names = {name: type(getattr(nemo_throughput, name)).__name__ for name in nemo_throughput.__all__}
unlisted = sorted(set(nemo_throughput.__all__) - set(dir(nemo_throughput)))
print(json.dumps({"light": light, "names": names, "dir": unlisted}))
"""
    result = run_fresh(probe, cwd=tmp_path)
    assert result["light"] == []  # measured right after `import nemo_throughput`, before any name is used
    assert set(result["names"]) == {"BridgeThroughputCallback", "FORMULAS", "SCHEMA", "ModelSpec",
                                    "NemoThroughputError", "ThroughputCallback", "ThroughputConfig", "Workload",
                                    "mfu", "nemo_callback", "model_flops_per_sample", "peak_tflops", "read_summary"}
    assert result["names"]["ThroughputCallback"] == "type" and result["names"]["mfu"] == "function"
    assert result["dir"] == []
