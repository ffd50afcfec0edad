"""Kubernetes: a Kubeflow PyTorchJob from launchers/kubernetes/pytorchjob.yaml with the job filled in.

Every pod runs the template's script, which starts the training command under torchrun with the
rendezvous the training operator injects (PET_*); `python` is therefore dropped from the command.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from typing import Any

import yaml

from nemo_throughput.launch import TEMPLATES, LaunchError, require_command, require_positive

TEMPLATE = TEMPLATES / "kubernetes" / "pytorchjob.yaml"
RESULTS_MOUNT = "/results"
KUBERNETES_VERSION = "1.31"  # schema version the pod templates are validated against
_DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_PYTHON = re.compile(r"^(.*/)?python(3(\.\d+)?)?$")


@dataclass
class KubernetesJob:
    command: list[str]
    image: str | None = None
    nodes: int = 1
    gpus_per_node: int = 8
    namespace: str = "default"
    rdma_resource: str | None = None  # e.g. rdma/ib or nvidia.com/hostdev
    rdma_count: int | None = None
    scheduler_name: str | None = None  # e.g. runai-scheduler
    queue: str | None = None
    queue_label: str = "runai/queue"  # KAI-Scheduler: kai.scheduler/queue
    summary_volume: str | None = None  # PersistentVolumeClaim for the summaries
    repeat: int = 1
    label: str | None = None
    job_name: str = "nemo-throughput"

    def __post_init__(self) -> None:
        command = require_command(self.command)
        if not _PYTHON.match(command[0]) or len(command) < 2:
            raise LaunchError("in each pod torchrun starts the training processes, so the command must be "
                              f"`python <script or -m module> ...`; got `{' '.join(command)}`")
        self.command = command
        if not self.image:
            raise LaunchError("--image is required: every pod runs the training in this container image")
        require_positive("--nodes", self.nodes)
        require_positive("--gpus-per-node", self.gpus_per_node)
        require_positive("--repeat", self.repeat)
        if (self.rdma_resource is None) != (self.rdma_count is None):
            raise LaunchError("--rdma-resource and --rdma-count go together (e.g. --rdma-resource rdma/ib "
                              "--rdma-count 8)")
        if self.rdma_count is not None:
            require_positive("--rdma-count", self.rdma_count)
        # Pods are named <job>-worker-<index>, which must stay a 63-character DNS label.
        if not _DNS_1035.match(self.job_name) or len(self.job_name) > 50:
            raise LaunchError(f"--job-name {self.job_name!r} must be lower-case letters, digits and '-', "
                              "start with a letter and have at most 50 characters")

    @property
    def script_args(self) -> list[str]:
        """What follows the pod script: $0, then the command as torchrun takes it."""
        return ["nemo-throughput", *self.command[1:]]


def render_manifest(job: KubernetesJob) -> dict[str, Any]:
    manifest = yaml.safe_load(TEMPLATE.read_text())
    manifest["metadata"].update(name=job.job_name, namespace=job.namespace)
    spec = manifest["spec"]
    spec["nprocPerNode"] = str(job.gpus_per_node)
    replicas = spec["pytorchReplicaSpecs"]
    pod = copy.deepcopy(replicas["Master"]["template"])
    _fill_pod(pod, job)
    if job.queue:
        manifest["metadata"]["labels"][job.queue_label] = job.queue
    replicas["Master"]["template"] = pod
    if job.nodes > 1:
        replicas["Worker"].update(replicas=job.nodes - 1, template=copy.deepcopy(pod))
    else:
        del replicas["Worker"]
    return manifest


def _fill_pod(pod: dict[str, Any], job: KubernetesJob) -> None:
    if job.queue:
        pod["metadata"]["labels"][job.queue_label] = job.queue
    spec = pod["spec"]
    if job.scheduler_name:
        spec["schedulerName"] = job.scheduler_name
    (container,) = spec["containers"]
    container["image"] = job.image
    container["args"] = [container["args"][0], *job.script_args]
    env = {item["name"]: item for item in container["env"]}
    env["NEMO_THROUGHPUT_IMAGE"]["value"] = job.image
    env["NEMO_THROUGHPUT_RUN_LABEL"]["value"] = job.label or ""
    env["REPEAT"]["value"] = str(job.repeat)
    limits = container["resources"]["limits"]
    limits["nvidia.com/gpu"] = str(job.gpus_per_node)
    if job.rdma_resource:
        limits[job.rdma_resource] = str(job.rdma_count)
    if job.summary_volume:
        (results,) = [v for v in spec["volumes"] if v["name"] == "results"]
        results.pop("emptyDir")
        results["persistentVolumeClaim"] = {"claimName": job.summary_volume}


class _ManifestDumper(yaml.SafeDumper):
    """Readable YAML: no anchors, multi-line strings (the pod script) as literal blocks."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


