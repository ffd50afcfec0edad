"""Where and with what a run ran: orchestrator, job, nodes, container, communication settings,
library versions. Collected once at set-up (one small gather over ranks), never per step."""

from __future__ import annotations

import os
import platform
import socket
import sys
from collections.abc import Mapping
from importlib import metadata
from typing import Any

from nemo_throughput.redact import redact_command, redact_env, redact_url_credentials

ORCHESTRATORS = ("slurm", "kubernetes", "torchrun", "local")

# Set by the launchers (nemo-throughput launch / launchers/): they name what the job cannot see.
ENV_OUTPUT_DIR = "NEMO_THROUGHPUT_OUTPUT_DIR"  # where the summary goes (per job and repeat)
ENV_RUN_LABEL = "NEMO_THROUGHPUT_RUN_LABEL"  # run.label, e.g. bare-metal or kubernetes
ENV_IMAGE = "NEMO_THROUGHPUT_IMAGE"  # the container image the job runs in
ENV_REPEAT = "NEMO_THROUGHPUT_REPEAT"  # which of --repeat K identical runs this is

_PACKAGES = ("torch", "lightning", "pytorch-lightning", "nemo-toolkit", "megatron-core", "nemo-run",
             "transformer-engine", "hydra-core", "nemo-throughput")
_JOB_KEYS = {
    "slurm": ("SLURM_JOB_ID", "SLURM_JOB_NAME", "SLURM_JOB_NODELIST", "SLURM_JOB_NUM_NODES", "SLURM_NTASKS",
              "SLURM_NTASKS_PER_NODE", "SLURM_GPUS_PER_NODE", "SLURM_JOB_PARTITION", "SLURM_JOB_ACCOUNT",
              "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID"),
    "kubernetes": ("JOB_NAME", "POD_NAMESPACE", "PET_NNODES", "PET_NPROC_PER_NODE", "WORLD_SIZE"),
    "torchrun": ("TORCHELASTIC_RUN_ID", "GROUP_WORLD_SIZE", "LOCAL_WORLD_SIZE"),
    "local": (),
}
_COMMUNICATION_PREFIXES = ("NCCL_", "UCX_", "GLOO_", "TORCH_NCCL_")


def detect_orchestrator(env: Mapping[str, str] = os.environ) -> str:
    """slurm, kubernetes, torchrun or local; a Slurm job inside Kubernetes counts as slurm."""
    if "SLURM_JOB_ID" in env:
        return "slurm"
    if "KUBERNETES_SERVICE_HOST" in env:
        return "kubernetes"
    if "TORCHELASTIC_RUN_ID" in env:
        return "torchrun"
    return "local"


def job_details(env: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The orchestrator's own identifiers for this job, as far as the environment tells."""
    details = {key.lower(): env[key] for key in _JOB_KEYS[detect_orchestrator(env)] if key in env}
    if ENV_REPEAT in env:
        details["repeat"] = env[ENV_REPEAT]
    return details


def node_name(env: Mapping[str, str] = os.environ) -> str:
    """The node this process runs on as the orchestrator names it (Slurm node, Kubernetes node)."""
    return env.get("SLURMD_NODENAME") or env.get("NODE_NAME") or socket.gethostname()


def rank_record(env: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """What one rank contributes at set-up; the node's settings are kept from its first rank."""
    return {
        "node": node_name(env),
        "pod": env.get("POD_NAME"),
        "local_rank": int(env.get("LOCAL_RANK") or env.get("SLURM_LOCALID") or 0),
        "gpu_index": gpu_index(env),
        "communication_env": redact_env({k: v for k, v in sorted(env.items())
                                         if k.startswith(_COMMUNICATION_PREFIXES)}),
    }


def gpu_index(env: Mapping[str, str] = os.environ) -> int | None:
    """The GPU this process uses as the node numbers it (nvidia-smi's index): torch's current
    device mapped through CUDA_VISIBLE_DEVICES; None without CUDA, or when that lists UUIDs."""
    import torch  # in the functions, not at the top: `nemo-throughput import` starts without torch

    if not torch.cuda.is_available():
        return None
    logical = torch.cuda.current_device()
    if "CUDA_VISIBLE_DEVICES" not in env:
        return logical
    visible = [part.strip() for part in env["CUDA_VISIBLE_DEVICES"].split(",")]
    return int(visible[logical]) if logical < len(visible) and visible[logical].isdigit() else None


def places(rank_records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Where each rank ran, for naming the rank behind an extreme: rank, host, GPU index."""
    return [{"rank": rank, "host": record["node"], "gpu_index": record.get("gpu_index")}
            for rank, record in enumerate(rank_records)]


def gpus_per_node(env: Mapping[str, str] = os.environ) -> int | None:
    for key in ("LOCAL_WORLD_SIZE", "PET_NPROC_PER_NODE", "SLURM_NTASKS_PER_NODE"):
        value = env.get(key, "")
        if value.split("(")[0].isdigit():  # Slurm writes e.g. "8(x2)"
            return int(value.split("(")[0])
    import torch

    return torch.cuda.device_count() or None


def package_version() -> str | None:
    """This package's installed version."""
    try:
        return metadata.version("nemo-throughput")
    except metadata.PackageNotFoundError:
        return None


def library_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for package in _PACKAGES:
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            pass
    import torch

    if torch.version.cuda:
        versions["cuda"] = torch.version.cuda
        if torch.cuda.is_available():
            versions["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    return versions


def capture(rank_records: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The ``environment`` section of a summary from every rank's :func:`rank_record` (rank order)."""
    records = rank_records or [rank_record()]
    nodes: dict[str, dict[str, Any]] = {}
    for rank, record in enumerate(records):
        node = nodes.setdefault(record["node"], {"name": record["node"], "ranks": [], "pods": [],
                                                 "communication_env": record["communication_env"]})
        node["ranks"].append(rank)
        if record["pod"] and record["pod"] not in node["pods"]:
            node["pods"].append(record["pod"])
    return {
        "orchestrator": detect_orchestrator(),
        "job": job_details(),
        "container_image": redact_url_credentials(os.environ.get(ENV_IMAGE) or "") or None,
        "gpus_per_node": gpus_per_node(),
        "nodes": list(nodes.values()),
        "command": redact_command(sys.argv),  # Hydra overrides carry API keys: redacted
        "versions": library_versions(),
    }
