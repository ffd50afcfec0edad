"""torch.distributed as the measurement sees it: whether a process group is up, this rank and the
world, and the two small collectives of set-up. Without a process group the run is one rank.

torch.distributed is imported inside each function: importing this module loads no torch (the
importers and the command line reach it through the run's facts).
"""

from __future__ import annotations

import os
from typing import Any

RANKS_PER_CPU = 4  # the docs' figures ran 8 gloo ranks on 2 CPUs


def check_cpu_ranks(option: str, count: int) -> None:
    """Gloo ranks to start on this machine's CPUs, each a process that imports torch: 100000 would start
    processes until memory ran out, with no figure to show; more than a few per CPU measure the crowding."""
    most = RANKS_PER_CPU * (os.cpu_count() or 1)
    if count > most:
        raise ValueError(f"{option} {count}: at most {most} gloo ranks here ({RANKS_PER_CPU} per CPU, "
                         f"{os.cpu_count()} CPUs): each rank is a process of its own")


def is_up() -> bool:
    """True when a default process group exists (torch.distributed is built in and initialised)."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if is_up() else 0


def world_size() -> int:
    import torch.distributed as dist

    return dist.get_world_size() if is_up() else 1


def backend() -> str | None:
    """The default group's backend ("nccl", "gloo", ...), None without a process group."""
    import torch.distributed as dist

    return str(dist.get_backend()) if is_up() else None


def gather_objects(obj: Any) -> list[Any]:
    """Every rank's ``obj``, in rank order (one collective; ``[obj]`` alone)."""
    import torch.distributed as dist

    if not is_up():
        return [obj]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, obj)
    return gathered


def from_rank_zero(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank (one collective; ``obj`` itself alone)."""
    import torch.distributed as dist

    if not is_up():
        return obj
    shared = [obj]
    dist.broadcast_object_list(shared, src=0)
    return shared[0]