_ManifestDumper.add_representer(str, lambda dumper, text: dumper.represent_scalar(
    "tag:yaml.org,2002:str", text, style="|" if "\n" in text else None))


def manifest_yaml(manifest: dict[str, Any]) -> str:
    return yaml.dump(manifest, Dumper=_ManifestDumper, sort_keys=False, width=120)


def pod_script(manifest: dict[str, Any], replica: str = "Master") -> tuple[str, list[str]]:
    """The pod's bash script and its arguments, as `bash -c <script> <args...>` runs them."""
    (container,) = manifest["spec"]["pytorchReplicaSpecs"][replica]["template"]["spec"]["containers"]
    return container["args"][0], container["args"][1:]


def validate_manifest(manifest: dict[str, Any], kubernetes_version: str = KUBERNETES_VERSION) -> None:
    """Check the manifest offline; raise LaunchError naming every problem found.

    The PyTorchJob is read into the kubeflow-training SDK's models and must come back unchanged
    (their deserializer drops unknown keys and coerces types silently); the operator's own rules
    are checked by hand; each pod template is validated by kubernetes-validate, strictly.
    Needs the `kubernetes` extra: pip install 'nemo-throughput[kubernetes]'.
    """
    import kubernetes_validate
    from kubeflow.training import ApiClient
    from kubernetes.utils import parse_quantity

    problems = []
    api = ApiClient()
    try:
        model = api._ApiClient__deserialize(copy.deepcopy(manifest), "KubeflowOrgV1PyTorchJob")
        problems += _differences(manifest, api.sanitize_for_serialization(model))
    except (ValueError, TypeError) as error:
        problems.append(f"not a PyTorchJob: {error}")
    if (manifest.get("apiVersion"), manifest.get("kind")) != ("kubeflow.org/v1", "PyTorchJob"):
        problems.append("apiVersion/kind must be kubeflow.org/v1 PyTorchJob")
    replicas = manifest.get("spec", {}).get("pytorchReplicaSpecs", {})
    if set(replicas) - {"Master", "Worker"} or replicas.get("Master", {}).get("replicas") != 1:
        problems.append("pytorchReplicaSpecs must be one Master (replicas: 1) and optional Workers")
    for name, replica in replicas.items():
        template = replica.get("template", {})
        containers = template.get("spec", {}).get("containers", [])
        if "pytorch" not in [c.get("name") for c in containers]:
            problems.append(f"{name}: the operator needs a container named `pytorch`")
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": f"{manifest['metadata'].get('name', 'job')}-{name.lower()}-0",
                            **copy.deepcopy(template.get("metadata", {}))},
               "spec": copy.deepcopy(template.get("spec", {}))}
        try:
            kubernetes_validate.validate(pod, kubernetes_version, strict=True)
        except kubernetes_validate.ValidationError as error:
            problems.append(f"{name} pod template: {'.'.join(map(str, error.path))}: {error.message}")
        for container in containers:
            for quantity in container.get("resources", {}).get("limits", {}).values():
                try:
                    parse_quantity(quantity)
                except ValueError:
                    problems.append(f"{name}: resource limit {quantity!r} is not a quantity")
    if problems:
        raise LaunchError("the PyTorchJob does not validate:\n  " + "\n  ".join(problems))


def _differences(given: Any, read_back: Any, path: str = "") -> list[str]:
    """What of `given` did not survive a round trip through the SDK's models."""
    if isinstance(given, dict) and isinstance(read_back, dict):
        return [problem for key, value in given.items() for problem in (
            [f"{path}.{key}: unknown field"] if key not in read_back
            else _differences(value, read_back[key], f"{path}.{key}"))]
    if isinstance(given, list) and isinstance(read_back, list) and len(given) == len(read_back):
        pairs = enumerate(zip(given, read_back, strict=True))
        return [problem for i, (a, b) in pairs for problem in _differences(a, b, f"{path}[{i}]")]
    if given != read_back or type(given) is not type(read_back):
        return [f"{path}: {given!r} is not of the expected type (read as {read_back!r})"]
    return []
