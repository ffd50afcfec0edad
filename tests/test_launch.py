"""Launchers: rendered files against golden copies, shell syntax, offline Kubernetes validation,
clear errors, and the pod command run end to end with the environment the operator injects."""

import copy
import datetime as dt
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import free_port, nemo_throughput_cli, read_json
from nemo_throughput.launch import LaunchError
from nemo_throughput.launch.kubernetes import (
    KubernetesJob,
    manifest_yaml,
    pod_script,
    render_manifest,
    validate_manifest,
)
from nemo_throughput.launch.slurm import SlurmJob, render_sbatch

GOLDEN = Path(__file__).parent / "golden"
NEMO_COMMAND = ["python", "/opt/NeMo/examples/nlp/language_modeling/megatron_gpt_pretraining.py",
                "trainer.num_nodes=4", "trainer.devices=8", "+callbacks=throughput"]
FIXED_TIME = dt.datetime(2026, 11, 21, 12, 0, tzinfo=dt.timezone.utc)

SLURM_JOBS = {
    "slurm-bare-metal.sbatch": SlurmJob(command=NEMO_COMMAND, nodes=4, gpus_per_node=8, partition="batch",
                                        account="myacct", time="01:00:00", repeat=3, label="bare-metal",
                                        results_dir="/lustre/runs"),
    "slurm-pyxis.sbatch": SlurmJob(command=NEMO_COMMAND, nodes=4, gpus_per_node=8, image="nvcr.io/nvidia/nemo:24.09",
                                   mounts=["/lustre:/lustre", "/data:/data:ro"], workdir="/lustre/work",
                                   results_dir="/lustre/runs"),
}
K8S_JOBS = {
    "k8s-runai-rdma.yaml": KubernetesJob(command=NEMO_COMMAND, image="nvcr.io/nvidia/nemo:24.09", nodes=4,
                                         gpus_per_node=8, namespace="team-a", rdma_resource="rdma/ib", rdma_count=8,
                                         scheduler_name="runai-scheduler", queue="team-a", summary_volume="runs",
                                         repeat=3, label="kubernetes", job_name="llama-4n"),
    "k8s-single-node.yaml": KubernetesJob(command=["python", "-m", "nemo_throughput.demo.train",
                                                   "+callbacks=throughput"],
                                          image="example.com/demo:1", nodes=1, gpus_per_node=2, job_name="demo"),
}


def rendered(name: str) -> str:
    if name in SLURM_JOBS:
        return render_sbatch(SLURM_JOBS[name], now=FIXED_TIME)
    return manifest_yaml(render_manifest(K8S_JOBS[name]))


@pytest.mark.parametrize("name", [*SLURM_JOBS, *K8S_JOBS])
def test_rendered_files_match_the_golden_copies(name):
    """Regenerate after an intended change with UPDATE_GOLDEN=1 and review the diff."""
    golden = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_text(rendered(name))
    assert rendered(name) == golden.read_text()


@pytest.mark.parametrize("name", [*SLURM_JOBS, *K8S_JOBS])
def test_every_generated_script_is_valid_bash(name, tmp_path):
    if name in SLURM_JOBS:
        script = rendered(name)
    else:
        script, _ = pod_script(render_manifest(K8S_JOBS[name]))
    path = tmp_path / "script.sh"
    path.write_text(script)
    result = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_the_template_itself_is_valid_bash_and_a_valid_manifest():
    from nemo_throughput.launch import TEMPLATES

    assert subprocess.run(["bash", "-n", str(TEMPLATES / "slurm" / "benchmark.sbatch")]).returncode == 0
    validate_manifest(yaml.safe_load((TEMPLATES / "kubernetes" / "pytorchjob.yaml").read_text()))


def test_slurm_script_settings():
    script = rendered("slurm-pyxis.sbatch")
    assert "#SBATCH --nodes=4\n#SBATCH --ntasks-per-node=8\n#SBATCH --gpus-per-node=8" in script
    assert "#SBATCH --exclusive\n#SBATCH --mem=0\n" in script
    assert "IMAGE=nvcr.io/nvidia/nemo:24.09\nMOUNTS=/lustre:/lustre,/data:/data:ro\n" in script
    assert "--no-container-mount-home" in script and "--container-env=MASTER_ADDR,MASTER_PORT" in script
    assert 'srun --kill-on-bad-exit=1 "${container[@]}" "$@"' in script


# ----------------------------------------------------------------------------- validation
def test_rendered_manifests_validate():
    for job in K8S_JOBS.values():
        validate_manifest(render_manifest(job))


