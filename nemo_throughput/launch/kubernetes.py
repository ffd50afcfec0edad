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

from nemo_throughput.launch import (
    TEMPLATES,
    LaunchError,
    refuse_a_password,
    require_command,
    require_count,
    require_layout,
    require_no_control_characters,
    require_port,
)

TEMPLATE = TEMPLATES / "kubernetes" / "pytorchjob.yaml"
RESULTS_MOUNT = "/results"
KUBERNETES_VERSION = "1.31"  # schema version the pod templates are validated against
GPU_RESOURCE = "nvidia.com/gpu"
RENDEZVOUS_PORT = 23456  # the PyTorchJob's; repeat k uses RENDEZVOUS_PORT + k - 1 (the template's script)
# Kubernetes' name rules (apimachinery validation): the API server refuses anything else.
_DNS_1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")  # Service names: the operator makes one per pod
_DNS_1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS_1123_SUBDOMAIN = re.compile(rf"{_DNS_1123_LABEL}(\.{_DNS_1123_LABEL})*")
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")  # also a label key's name part
# An image reference as the kubelet parses it (the distribution/reference grammar):
# [domain[:port]/]path[:tag][@digest], path components in lower case.
_DOMAIN = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*(?::[0-9]+)?"
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMAGE = re.compile(rf"(?:{_DOMAIN}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*(?::[\w][\w.-]{{0,127}})?"
                    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?")


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
    expand_env: bool = False  # let the kubelet expand $(VAR) (and torchrun ${local_rank}) in the command
    prometheus_port: int | None = None  # rank 0 serves live metrics on this port of the Master pod

    def __post_init__(self) -> None:
        command = require_command(self.command)
        if command[0] not in ("python", "python3") or len(command) < 2:
            raise LaunchError("in each pod torchrun starts the training processes, with the python it is installed "
                              "in, so the command must be `python <script or -m module> ...` (for another "
                              "environment, put its bin first on the image's PATH); got "
                              f"`{' '.join(command)}`")
        _check_torchrun_target(command[1:])
        self.command = command
        if not self.image:
            raise LaunchError("--image is required: every pod runs the training in this container image")
        require_count("--nodes", self.nodes)
        require_count("--gpus-per-node", self.gpus_per_node)
        require_count("--repeat", self.repeat)
        require_layout(self.command, self.nodes, self.gpus_per_node)
        require_port("--prometheus-port", self.prometheus_port)
        rendezvous = range(RENDEZVOUS_PORT, RENDEZVOUS_PORT + self.repeat)
        if self.prometheus_port in rendezvous:
            raise LaunchError(f"--prometheus-port {self.prometheus_port} is a rendezvous port of the PyTorchJob's "
                              f"repeats ({rendezvous.start}-{rendezvous.stop - 1}): choose another, e.g. 9464")
        if (self.rdma_resource is None) != (self.rdma_count is None):
            raise LaunchError("--rdma-resource and --rdma-count go together (e.g. --rdma-resource rdma/ib "
                              "--rdma-count 8)")
        if self.rdma_count is not None:
            require_count("--rdma-count", self.rdma_count)
        for flag, value in (("--job-name", self.job_name), ("--namespace", self.namespace), ("--image", self.image),
                            ("--label", self.label), ("--queue", self.queue), ("--queue-label", self.queue_label),
                            ("--rdma-resource", self.rdma_resource), ("--scheduler-name", self.scheduler_name),
                            ("--summary-volume", self.summary_volume)):
            if value is not None:
                require_no_control_characters(flag, value)
        self._check_names()

    def _check_names(self) -> None:
        # Pods are named <job>-worker-<index>, which must stay a 63-character DNS label.
        if not _DNS_1035.fullmatch(self.job_name) or len(self.job_name) > 50:
            raise LaunchError(f"--job-name {self.job_name!r} must be lower-case letters, digits and '-', "
                              "start with a letter and have at most 50 characters")
        if not _dns_label(self.namespace):
            raise LaunchError(f"--namespace {self.namespace!r} is not a Kubernetes namespace: lower-case letters, "
                              "digits and '-', starting and ending with a letter or digit, at most 63 characters")
        refuse_a_password("--image", self.image)
        if len(self.image) > 255 or not _IMAGE.fullmatch(self.image):
            raise LaunchError(f"--image {self.image!r} is not an image reference a node can pull: "
                              "[registry[:port]/]path[:tag][@digest], the path in lower case, one tag, a digest such "
                              "as sha256:<64 hex digits>")
        if self.queue is not None:
            _check_label("--queue", self.queue)
            _check_label_key("--queue-label", self.queue_label)
        if self.rdma_resource is not None:
            _check_extended_resource("--rdma-resource", self.rdma_resource)
        for flag, value, what in (("--scheduler-name", self.scheduler_name, "scheduler name"),
                                  ("--summary-volume", self.summary_volume, "PersistentVolumeClaim name")):
            if value is not None and not _dns_subdomain(value):
                raise LaunchError(f"{flag} {value!r} is not a Kubernetes {what}: lower-case letters, digits, "
                                  "'-' and '.', starting and ending with a letter or digit, at most 253 characters")

    @property
    def script_args(self) -> list[str]:
        """What follows the pod script: $0, then the command as torchrun takes it.

        Two layers rewrite `$` on the way to the training script: the kubelet expands `$(VAR)` in a
        container's args and env values (`$$` gives `$`), and torchrun's agent runs every argument
        through string.Template for its `${local_rank}` macro (`$$` gives `$` again). Each `$` is
        doubled once per layer so that the script gets the arguments as written; with expand_env
        both expansions happen, as they would for the command typed into a pod spec by hand.
        """
        if self.expand_env:
            return ["nemo-throughput", *self.command[1:]]
        return ["nemo-throughput", *(_dollars_escaped(_dollars_escaped(arg)) for arg in self.command[1:])]

    @property
    def run_label_value(self) -> str:
        """The label as the NEMO_THROUGHPUT_RUN_LABEL env value, which the kubelet expands too."""
        label = self.label or ""
        return label if self.expand_env else _dollars_escaped(label)


def _check_torchrun_target(args: list[str]) -> None:
    """What follows `python` goes to torchrun, which reads an option there as its own: only
    `-m module` means the same to both; python's other options never reach the training processes."""
    if args[0] == "-m":
        if len(args) < 2 or args[1].startswith("-"):
            raise LaunchError("`python -m` needs the module next, e.g. `-- python -m my_package.train ...`")
    elif args[0].startswith("-"):
        raise LaunchError(f"python's own option {args[0]!r} cannot be passed: torchrun starts the training "
                          "processes (as `python -u <script>`) and would read it as its own; give the script or "
                          "`-m module` right after `python` (python's options have PYTHON* environment variables)")
    after_target = args[2:3] if args[0] == "-m" else args[1:2]
    if after_target == ["--"]:  # argparse ends torchrun's options there and drops it
        raise LaunchError("torchrun drops a `--` right after the script or module: the script would not get it; "
                          "pass the arguments without it or start them with another argument")


def _dollars_escaped(text: str) -> str:
    """Every `$` doubled: the kubelet and string.Template both read `$$` as one literal `$`."""
    return text.replace("$", "$$")


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
    if job.prometheus_port is not None:  # rank 0, the only one serving, is in the Master pod
        pod["metadata"]["annotations"] = {"prometheus.io/scrape": "true", "prometheus.io/path": "/metrics",
                                          "prometheus.io/port": str(job.prometheus_port)}
    return manifest


def _fill_pod(pod: dict[str, Any], job: KubernetesJob) -> None:
    if job.queue:
        pod["metadata"]["labels"][job.queue_label] = job.queue
    spec = pod["spec"]
    if job.scheduler_name:
        spec["schedulerName"] = job.scheduler_name
    (container,) = spec["containers"]
    container["image"] = job.image
    # args[0] is the template's script; what follows reaches torchrun as "$@", never as shell code
    container["args"] = [container["args"][0], *job.script_args]
    env = {item["name"]: item for item in container["env"]}
    env["NEMO_THROUGHPUT_IMAGE"]["value"] = job.image
    env["NEMO_THROUGHPUT_RUN_LABEL"]["value"] = job.run_label_value
    env["REPEAT"]["value"] = str(job.repeat)
    if job.prometheus_port is not None:
        container["ports"].append({"name": "metrics", "containerPort": job.prometheus_port})
        container["env"].append({"name": "NEMO_THROUGHPUT_PROMETHEUS_PORT", "value": str(job.prometheus_port)})
    limits = container["resources"]["limits"]
    limits[GPU_RESOURCE] = str(job.gpus_per_node)
    if job.rdma_resource:
        limits[job.rdma_resource] = str(job.rdma_count)
    if job.summary_volume:
        (results,) = [v for v in spec["volumes"] if v["name"] == "results"]
        results.pop("emptyDir")
        results["persistentVolumeClaim"] = {"claimName": job.summary_volume}


def _dns_label(name: str) -> bool:
    return len(name) <= 63 and re.fullmatch(_DNS_1123_LABEL, name) is not None


def _dns_subdomain(name: str) -> bool:
    return len(name) <= 253 and _DNS_1123_SUBDOMAIN.fullmatch(name) is not None


def _check_label(flag: str, value: str) -> None:
    if len(value) > 63 or not _LABEL_VALUE.fullmatch(value):
        raise LaunchError(f"{flag} {value!r} is not a Kubernetes label value: letters, digits, '-', '_' and '.', "
                          "starting and ending with a letter or digit, at most 63 characters")


def _check_label_key(flag: str, key: str) -> None:
    """A qualified name: an optional DNS subdomain prefix and '/', then a name like a label value."""
    prefix, _, name = key.rpartition("/")
    if (not name or len(name) > 63 or not _LABEL_VALUE.fullmatch(name)
            or (prefix and not _dns_subdomain(prefix)) or key.startswith("/")):
        raise LaunchError(f"{flag} {key!r} is not a Kubernetes label key: [prefix/]name, the prefix a DNS "
                          "subdomain (e.g. kai.scheduler), the name letters, digits, '-', '_' and '.' (at most 63)")


def _check_extended_resource(flag: str, resource: str) -> None:
    """A device plugin's resource: domain/name, outside kubernetes.io, and not the GPUs themselves."""
    prefix, _, name = resource.rpartition("/")
    if not prefix or not name or not _dns_subdomain(prefix) or len(name) > 63 or not _LABEL_VALUE.fullmatch(name):
        raise LaunchError(f"{flag} {resource!r} is not an extended resource name: domain/name, e.g. rdma/ib or "
                          "nvidia.com/hostdev")
    if prefix == "kubernetes.io" or prefix.endswith(".kubernetes.io"):
        raise LaunchError(f"{flag} {resource!r}: the kubernetes.io domain is reserved for Kubernetes' own resources")
    if resource == GPU_RESOURCE:
        raise LaunchError(f"{flag} {resource!r} would replace the GPU limit that --gpus-per-node sets: give the "
                          "RDMA device's own resource, e.g. rdma/ib")


class _ManifestDumper(yaml.SafeDumper):
    """Readable YAML that every reader takes as written: no anchors, multi-line strings (the pod
    script) as literal blocks, and every other string plain only where it cannot be read as
    anything else (:data:`_PLAIN`), else double-quoted. PyYAML reads YAML 1.1, kubectl's decoder
    something between 1.1 and 1.2: `3e-4`, `0o17`, `08` and `y` are strings to the first and a
    number or a boolean to the second."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


# Plain (unquoted) only: a word that starts with a letter or `/` and holds letters, digits and `._/:-`,
# none of YAML 1.1's booleans and nulls (yes, no, y, n, on, off, true, false, null, any case); the
# emitter still quotes what YAML's syntax needs quoted (a trailing `:`).
_PLAIN = re.compile(r"[A-Za-z/][A-Za-z0-9._/:-]*")
_YAML_WORDS = frozenset({"y", "n", "yes", "no", "on", "off", "true", "false", "null"})


def _represent_text(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    if "\n" in text:
        style = "|"
    elif _PLAIN.fullmatch(text) and text.lower() not in _YAML_WORDS:
        style = None
    else:
        style = '"'
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


_ManifestDumper.add_representer(str, _represent_text)


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
