"""Launchers: rendered files against golden copies, shell syntax, offline Kubernetes validation,
clear errors, and the pod command run end to end with the environment the operator injects."""

import copy
import datetime as dt
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import fill_up, free_port, nemo_throughput_cli, read_json
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
                                        results_dir="/lustre/runs", prometheus_port=9464),
    "slurm-pyxis.sbatch": SlurmJob(command=NEMO_COMMAND, nodes=4, gpus_per_node=8, image="nvcr.io/nvidia/nemo:24.09",
                                   mounts=["/lustre:/lustre", "/data:/data:ro"], workdir="/lustre/work",
                                   results_dir="/lustre/runs"),
}
K8S_JOBS = {
    "k8s-runai-rdma.yaml": KubernetesJob(command=NEMO_COMMAND, image="nvcr.io/nvidia/nemo:24.09", nodes=4,
                                         gpus_per_node=8, namespace="team-a", rdma_resource="rdma/ib", rdma_count=8,
                                         scheduler_name="runai-scheduler", queue="team-a", summary_volume="runs",
                                         repeat=3, label="kubernetes", job_name="llama-4n", prometheus_port=9464),
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
# What a YAML 1.2 or Go decoder (kubectl's) reads as a number, boolean or null where it stands plain:
# kubectl read `3e-4` as 0.0003, `0o17` as 15, `08` as 8 and `y` as true, which PyYAML reads as text.
NOT_TEXT_WHEN_PLAIN = re.compile(r"[-+]?(\d[\d_]*(\.\d*)?|\.\d+)([eE][-+]?\d+)?|[-+]?0[xXoObB][\da-fA-F_]+"
                                 r"|[-+]?\.(inf|Inf|INF)|\.(nan|NaN|NAN)|(?i:y|n|yes|no|on|off|true|false|null)|~|"
                                 r"\d+(:\d+)+|\d{4}-\d\d?-\d\d?.*")
TRICKY_WORDS = ["3e-4", "1e5", "1E3", "1e-08", "6.0e-6", "0o17", "0b101", "08", "012", "0x1F", "1_000", "+1", ".5",
                "5.", "1.0", "1:30", "yes", "no", "on", "off", "y", "n", "Y", "N", "true", "True", "null", "Null", "~",
                "", ".inf", "-.inf", ".nan", "2024-01-01"]


def test_every_string_of_a_manifest_is_a_string_to_any_yaml_reader():
    """Strings that a YAML 1.2 or Go decoder reads otherwise are quoted; where kubectl is installed,
    its own decoder reads the training command and the label back as written."""
    job = KubernetesJob(command=["python", "pretrain_gpt.py", *TRICKY_WORDS], image="nvcr.io/nvidia/nemo:24.09",
                        label="1e5", job_name="lr")
    manifest = render_manifest(job)
    text = manifest_yaml(manifest)
    assert yaml.safe_load(text) == manifest

    def scalars(node):
        if isinstance(node, yaml.ScalarNode):
            yield node
        for child in node.value if isinstance(node, yaml.SequenceNode) else ():
            yield from scalars(child)
        for key, value in node.value if isinstance(node, yaml.MappingNode) else ():
            yield from scalars(key)
            yield from scalars(value)

    plain_text = [n.value for n in scalars(yaml.compose(text)) if n.style is None and n.tag == "tag:yaml.org,2002:str"]
    assert "pretrain_gpt.py" in plain_text  # plain where unambiguous
    assert [word for word in plain_text if NOT_TEXT_WHEN_PLAIN.fullmatch(word)] == []
    if shutil.which("kubectl"):
        read = subprocess.run(["kubectl", "label", "--local", "-f", "-", "checked=yes", "-o", "json"], input=text,
                              capture_output=True, text=True, timeout=60)
        assert read.returncode == 0, read.stderr
        (container,) = json.loads(read.stdout)["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"][
            "containers"]
        assert container["args"][2:] == ["pretrain_gpt.py", *TRICKY_WORDS]
        assert {"name": "NEMO_THROUGHPUT_RUN_LABEL", "value": "1e5"} in container["env"]


def test_rendered_manifests_validate():
    for job in K8S_JOBS.values():
        validate_manifest(render_manifest(job))


def test_the_master_pod_alone_is_annotated_for_scraping_and_every_pod_knows_the_port():
    replicas = render_manifest(K8S_JOBS["k8s-runai-rdma.yaml"])["spec"]["pytorchReplicaSpecs"]
    assert replicas["Master"]["template"]["metadata"]["annotations"] == {
        "prometheus.io/scrape": "true", "prometheus.io/path": "/metrics", "prometheus.io/port": "9464"}
    assert "annotations" not in replicas["Worker"]["template"]["metadata"]  # rank 0 is in the Master pod
    for replica in ("Master", "Worker"):
        container = _container({"spec": {"pytorchReplicaSpecs": replicas}}, replica)
        assert {"name": "metrics", "containerPort": 9464} in container["ports"]
        assert {"name": "NEMO_THROUGHPUT_PROMETHEUS_PORT", "value": "9464"} in container["env"]


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
    (["k8s", "--image", "nemo:1", "--", "bash", "t.sh"], "must be `python <script or -m module> ...`"),
    (["k8s", "--image", "nemo:1", "--rdma-count", "8", "--", "python", "t.py"], "--rdma-resource and --rdma-count"),
    (["k8s", "--image", "nemo:1", "--job-name", "Llama_70B", "--", "python", "t.py"], "must be lower-case"),
    (["k8s", "--", "python", "t.py"], "the following arguments are required: --image"),
    (["slurm", "--prometheus-port", "70000", "--", "python", "t.py"], "--prometheus-port must be a TCP port"),
    (["k8s", "--image", "nemo:1", "--prometheus-port", "23456", "--", "python", "t.py"], "rendezvous port"),
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


def test_launches_in_the_same_second_get_jobs_of_their_own(tmp_path):
    """The default name had one-second resolution: a parallel sweep overwrote a manifest, and its
    `--submit` would have changed the first PyTorchJob into the second."""
    launches = [subprocess.Popen([Path(sys.executable).parent / "nemo-throughput", "launch", "k8s", "--image", "nemo:1",
                                  "--label", label, "--", "python", "t.py"], cwd=tmp_path, stdout=subprocess.PIPE,
                                 text=True) for label in ("a", "b", "c")]
    written = [re.fullmatch(r"wrote (nemo-throughput-\d{4}-\d{6}-[0-9a-f]{4})\.yaml\n.*", launch.communicate()[0],
                            re.DOTALL).group(1) for launch in launches]
    assert len(set(written)) == 3 and sorted(p.stem for p in tmp_path.glob("*.yaml")) == sorted(written)


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


# ----------------------------------------------------------------------------- hostile values (issue 10)
# Each value tries to leave its line or its quotes: a new line, a command separator, a command
# substitution, backticks, quotes. MARKER is what the injected command would create.
MARKER = "/tmp/nemo-throughput-injected"
HOSTILE = {
    "newline": f"batch\ntouch {MARKER}",
    "semicolon": f"batch;touch {MARKER}",
    "dollar-paren": f"$(touch {MARKER})",
    "backticks": f"`touch {MARKER}`",
    "quotes": "it's \"quoted\"",
}
PYXIS = dict(image="nvcr.io/nvidia/nemo:24.09", mounts=["/lustre:/lustre"], results_dir="/lustre/runs")
# Fields that reach an #SBATCH line (parsed by sbatch, where quoting rules are not a shell's) or
# Pyxis' own parsers: values outside what Slurm / Pyxis take are refused, whatever they hold.
SLURM_NAME_FIELDS = {"job_name": "--job-name", "partition": "--partition", "account": "--account",
                     "time": "--time", "image": "--image"}


@pytest.mark.parametrize("hostile", HOSTILE)
@pytest.mark.parametrize("field", SLURM_NAME_FIELDS)
def test_slurm_names_outside_slurms_syntax_are_refused(field, hostile):
    with pytest.raises(LaunchError, match=re.escape(SLURM_NAME_FIELDS[field])):
        SlurmJob(command=["python", "t.py"], **{**PYXIS, field: HOSTILE[hostile]})


@pytest.mark.parametrize("field, flag", [("results_dir", "--results-dir"), ("workdir", "--workdir"),
                                         ("label", "--label"), ("image", "--image")])
@pytest.mark.parametrize("control", ["\n", "\r", "\x1b", "\x00"])
def test_slurm_paths_and_labels_with_control_characters_are_refused(field, flag, control):
    value = f"/lustre/runs{control}touch {MARKER}" if field != "image" else f"nemo:1{control}x"
    with pytest.raises(LaunchError, match=re.escape(flag) + ".*control character"):
        SlurmJob(command=["python", "t.py"], **{**PYXIS, field: value})


# A red-team pass on a real two-node Slurm cluster and kubectl's own decoder: each of these ran
# something else than asked (more processes in separate worlds, trainings apart, a lost interpreter),
# leaked a password into a world-readable file, or wrote what no node could pull.
K8S = {"image": "nvcr.io/nvidia/nemo:24.09"}
WRONG_JOBS = [
    (SlurmJob, ["torchrun", "--nproc-per-node=2", "t.py"], {}, "starts its own processes (torchrun)"),
    (SlurmJob, ["/usr/bin/python3", "-u", "-m", "torch.distributed.run", "t.py"], {}, "(torch.distributed.run)"),
    (SlurmJob, ["python", "-mtorch.distributed.launch", "t.py"], {}, "(torch.distributed.launch)"),
    (SlurmJob, ["deepspeed", "t.py"], {}, "(deepspeed)"),
    (SlurmJob, ["accelerate", "launch", "t.py"], {}, "(accelerate)"),
    (SlurmJob, ["/opt/mpi/bin/mpirun", "-np", "8", "python", "t.py"], {}, "(mpirun)"),
    (KubernetesJob, ["python", "-m", "torch.distributed.run", "t.py"], K8S, "(torch.distributed.run)"),
    (KubernetesJob, ["/opt/venvs/nemo2/bin/python3.11", "t.py"], K8S, "must be `python <script or -m module> ...`"),
    (SlurmJob, ["", "t.py"], {}, "the training command's program is empty"),
    (SlurmJob, ["python", "t.py", "trainer.num_nodes=1"], {"nodes": 2},
     "sets trainer.num_nodes=1, the job --nodes 2: make them the same"),
    (SlurmJob, ["python", "t.py", "++trainer.devices=4"], {}, "sets trainer.devices=4, the job --gpus-per-node 8"),
    (KubernetesJob, ["python", "t.py", "trainer.devices=2"], K8S, "trainer.devices=2, the job --gpus-per-node 8"),
    (SlurmJob, ["python", "t.py"], {"image": "oauthuser:s3cret@nvcr.io#nvidia/nemo:24.09"}, "holds a password"),
    (KubernetesJob, ["python", "t.py"], {"image": "user:s3cret@nvcr.io/nvidia/nemo:24.09"}, "holds a password"),
    *((KubernetesJob, ["python", "t.py"], {"image": image}, "not an image reference a node can pull") for image in (
        "NVCR.io/NVIDIA/NeMo:24.09", "nvcr.io/nvidia/nemo:24.09:25.01", "nemo@sha256:abc", "nemo:", "a//b",
        "nvcr.io/nvidia/nemo@@x", "nvcr.io/nvidia/nemo:-bad")),
    (KubernetesJob, ["python", "t.py"], {**K8S, "repeat": 2, "prometheus_port": 23457},
     "--prometheus-port 23457 is a rendezvous port of the PyTorchJob's repeats (23456-23457)"),
    (SlurmJob, ["python", "t.py"], {"image": "nemo:1", "mounts": ["/A:/lustre", "/B:/lustre"],
                                    "results_dir": "/lustre/runs"}, "mounts two sources at /lustre"),
    (SlurmJob, ["python", "t.py"], {"image": "nemo:1", "mounts": ["/lustre:/lustre:ro"],
                                    "results_dir": "/lustre/runs"}, "is under a read-only mount"),
    (SlurmJob, ["python", "t.py"], {"time": "4294967296"}, "which Slurm keeps as another limit or none"),
    (SlurmJob, ["python", "t.py"], {"time": "24855-03:14"}, "is over 35,791,393 minutes"),
]


@pytest.mark.parametrize("job, command, settings, message", WRONG_JOBS)
def test_jobs_that_would_run_otherwise_than_asked_are_refused(job, command, settings, message):
    with pytest.raises(LaunchError, match=re.escape(message)):
        job(command=command, **settings)


@pytest.mark.parametrize("job, command, settings", [
    (SlurmJob, ["python", "t.py", "trainer.num_nodes=2", "trainer.devices=8", "+x=srun"], {"nodes": 2}),
    (SlurmJob, ["python", "t.py", "trainer.devices=-1", "trainer.devices=auto"], {}),
    (SlurmJob, ["bash", "-c", "torchrun t.py"], {}),  # a script's insides are not looked into
    (SlurmJob, ["python", "t.py"], {**PYXIS, "image": "alice@nvcr.io#nvidia/nemo:24.09", "time": "24855-03:13:00"}),
    (KubernetesJob, ["python3", "-m", "nemo_throughput.demo.train", "trainer.num_nodes=1"], K8S),
    (KubernetesJob, ["python", "t.py"], {"image": "localhost:5000/team/nemo_x__y:v1.2-rc_3@sha256:" + "0" * 64}),
    (KubernetesJob, ["python", "t.py"], {**K8S, "repeat": 2, "prometheus_port": 23458}),
])
def test_jobs_near_those_refused_are_accepted(job, command, settings):
    job(command=command, **settings)


@pytest.mark.parametrize("mount, problem", [
    (f"/lustre:/lustre\ntouch {MARKER}", "control character"),
    ("/my data:/data", "whitespace"),  # Pyxis hands mounts to enroot as fstab lines
    ("/a,/b:/b", "src:dst"),  # a comma starts the next mount
    ("data:/data", "source must be"),  # Pyxis: an absolute or relative path, tmpfs or umount
    ("/data:data", "destination must be"),
    ("/data:/data:ro;x", "flags"),
])
def test_slurm_mounts_pyxis_cannot_take_are_refused(mount, problem):
    with pytest.raises(LaunchError, match=re.escape("--mounts") + ".*" + re.escape(problem)):
        SlurmJob(command=["python", "t.py"], image="nemo:1", mounts=[mount, "/lustre:/lustre"],
                 results_dir="/lustre/runs")


def test_slurm_results_dir_must_not_escape_its_mount_through_dotdot():
    with pytest.raises(LaunchError, match="not under any --mounts destination"):
        SlurmJob(command=["python", "t.py"], image="nemo:1", mounts=["/lustre:/lustre"],
                 results_dir="/lustre/../etc/runs")


@pytest.mark.parametrize("time", ["10\n", "1:00:00\n", "10 ", "-1"])
def test_slurm_time_with_trailing_junk_is_refused(time):
    with pytest.raises(LaunchError, match="--time"):
        SlurmJob(command=["python", "t.py"], time=time)


@pytest.mark.parametrize("time", ["90", "120:00", "1:00:00", "2-12", "2-12:30", "2-12:30:00", "UNLIMITED", "infinite"])
def test_slurm_times_in_every_form_sbatch_takes_are_accepted(time):
    assert f"--time={time}" in SlurmJob(command=["python", "t.py"], time=time).sbatch_options()


def test_slurm_job_name_longer_than_slurm_takes_is_refused():
    assert SlurmJob(command=["python", "t.py"], job_name="j" * 1024).job_name == "j" * 1024
    with pytest.raises(LaunchError, match="--job-name has 1025 characters; Slurm takes at most 1024"):
        SlurmJob(command=["python", "t.py"], job_name="j" * 1025)


def test_slurm_command_with_control_characters_other_than_tab_and_newline_is_refused():
    with pytest.raises(LaunchError, match="training command.*control character"):
        SlurmJob(command=["python", "t.py", "a\rb"])


def _sbatch_options(script: str) -> list[str]:
    """The #SBATCH lines as sbatch reads them: up to the first line that is not a comment."""
    options = []
    for line in script.splitlines()[1:]:
        if not line.lstrip().startswith("#") and line.strip():
            break
        if line.startswith("#SBATCH "):
            options.append(line[len("#SBATCH "):])
    return options


def test_slurm_hostile_but_valid_values_stay_data(tmp_path):
    """Values Slurm and bash can carry verbatim (paths with spaces, '#', quotes, '$(...)'; any training
    argument) are quoted: the header, run by bash, gives each back exactly and runs nothing."""
    marker = tmp_path / "injected"
    hostile = [f"$(touch {marker})", f"`touch {marker}`", f"x; touch {marker}", f"a\ntouch {marker}",
               "it's", 'say "hi"', "tab\there", "100%", "#not-a-comment", "\\", "$HOME", "*"]
    results = f"/lustre/runs #1 $(touch {marker}) 'q' \"d\" 100%"
    job = SlurmJob(command=["python", "t.py", *hostile], image="nvcr.io/nvidia/nemo:24.09",
                   mounts=["/lustre:/lustre"], workdir=f"/lustre/w `touch {marker}`", label=f"l'$(touch {marker})",
                   results_dir=results, partition="batch,debug", account="proj_1.a", job_name="llama-70b_4n.v2")
    script = render_sbatch(job, now=FIXED_TIME)
    header = script[:script.index("# ---- job body ----")]
    probe = tmp_path / "probe.sh"
    probe.write_text(header + 'printf "%s\\0" "$IMAGE" "$MOUNTS" "$WORKDIR" "$LABEL" "$RESULTS" "$@"\n')
    result = subprocess.run(["bash", str(probe)], capture_output=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    values = result.stdout.decode().split("\0")[:-1]
    assert values == ["nvcr.io/nvidia/nemo:24.09", "/lustre:/lustre", job.workdir, job.label, results,
                      "python", "t.py", *hostile]
    assert not marker.exists()
    options = _sbatch_options(script)
    assert {"--job-name=llama-70b_4n.v2", "--partition=batch,debug", "--account=proj_1.a"} <= set(options)
    assert len(options) == 10 and options[6].startswith('--output="/lustre/runs #1 $(touch ')


@pytest.mark.parametrize("args, message", [
    (["slurm", "--partition", f"batch\ntouch {MARKER}", "--", "python", "t.py"], "--partition"),
    (["slurm", "--job-name", "a b", "--", "python", "t.py"], "--job-name 'a b'"),
    (["slurm", "--account", "$(id)", "--", "python", "t.py"], "--account '$(id)'"),
    (["slurm", "--results-dir", f"runs\ntouch {MARKER}", "--", "python", "t.py"], "control character"),
    (["slurm", "--partitoin", "batch", "--", "python", "t.py"],
     "unrecognized arguments before `--`: --partitoin batch"),
    (["slurm", "--partitoin=batch", "python", "t.py"], "unrecognized option '--partitoin=batch'"),
    (["k8s", "--image", "nemo:1", "--namespace", "Team_A", "--", "python", "t.py"], "--namespace 'Team_A'"),
    (["k8s", "--image", "nemo:1", "--job-name", "demo\n", "--", "python", "t.py"], "--job-name 'demo\\n'"),
    # issue 18: without `--`, argparse took the command's `--nodes 4` as the launcher's own
    (["slurm", "python", "t.py", "--nodes", "4"], "put the training command after `--` (`-- python t.py ...`)"),
    (["k8s", "python", "t.py", "--image", "nemo:1"], "put the training command after `--`"),
    # issue 18: a command that starts with an option would become srun's or torchrun's own
    (["slurm", "--", "--nodes=3", "python", "t.py"], "the training command starts with '--nodes=3', an option"),
    (["k8s", "--image", "nemo:1", "--", "-m", "train"], "the training command starts with '-m', an option"),
    (["k8s", "--image", "nemo:1", "--", "python", "-u", "t.py"], "python's own option '-u' cannot be passed"),
    (["k8s", "--image", "nemo:1", "--", "python", "--nnodes=9", "t.py"], "python's own option '--nnodes=9'"),
    (["k8s", "--image", "nemo:1", "--", "python", "-m"], "`python -m` needs the module next"),
    (["k8s", "--image", "nemo:1", "--", "python", "t.py", "--", "a"], "torchrun drops a `--` right after the script"),
    (["k8s", "--image", "nemo:1", "--", "python", "-m", "train", "--"], "torchrun drops a `--`"),
    (["k8s", "--image", "nemo:1", "--", "python", "-m", "--nnodes=9", "train"], "`python -m` needs the module"),
    # issue 18: counts beyond what sbatch (C int) and Kubernetes (int32 replicas) take
    (["slurm", "--nodes", "2147483648", "--", "python", "t.py"], "--nodes 2147483648 is more than Slurm and"),
    (["k8s", "--image", "nemo:1", "--nodes", "2147483648", "--", "python", "t.py"], "at most 2147483647"),
    (["slurm", "--gpus-per-node", str(10**20), "--", "python", "t.py"], "--gpus-per-node 1000"),
    (["k8s", "--image", "nemo:1", "--repeat", "2147483648", "--", "python", "t.py"], "--repeat 2147483648"),
    # issue 18: a file name longer than the file system takes (the default one comes from --job-name)
    (["slurm", "--job-name", "j" * 300, "--", "python", "t.py"], f"--output {'j' * 300}.sbatch: File name too long"),
    (["slurm", "--results-dir", "r" * 300, "--", "python", "t.py"], f"{'r' * 300}: File name too long"),
    (["k8s", "--image", "nemo:1", "--output", "k" * 300, "--", "python", "t.py"], "File name too long"),
])
def test_hostile_launch_requests_write_nothing(args, message, tmp_path):
    result = cli(*args, cwd=tmp_path)
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------- outputs (issue 18)
SUMMARY_TEXT = '{"schema": "nemo-throughput/summary/v1", "status": "completed"}\n'
OUTPUT_PATHS = [
    (["--output", "missing/job.out"], "--output missing/job.out: directory missing does not exist; create it first"),
    (["--output", "a-dir"], "--output a-dir is a directory; give a file name"),
    (["--output", "a-file/job.out"], "--output a-file/job.out: {tmp}/a-file is a file, not a directory"),
    (["--output", "summary.json"], "--output summary.json is a run's summary; write elsewhere"),
]
RESULTS_DIRS = [
    (["--results-dir", "a-file"], "--results-dir {tmp}/a-file is a file, not a directory"),
    (["--results-dir", "a-file/runs"], "--results-dir {tmp}/a-file/runs: {tmp}/a-file is a file, not a directory"),
]


@pytest.mark.invalid_summaries  # a stand-in summary the launcher must not overwrite, not a run
@pytest.mark.parametrize("target, option, message", [
    *(("slurm", option, message) for option, message in OUTPUT_PATHS + RESULTS_DIRS),
    *(("k8s", option, message) for option, message in OUTPUT_PATHS),
])
def test_output_paths_are_checked_before_anything_is_written(target, option, message, tmp_path):
    (tmp_path / "a-dir").mkdir()
    (tmp_path / "a-file").write_text("not a directory\n")
    (tmp_path / "summary.json").write_text(SUMMARY_TEXT)
    before = sorted(tmp_path.rglob("*"))
    extra = ["--image", "nemo:1"] if target == "k8s" else []
    result = cli(target, *extra, *option, "--", "python", "t.py", cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr == f"nemo-throughput launch {target}: {message.format(tmp=tmp_path)}\n"
    assert sorted(tmp_path.rglob("*")) == before and (tmp_path / "summary.json").read_text() == SUMMARY_TEXT


@pytest.mark.parametrize("target, template", [("slurm", "slurm/benchmark.sbatch"),
                                              ("k8s", "kubernetes/pytorchjob.yaml")])
def test_output_over_the_template_it_reads_is_refused(target, template, tmp_path):
    from nemo_throughput.launch import TEMPLATES

    before = (TEMPLATES / template).read_text()
    extra = ["--image", "nemo:1"] if target == "k8s" else []
    result = cli(target, *extra, "--output", TEMPLATES / template, "--", "python", "t.py", cwd=tmp_path)
    assert result.returncode == 2 and "is one of the files this command reads; write elsewhere" in result.stderr
    assert (TEMPLATES / template).read_text() == before


def test_an_output_that_cannot_be_written_is_one_line(tiny_filesystem):
    """What no check beforehand sees (a full disk) still ends in one line, not a traceback, and
    leaves no part of the file behind."""
    fill_up(tiny_filesystem)
    result = cli("k8s", "--image", "nemo:1", "--output", tiny_filesystem / "job.yaml", "--", "python", "t.py",
                 cwd=tiny_filesystem)
    assert result.returncode == 2
    assert result.stderr == (f"nemo-throughput launch k8s: --output {tiny_filesystem}/job.yaml cannot be written: "
                             "No space left on device\n")
    assert os.listdir(tiny_filesystem) == ["filler"]


@pytest.mark.parametrize("target", ["slurm", "k8s"])
def test_an_output_that_is_a_fifo_or_a_device_is_refused_at_once(target, tmp_path):
    """A FIFO no program reads from blocked the launcher for good (its check opened it to read)."""
    os.mkfifo(tmp_path / "job.out")
    extra = ["--image", "nemo:1"] if target == "k8s" else []
    for output in (tmp_path / "job.out", "/dev/null"):
        result = nemo_throughput_cli("launch", target, *extra, "--output", output, "--", "python", "t.py",
                                     cwd=tmp_path, timeout=60)
        assert result.returncode == 2
        assert result.stderr == (f"nemo-throughput launch {target}: --output {output} is not a regular file (a FIFO, "
                                 "socket or device); give a file name\n")


def test_an_output_that_is_a_link_is_replaced_and_what_it_points_to_left_alone(tmp_path):
    """Before, the script was written through the link into its target, whose mode became 0755."""
    private = tmp_path / "private.txt"
    private.write_text("mine\n")
    private.chmod(0o600)
    (tmp_path / "job.sbatch").symlink_to(private)
    result = cli("slurm", "--output", "job.sbatch", "--", "python", "t.py", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert private.read_text() == "mine\n" and private.stat().st_mode & 0o777 == 0o600
    written = tmp_path / "job.sbatch"
    assert not written.is_symlink() and written.read_text().startswith("#!/bin/bash")
    assert written.stat().st_mode & 0o777 == 0o755


def test_results_dir_under_home_is_the_home_s_and_an_empty_one_is_refused(tmp_path):
    """`--results-dir=~/runs` reaches the launcher unexpanded (bash expands no `~` after `=`): it made a
    directory named `~` where the launcher ran; `--results-dir ''` spilled the jobs into it."""
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "HOME": str(home)}
    result = nemo_throughput_cli("launch", "slurm", "--results-dir=~/runs", "--", "python", "t.py", cwd=tmp_path,
                                 env=env)
    assert result.returncode == 0, result.stderr
    assert f"RESULTS={home}/runs\n" in (tmp_path / "nemo-throughput.sbatch").read_text()
    assert (home / "runs").is_dir() and not (tmp_path / "~").exists()
    result = nemo_throughput_cli("launch", "slurm", "--results-dir", "", "--output", "empty.sbatch", "--", "python",
                                 "t.py", cwd=tmp_path, env=env)
    assert (result.returncode, result.stderr) == (2, "nemo-throughput launch slurm: --results-dir is empty: give the "
                                                     "directory for the summaries\n")


def test_results_dir_on_the_hosts_is_created_with_the_script(tmp_path):
    result = cli("slurm", "--results-dir", "runs/2026", "--", "python", "t.py", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "runs" / "2026").is_dir() and (tmp_path / "nemo-throughput.sbatch").is_file()


@pytest.mark.parametrize("mounts, results_dir, log_dir", [
    (["/lustre:/lustre"], "/lustre/runs", "/lustre/runs"),
    (["/scratch/me/runs:/results"], "/results", "/scratch/me/runs"),
    (["/data:/data:ro", "/scratch/me/runs:/results:rw"], "/results/llama/../gpt", "/scratch/me/runs/gpt"),
    (["/lustre:/lustre", "/lustre/team-a/runs:/lustre/runs"], "/lustre/runs/x", "/lustre/team-a/runs/x"),
    (["./runs:/results"], "/results/x", "runs/x"),  # relative to where the job starts, as for sbatch
])
def test_slurm_log_goes_to_the_results_dir_as_the_hosts_see_it(mounts, results_dir, log_dir):
    """Slurm writes the job's log outside the container: a container path there would fail the job."""
    job = SlurmJob(command=["python", "t.py"], image="nemo:1", mounts=mounts, results_dir=results_dir)
    assert f"--output={log_dir}/slurm-%j.out" in job.sbatch_options()
    assert job.settings()["RESULTS"] == results_dir  # the summaries are written in the container


def test_slurm_results_dir_on_a_tmpfs_mount_is_refused():
    with pytest.raises(LaunchError, match="--results-dir /results is under a tmpfs mount"):
        SlurmJob(command=["python", "t.py"], image="nemo:1", mounts=["tmpfs:/results"], results_dir="/results")


def test_slurm_with_a_container_creates_and_checks_the_hosts_side_of_results_dir(tmp_path):
    (tmp_path / "a-file").write_text("not a directory\n")
    result = cli("slurm", "--image", "nemo:1", "--mounts", f"{tmp_path}/host-runs:/results", "--results-dir",
                 "/results/llama", "--", "python", "t.py", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "host-runs" / "llama").is_dir()
    script = (tmp_path / "nemo-throughput.sbatch").read_text()
    assert f"#SBATCH --output={tmp_path}/host-runs/llama/slurm-%j.out\n" in script
    result = cli("slurm", "--image", "nemo:1", "--mounts", f"{tmp_path}/a-file:/results", "--results-dir", "/results",
                 "--output", "other.sbatch", "--", "python", "t.py", cwd=tmp_path)
    assert result.stderr == (f"nemo-throughput launch slurm: --results-dir {tmp_path}/a-file is a file, "
                             "not a directory\n")
    assert not (tmp_path / "other.sbatch").exists()


# ----------------------------------------------------------------------------- the job body at scale (issue 18)
SRUN_STAND_IN = """#!/bin/bash
printf '%s\\0' "$MASTER_ADDR" "$NEMO_THROUGHPUT_REPEAT" "$@" >> "$SRUN_RECORD"
printf '\\n' >> "$SRUN_RECORD"
"""


def run_job_body(script: str, tmp_path: Path, nodelist: str, nodes: int, tasks_per_node: int = 8):
    """`script` run by bash as Slurm runs a batch script on the first node of a `nodes`-node allocation:
    the SLURM_* variables of the batch step, the real scontrol (slurm-wlm) expanding the host list, and,
    in place of srun (which needs a real allocation), a stand-in that records how it was called."""
    if shutil.which("scontrol") is None:
        pytest.skip("scontrol is not installed: run .ci/setup-slurm")
    conf = tmp_path / "slurm.conf"  # scontrol reads a configuration even to expand a host list
    conf.write_text("ClusterName=big\nSlurmctldHost=localhost\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "srun").write_text(SRUN_STAND_IN)
    (bin_dir / "srun").chmod(0o755)
    record = tmp_path / "srun-calls"
    record.unlink(missing_ok=True)
    path = tmp_path / "job.sbatch"
    path.write_text(script)
    first = subprocess.run(["scontrol", "show", "hostnames", nodelist], env={**os.environ, "SLURM_CONF": str(conf)},
                           capture_output=True, text=True, check=True).stdout.split("\n", 1)[0]
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_CONF": str(conf),
           "SRUN_RECORD": str(record), "SLURM_JOB_ID": "4242", "SLURM_JOBID": "4242",
           "SLURM_JOB_NAME": "nemo-throughput", "SLURM_JOB_NODELIST": nodelist, "SLURM_NODELIST": nodelist,
           "SLURM_JOB_NUM_NODES": str(nodes), "SLURM_NNODES": str(nodes), "SLURM_NODEID": "0",
           "SLURMD_NODENAME": first, "SLURM_NTASKS_PER_NODE": str(tasks_per_node),
           "SLURM_NTASKS": str(nodes * tasks_per_node), "SLURM_NPROCS": str(nodes * tasks_per_node),
           "SLURM_TASKS_PER_NODE": f"{tasks_per_node}(x{nodes})", "SLURM_GPUS_PER_NODE": str(tasks_per_node),
           "SLURM_JOB_PARTITION": "batch", "SLURM_SUBMIT_DIR": str(tmp_path), "SLURM_CLUSTER_NAME": "big"}
    result = subprocess.run(["bash", str(path)], env=env, cwd=tmp_path, capture_output=True, text=True)
    calls = [line.split("\0")[:-1] for line in record.read_text().splitlines()] if record.exists() else []
    return result, calls, first


@pytest.mark.parametrize("nodelist, nodes, runs", [
    # 512 nodes: 6.5 kB of host names, two of scontrol's 4 kB writes; `| head -n 1` lost the race in
    # 2 to 17 runs of 40 here, depending on load, so this case is run 20 times
    ("gpu-node[0001-0512]", 512, 20),
    # more than a pipe holds (134 kB): `| head -n 1` killed every such job before srun (40 of 40)
    ("node-of-a-site-with-long-names-[00001-04096]", 4096, 1),
])
def test_slurm_job_body_reaches_srun_with_a_large_allocation(nodelist, nodes, runs, tmp_path):
    command = ["python", "t.py", f"trainer.num_nodes={nodes}"]
    job = SlurmJob(command=command, nodes=nodes, repeat=2, results_dir=str(tmp_path / "runs"))
    for _ in range(runs):
        result, calls, first = run_job_body(render_sbatch(job, now=FIXED_TIME), tmp_path, nodelist, nodes)
        assert result.returncode == 0, result.stderr
        assert calls == [[first, "1", "--kill-on-bad-exit=1", *command], [first, "2", "--kill-on-bad-exit=1", *command]]


def test_slurm_template_by_hand_refuses_a_command_that_starts_with_an_option(tmp_path):
    """`sbatch benchmark.sbatch --nodes=3 python t.py`: srun would take --nodes=3 as its own."""
    from nemo_throughput.launch.slurm import TEMPLATE

    result, calls, _ = run_job_body(TEMPLATE.read_text(), tmp_path, "node[01-02]", 2)
    assert result.returncode == 2 and "usage: sbatch" in result.stderr  # no command at all
    script = TEMPLATE.read_text().replace("set -euo pipefail", 'set -- --nodes=3 python t.py\nset -euo pipefail', 1)
    result, calls, _ = run_job_body(script, tmp_path, "node[01-02]", 2)
    assert result.returncode == 2 and calls == []
    assert "the training command starts with the option '--nodes=3'" in result.stderr


# ----------------------------------------------------------------------------- Kubernetes names and $(VAR)
def kubelet_expand(text: str, env: dict[str, str]) -> str:
    """What the kubelet does to a container's command, args and env values (Kubernetes API reference,
    Container.args): `$(NAME)` becomes NAME's value when NAME is defined, else stays as written;
    `$$` becomes `$`, so `$$(NAME)` gives the literal `$(NAME)`."""
    out, i = [], 0
    while i < len(text):
        if text.startswith("$$", i):
            out.append("$")
            i += 2
        elif text.startswith("$(", i) and text.find(")", i) != -1:
            end = text.find(")", i)
            out.append(env.get(text[i + 2:end], text[i:end + 1]))
            i = end + 1
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


POD_ENV = {"POD_NAME": "demo-master-0", "NODE_NAME": "k8s-node-1", "JOB_NAME": "demo", "RESULTS": "/results",
           "PET_NNODES": "1", "PET_NPROC_PER_NODE": "1", "PET_NODE_RANK": "0", "PET_MASTER_ADDR": "127.0.0.1",
           "PET_MASTER_PORT": "23456", "MASTER_ADDR": "127.0.0.1", "REPEAT": "1", "HOME": "/root"}
DOLLAR_ARGS = ["$(POD_NAME)", "$$(NODE_NAME)", "$$", "cost=$5", "$(touch /tmp/x)", "`id`", "a;b", "it's",
               "$(", "$HOME", "${local_rank}", "$local_rank"]


def _args_after_kubelet(manifest, replica="Master"):
    container = _container(manifest, replica)
    env = {**POD_ENV, **{item["name"]: kubelet_expand(item["value"], POD_ENV)
                         for item in container["env"] if "value" in item}}
    return [kubelet_expand(arg, env) for arg in container["args"]], env


def _args_the_script_gets(manifest, replica="Master", local_rank="0"):
    """Through the kubelet, then through torchrun's agent, which substitutes its ${local_rank} macro
    into every argument of the worker (torch.distributed.elastic: macros.substitute)."""
    from torch.distributed.elastic.utils.api import macros

    args, env = _args_after_kubelet(manifest, replica)
    return macros.substitute(args[2:], local_rank), env  # after the script and its $0


def test_kubernetes_args_and_label_reach_the_training_script_verbatim():
    job = KubernetesJob(command=["python", "t.py", *DOLLAR_ARGS], image="nemo:1", nodes=2, job_name="demo",
                        label="run-$(NODE_NAME)")
    manifest = render_manifest(job)
    validate_manifest(manifest)
    for replica in ("Master", "Worker"):
        args, env = _args_the_script_gets(manifest, replica)
        assert args == ["t.py", *DOLLAR_ARGS]
        assert env["NEMO_THROUGHPUT_RUN_LABEL"] == "run-$(NODE_NAME)"


@pytest.mark.parametrize("command", [["python", "t.py", "a", "--", "b", "--nnodes=9"],
                                     ["python", "-m", "train", "-u", "--", "x"], ["python", "t.py", "-m", "x", "--"]])
def test_kubernetes_args_reach_the_script_through_torchruns_own_parser(command):
    """torchrun's real argument parser, given what the pod script passes it: the script or module and its
    arguments come back exactly (options and `--` after the first argument are the script's)."""
    from torch.distributed.run import get_args_parser

    job = KubernetesJob(command=["--", *command], image="nemo:1", job_name="demo")  # as the CLI passes it
    args, _ = _args_the_script_gets(render_manifest(job))
    parsed = get_args_parser().parse_args(["--nnodes=1", "--nproc-per-node=1", *args])
    module = ["-m"] if parsed.module else []
    assert ["python", *module, parsed.training_script, *parsed.training_script_args] == command


def test_kubernetes_expand_env_leaves_references_to_the_kubelet_and_torchrun():
    job = KubernetesJob(command=["python", "t.py", "--node=$(NODE_NAME)", "--rank=${local_rank}"], image="nemo:1",
                        job_name="demo", label="run-$(POD_NAME)", expand_env=True)
    args, env = _args_the_script_gets(render_manifest(job), local_rank="3")
    assert args == ["t.py", "--node=k8s-node-1", "--rank=3"]
    assert env["NEMO_THROUGHPUT_RUN_LABEL"] == "run-demo-master-0"


def test_the_pod_script_is_untouched_by_the_kubelet():
    """The template's own bash uses $(...) and $((...)): none of it may name a variable the kubelet knows."""
    script, _ = pod_script(render_manifest(K8S_JOBS["k8s-runai-rdma.yaml"]))
    names = set(POD_ENV) | {"KUBERNETES_SERVICE_HOST", "WORLD_SIZE", "RANK", "MASTER_PORT", "PYTHONUNBUFFERED"}
    assert kubelet_expand(script, {name: "X" for name in names}) == script


KUBERNETES_NAMES = [
    (dict(namespace="Team_A"), "--namespace 'Team_A'"),
    (dict(namespace="a" * 64), "--namespace"),
    (dict(namespace="team-a\n"), "--namespace"),
    (dict(job_name="demo\n"), "--job-name"),
    (dict(queue="team a"), "--queue 'team a'"),
    (dict(queue="$(POD_NAME)"), "--queue"),
    (dict(queue="q" * 64), "--queue"),
    (dict(queue="-team"), "--queue"),
    (dict(queue="team-a", queue_label="runai/queue/x"), "--queue-label"),
    (dict(queue="team-a", queue_label="Bad_Domain/queue"), "--queue-label"),
    (dict(queue="team-a", queue_label="queue label"), "--queue-label"),
    (dict(queue="team-a", queue_label="kai.scheduler/" + "q" * 64), "--queue-label"),
    (dict(rdma_resource="ib", rdma_count=8), "--rdma-resource 'ib'"),
    (dict(rdma_resource="rdma ib", rdma_count=8), "--rdma-resource"),
    (dict(rdma_resource="nvidia.com/gpu", rdma_count=8), "--rdma-resource 'nvidia.com/gpu'"),
    (dict(rdma_resource="kubernetes.io/ib", rdma_count=8), "--rdma-resource"),
    (dict(scheduler_name="Runai Scheduler"), "--scheduler-name"),
    (dict(scheduler_name="runai\nscheduler"), "--scheduler-name"),
    (dict(summary_volume="Runs_1"), "--summary-volume"),
    (dict(image="nemo:1\nx"), "--image"),
    (dict(image="nemo 1"), "--image"),
    (dict(image="$(IMAGE)"), "--image"),
    (dict(label="a\nb"), "--label"),
    (dict(command=["python", "t.py", "a\x1bb"]), "training command"),
]


@pytest.mark.parametrize("fields, message", KUBERNETES_NAMES, ids=[m for _, m in KUBERNETES_NAMES])
def test_kubernetes_names_outside_their_syntax_are_refused(fields, message):
    with pytest.raises(LaunchError, match=re.escape(message)):
        KubernetesJob(**{"command": ["python", "t.py"], "image": "nemo:1", "job_name": "demo", **fields})


def test_kubernetes_valid_names_at_their_limits_are_accepted():
    job = KubernetesJob(command=["python", "t.py"], image="registry.example.com:5000/team/nemo@sha256:" + "a" * 64,
                        namespace="a" * 63, queue="Q" * 62 + "1", queue_label="kai.scheduler/queue",
                        rdma_resource="nvidia.com/hostdev", rdma_count=1, scheduler_name="kai-scheduler",
                        summary_volume="runs.v1", job_name="demo")
    validate_manifest(render_manifest(job))


@pytest.mark.slow
def test_pod_script_passes_hostile_args_through_torchrun_verbatim(tmp_path):
    """The pod's `bash -c <script> nemo-throughput <args>` with the args as the kubelet hands them over:
    torchrun starts the script with exactly the user's arguments and nothing runs from them."""
    marker = tmp_path / "injected"
    show = tmp_path / "show_args.py"
    show.write_text("import json, os, sys\n"
                    "out = os.environ['NEMO_THROUGHPUT_OUTPUT_DIR']\n"
                    "os.makedirs(out)\n"
                    "open(os.path.join(out, 'args.json'), 'w').write(json.dumps(sys.argv[1:]))\n")
    hostile = [f"$(touch {marker})", f"`touch {marker}`", f"x; touch {marker}", f"a\ntouch {marker}", "it's",
               "$(POD_NAME)", "$$", "$HOME", "${local_rank}"]
    job = KubernetesJob(command=["python", str(show), *hostile], image="nemo:1", gpus_per_node=1, job_name="demo")
    manifest = render_manifest(job)
    args, env = _args_after_kubelet(manifest)
    env.update(RESULTS=str(tmp_path), PET_MASTER_PORT=str(free_port()),
               PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    pod = subprocess.run(["bash", "-c", *args], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert pod.returncode == 0, pod.stdout + pod.stderr
    assert read_json(tmp_path / "demo" / "repeat-1" / "args.json") == hostile
    assert not marker.exists()
