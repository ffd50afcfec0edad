"""Where and with what a run ran: orchestrator, job, hosts and library versions."""

from __future__ import annotations

import os
import platform
import socket
import sys
from collections.abc import Mapping
from importlib import metadata

import torch

ORCHESTRATORS = ("slurm", "kubernetes", "torchrun", "local")

_PACKAGES = ("torch", "lightning", "pytorch-lightning", "nemo-toolkit", "megatron-core",
             "hydra-core", "nemo-throughput")


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
    keys = {
        "slurm": ("SLURM_JOB_ID", "SLURM_JOB_NAME", "SLURM_JOB_NODELIST", "SLURM_NNODES",
                  "SLURM_JOB_PARTITION", "SLURM_JOB_ACCOUNT", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID"),
        "kubernetes": ("POD_NAME", "NODE_NAME", "POD_NAMESPACE", "HOSTNAME", "PET_NNODES", "PET_NPROC_PER_NODE"),
        "torchrun": ("TORCHELASTIC_RUN_ID", "GROUP_WORLD_SIZE", "LOCAL_WORLD_SIZE"),
        "local": (),
    }[detect_orchestrator(env)]
    return {key.lower(): env[key] for key in keys if key in env}


def library_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for package in _PACKAGES:
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            pass
    if torch.version.cuda:
        versions["cuda"] = torch.version.cuda
        if torch.cuda.is_available():
            versions["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    return versions


def capture(hostnames: list[str] | None = None) -> dict[str, object]:
    """The ``environment`` section of a summary; ``hostnames`` lists the host of every rank."""
    orchestrator = detect_orchestrator()
    return {
        "orchestrator": orchestrator,
        "job": job_details(),
        "hostname": socket.gethostname(),
        "rank_hostnames": hostnames or [socket.gethostname()],
        "command": " ".join(sys.argv),
        "versions": library_versions(),
    }