def _container(manifest, replica="Worker"):
    return manifest["spec"]["pytorchReplicaSpecs"][replica]["template"]["spec"]["containers"][0]


MUTATIONS = {
    "misspelt container field": (lambda m: _container(m).update(imagee="x"), "imagee: unknown field"),
    "misspelt job field": (lambda m: m["spec"].update(nprocPerNodes="8"), "nprocPerNodes: unknown field"),
    "string for a number": (lambda m: m["spec"]["pytorchReplicaSpecs"]["Worker"].update(replicas="three"),
                            "not a PyTorchJob"),
    "number for a string": (lambda m: _container(m)["env"][4].update(value=3), "is not of the expected type"),
    "container not named pytorch": (lambda m: _container(m, "Master").update(name="main"),
                                    "container named `pytorch`"),
    "two masters": (lambda m: m["spec"]["pytorchReplicaSpecs"]["Master"].update(replicas=2),
                    "one Master (replicas: 1)"),
    "not a quantity": (lambda m: _container(m)["resources"]["limits"].update({"nvidia.com/gpu": "lots"}),
                       "'lots' is not a quantity"),
    "pod field of a wrong type": (lambda m: _container(m)["ports"][0].update(containerPort="23456"),
                                  "is not of the expected type"),
}


@pytest.mark.parametrize("mutation", MUTATIONS)
def test_a_wrong_field_fails_the_check(mutation):
    manifest = copy.deepcopy(render_manifest(K8S_JOBS["k8s-runai-rdma.yaml"]))
    mutate, message = MUTATIONS[mutation]
    mutate(manifest)
    with pytest.raises(LaunchError, match=re.escape(message)):
        validate_manifest(manifest)


def test_kubernetes_validate_rejects_a_pod_field_the_sdk_would_accept():
    manifest = render_manifest(K8S_JOBS["k8s-single-node.yaml"])
    _container(manifest, "Master")["env"].append({"name": "X", "value": "1", "valueFrom": []})
    with pytest.raises(LaunchError, match="Master pod template"):
        validate_manifest(manifest)


# ----------------------------------------------------------------------------- errors
def cli(*args, path=None, cwd=None):
    env = {**os.environ, **({"PATH": path} if path is not None else {})}
    return nemo_throughput_cli("launch", *args, env=env, cwd=cwd)


@pytest.mark.parametrize("args, message", [
    (["slurm", "--nodes", "0", "--", "python", "t.py"], "--nodes must be at least 1, got 0"),
    (["slurm", "--gpus-per-node", "0", "--", "python", "t.py"], "--gpus-per-node must be at least 1"),
    (["slurm", "--repeat", "0", "--", "python", "t.py"], "--repeat must be at least 1"),
    (["slurm", "--time", "soon", "--", "python", "t.py"], "--time 'soon' is not a Slurm time"),
    (["slurm", "--mounts", "/a:/a", "--", "python", "t.py"], "--mounts applies to a container: give --image"),
    (["slurm", "--image", "nemo:1", "--results-dir", "/runs", "--", "python", "t.py"],
     "--results-dir /runs is not under any --mounts destination"),
    (["slurm", "--image", "nemo:1", "--mounts", "/a", "--", "python", "t.py"], "'/a' is not src:dst"),
    (["slurm"], "no training command: put it after `--`"),
    (["slurm", "--"], "no training command"),
    (["k8s", "--image", "nemo:1"], "no training command"),
    (["k8s", "--image", "nemo:1", "--", "torchrun", "t.py"], "must be `python <script or -m module> ...`"),
    (["k8s", "--image", "nemo:1", "--rdma-count", "8", "--", "python", "t.py"], "--rdma-resource and --rdma-count"),
    (["k8s", "--image", "nemo:1", "--job-name", "Llama_70B", "--", "python", "t.py"], "must be lower-case"),
    (["k8s", "--", "python", "t.py"], "the following arguments are required: --image"),
])
def test_impossible_requests_fail_with_the_fix(args, message, tmp_path):
    result = cli(*args, cwd=tmp_path)
    assert result.returncode == 2 and message in result.stderr
    assert list(tmp_path.iterdir()) == []  # nothing written


