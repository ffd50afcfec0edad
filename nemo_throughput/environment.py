"""Where and with what a run ran: orchestrator, job, nodes, container, communication settings,
library versions. Collected once at set-up (one small gather over ranks), never per step. Also
the rendezvous variables a launcher (torchrun, srun) gives a process, checked before any wait."""

from __future__ import annotations

import os
import platform
import re
import socket
import sys
from collections.abc import Mapping
from importlib import metadata
from typing import Any

from nemo_throughput.redact import redact_command, redact_env, redact_url_credentials
from nemo_throughput.values import whole_number

ORCHESTRATORS = ("slurm", "kubernetes", "torchrun", "local")

# Set by the launchers (nemo-throughput launch / launchers/): they name what the job cannot see.
ENV_OUTPUT_DIR = "NEMO_THROUGHPUT_OUTPUT_DIR"  # where the summary goes (per job and repeat)
ENV_RUN_LABEL = "NEMO_THROUGHPUT_RUN_LABEL"  # run.label, e.g. bare-metal or kubernetes
ENV_IMAGE = "NEMO_THROUGHPUT_IMAGE"  # the container image the job runs in
ENV_REPEAT = "NEMO_THROUGHPUT_REPEAT"  # which of --repeat K identical runs this is
ENV_PROMETHEUS_PORT = "NEMO_THROUGHPUT_PROMETHEUS_PORT"  # serve live metrics on this port (the prometheus setting)

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
        "local_rank": whole_number(env.get("LOCAL_RANK") or env.get("SLURM_LOCALID") or "0"),  # None: not a number
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
    return whole_number(visible[logical]) if logical < len(visible) else None