@pytest.mark.parametrize("target, tool", [("slurm", "sbatch"), ("k8s", "kubectl")])
def test_submit_without_the_tool_on_path_says_so(target, tool, tmp_path):
    python_only = str(Path(sys.executable).parent)  # no sbatch or kubectl in the venv's bin
    extra = ["--image", "nemo:1"] if target == "k8s" else []
    result = cli(target, *extra, "--submit", "--", "python", "t.py", path=python_only, cwd=tmp_path)
    assert result.returncode == 2
    assert f"--submit needs `{tool}` on PATH; without --submit the file is written for you" in result.stderr


def test_without_submit_the_file_is_written_and_named(tmp_path):
    result = cli("k8s", "--image", "nemo:1", "--nodes", "2", "--job-name", "demo", "--", "python", "t.py",
                 cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "wrote demo.yaml" in result.stdout and "without --summary-volume" in result.stdout
    validate_manifest(yaml.safe_load((tmp_path / "demo.yaml").read_text()))


# ----------------------------------------------------------------------------- the pod command
@pytest.mark.slow
def test_pod_command_runs_end_to_end_with_the_operator_environment(tmp_path):
    """Two 'pods' on this host, each with exactly the variables training-operator v1.9 injects into
    the `pytorch` container (pkg/controller.v1/pytorch/envvar.go) for a 2-replica PyTorchJob with
    nprocPerNode 1, plus the pod's own env from the manifest (downward API values filled in)."""
    job = KubernetesJob(command=["python", "-m", "nemo_throughput.demo.train", "+callbacks=throughput",
                                 "trainer.devices=1", "trainer.num_nodes=2", "trainer.max_steps=8",
                                 "callbacks.throughput.warmup_steps=2", "callbacks.throughput.log_every_n_steps=4",
                                 f"exp_manager.exp_dir={tmp_path / 'exp'}", f"hydra.run.dir={tmp_path}"],
                        image="example.com/demo:1", nodes=2, gpus_per_node=1, label="kubernetes", job_name="demo-2p")
    manifest = render_manifest(job)
    validate_manifest(manifest)
    port = free_port()
    pods = []
    for replica, index, rank in (("Master", 0, 0), ("Worker", 0, 1)):
        script, args = pod_script(manifest, replica)
        container = _container(manifest, replica)
        env = {item["name"]: item["value"] for item in container["env"] if "value" in item}
        env["RESULTS"] = str(tmp_path / "results")  # the volume mounted at /results
        pod_name = f"demo-2p-{replica.lower()}-{index}"
        env.update(POD_NAME=pod_name, POD_NAMESPACE="default", NODE_NAME=f"k8s-node-{rank + 1}", JOB_NAME="demo-2p",
                   KUBERNETES_SERVICE_HOST="10.96.0.1", KUBERNETES_SERVICE_PORT="443")
        # training-operator: PYTHONUNBUFFERED, MASTER_*, WORLD_SIZE (pods x nprocPerNode), RANK, PET_*
        env.update(PYTHONUNBUFFERED="1", MASTER_PORT=str(port), PET_MASTER_PORT=str(port),
                   MASTER_ADDR="127.0.0.1", PET_MASTER_ADDR="127.0.0.1",  # <job>-master-0 resolves to the pod
                   WORLD_SIZE="2", RANK=str(rank), PET_NODE_RANK=str(rank), PET_NPROC_PER_NODE="1", PET_NNODES="2")
        env["PATH"] = f"{Path(sys.executable).parent}:{os.environ['PATH']}"  # the image's python and torchrun
        pods.append(subprocess.Popen(["bash", "-c", script, *args], env=env, cwd=tmp_path, text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    outputs = [pod.communicate(timeout=240)[0] for pod in pods]
    assert [pod.returncode for pod in pods] == [0, 0], "\n".join(outputs)

    summary = read_json(tmp_path / "results" / "demo-2p" / "repeat-1" / "summary.json")
    environment = summary["environment"]
    assert summary["status"] == "completed" and summary["run"]["label"] == "kubernetes"
    assert environment["orchestrator"] == "kubernetes"
    assert environment["job"]["job_name"] == "demo-2p" and environment["job"]["repeat"] == "1"
    assert environment["container_image"] == "example.com/demo:1" and environment["gpus_per_node"] == 1
    assert [(n["name"], n["ranks"], n["pods"]) for n in environment["nodes"]] == [
        ("k8s-node-1", [0], ["demo-2p-master-0"]), ("k8s-node-2", [1], ["demo-2p-worker-0"])]
    assert summary["hardware"]["num_gpus"] == 2 and summary["hardware"]["num_nodes"] == 2
    assert summary["timing"]["steps_measured"] == 6