def places(rank_records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Where each rank ran, for naming the rank behind an extreme: rank, host, GPU index."""
    return [{"rank": rank, "host": record["node"], "gpu_index": record.get("gpu_index")}
            for rank, record in enumerate(rank_records)]


def gpus_per_node(env: Mapping[str, str] = os.environ) -> int | None:
    for key in ("LOCAL_WORLD_SIZE", "PET_NPROC_PER_NODE", "SLURM_NTASKS_PER_NODE"):
        count = whole_number(env.get(key, "").split("(")[0])  # Slurm writes e.g. "8(x2)"
        if count:
            return count
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


# ------------------------------------------------------------------ the launcher's rendezvous variables
def launcher_env(env: Mapping[str, str]) -> dict[str, str] | None:
    """RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT for init_process_group(env://): torchrun's
    as they are; under srun without torchrun derived from Slurm's; None when neither launched this process
    (one process: the probe measures the matmul only)."""
    if "RANK" in env and "WORLD_SIZE" in env:  # torchrun, or a Kubeflow PyTorchJob, or a launcher that set them
        missing = [key for key in ("MASTER_ADDR", "MASTER_PORT") if not env.get(key)]
        if missing:
            raise ValueError(f"RANK and WORLD_SIZE are set but {' and '.join(missing)} not: launch with torchrun "
                             f"or set them")
        _check_rank_variables(env)
        return {"RANK": env["RANK"], "WORLD_SIZE": env["WORLD_SIZE"], "LOCAL_RANK": env.get("LOCAL_RANK", "0"),
                "MASTER_ADDR": env["MASTER_ADDR"], "MASTER_PORT": env["MASTER_PORT"]}
    # SLURM_STEP_NUM_TASKS exists only inside an srun step: a batch script's own shell (one process) also
    # sees SLURM_NTASKS, and taking it for the world size would wait forever for ranks that never start.
    if "SLURM_PROCID" not in env or "SLURM_STEP_NUM_TASKS" not in env:
        return None
    procid, tasks = whole_number(env["SLURM_PROCID"]), whole_number(env["SLURM_STEP_NUM_TASKS"])
    if procid is None or tasks is None or not 0 <= procid < tasks:  # else the rendezvous waits for ranks that never come
        raise ValueError(f"SLURM_PROCID={env['SLURM_PROCID']!r} and SLURM_STEP_NUM_TASKS="
                         f"{env['SLURM_STEP_NUM_TASKS']!r} must be whole numbers, the rank below the number of tasks: "
                         "run under srun, which sets them, or unset them")
    return {"RANK": env["SLURM_PROCID"], "WORLD_SIZE": env["SLURM_STEP_NUM_TASKS"],
            "LOCAL_RANK": env.get("SLURM_LOCALID", "0"), "MASTER_ADDR": _slurm_master_addr(env),
            "MASTER_PORT": env.get("MASTER_PORT") or _slurm_master_port(env)}


# Variables that only a launcher sets: with none of them, RANK/WORLD_SIZE are an export left in the shell.
_LAUNCHER_MARKERS = ("TORCHELASTIC_RUN_ID", "KUBERNETES_SERVICE_HOST", "SLURM_STEP_ID", "OMPI_COMM_WORLD_SIZE",
                     "PMI_SIZE", "PMIX_RANK")


_UNSET_HINT = "unset RANK WORLD_SIZE MASTER_ADDR MASTER_PORT, or launch with torchrun"


def _check_rank_variables(env: Mapping[str, str]) -> None:
    """Refuse RANK/WORLD_SIZE that would make the rendezvous wait (30 minutes by default) for ranks
    that never come: not numbers, a rank outside the world, no launcher around them, or srun's
    own ranks saying otherwise (without torchrun, which sets its own)."""
    rank_text, world_text = env["RANK"], env["WORLD_SIZE"]
    rank, world_size = whole_number(rank_text), whole_number(world_text)
    if rank is None or world_size is None or world_size < 1:
        raise ValueError(f"RANK={rank_text!r} and WORLD_SIZE={world_text!r} must be whole numbers, WORLD_SIZE >= 1: "
                         f"{_UNSET_HINT}")
    if rank >= world_size:
        raise ValueError(f"RANK={rank} is not below WORLD_SIZE={world_size}: {_UNSET_HINT}")
    if world_size > 1 and not any(marker in env for marker in _LAUNCHER_MARKERS):
        raise ValueError(f"RANK={rank} and WORLD_SIZE={world_size} are set, but no launcher started this process "
                         "(no torchrun, srun, mpirun or Kubernetes variables): an export left in this shell? The "
                         f"probe would wait for {world_size - 1} more rank(s) that never start; {_UNSET_HINT}")
    slurm = (env.get("SLURM_PROCID"), env.get("SLURM_STEP_NUM_TASKS"))
    if "TORCHELASTIC_RUN_ID" not in env and None not in slurm and slurm != (rank_text, world_text):
        raise ValueError(f"RANK={rank} and WORLD_SIZE={world_size} disagree with this srun step's rank {slurm[0]} of "
                         f"{slurm[1]}: an export left in the job's environment? unset RANK and WORLD_SIZE under srun")


def _slurm_master_addr(env: Mapping[str, str]) -> str:
    """MASTER_ADDR if the job set it (launchers/slurm/benchmark.sbatch does), else the first node of the step:
    srun's default block distribution puts rank 0 there. SLURM_LAUNCH_NODE_IPADDR (where srun ran) is the
    last resort: right from a batch script, wrong from a login node, which runs no rank."""
    if env.get("MASTER_ADDR"):
        return env["MASTER_ADDR"]
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
    if nodelist:
        return first_host(nodelist)
    if env.get("SLURM_LAUNCH_NODE_IPADDR"):
        return env["SLURM_LAUNCH_NODE_IPADDR"]
    raise ValueError("under srun but neither MASTER_ADDR, SLURM_STEP_NODELIST, SLURM_JOB_NODELIST nor "
                     "SLURM_LAUNCH_NODE_IPADDR is set: export MASTER_ADDR=<first node>")


def _slurm_master_port(env: Mapping[str, str]) -> str:
    """The same port on every rank of the step, different for each job and step (a probe, then training)."""
    job, step = env.get("SLURM_JOB_ID", "0"), env.get("SLURM_STEP_ID", "0")
    job_id, step_id = (whole_number(value) or 0 for value in (job, step))
    return str(20000 + (job_id * 16 + step_id) % 40000)


_BRACKET = re.compile(r"\[([^\]]*)\]")


def first_host(nodelist: str) -> str:
    """The first host of a Slurm hostlist: "gpu[07-09,12],login1" -> "gpu07", "rack[1-2]-n[03-04]" -> "rack1-n03".
    Parsed here because containers (Pyxis) often lack `scontrol show hostnames`."""
    depth, end = 0, len(nodelist)
    for index, char in enumerate(nodelist):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            end = index
            break
    first = _BRACKET.sub(lambda match: re.split(r"[,-]", match.group(1))[0], nodelist[:end].strip())
    if not first or "[" in first or "]" in first:
        shown = nodelist if len(nodelist) <= 200 else f"{nodelist[:200]}... ({len(nodelist):,} characters)"
        raise ValueError(f"cannot read the first host of Slurm nodelist {shown!r}: export MASTER_ADDR")
    return first
