"""`nemo-throughput probe`: the start-up fabric probe (:mod:`nemo_throughput.explain.probe`) as a
command on every rank under torchrun or srun, and its table in nccl-tests' layout (rank 0 prints it)."""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from collections.abc import Callable, Mapping
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nemo_throughput.environment import launcher_env
from nemo_throughput.explain.probe import DEFAULT_ITERATIONS, DEFAULT_WARMUP, GIB, KIB, MIB, OPS, run_probe
from nemo_throughput.outputs import OutputPathError, check_output_file, write_output
from nemo_throughput.text import printable
from nemo_throughput.values import whole_number

if TYPE_CHECKING:
    import torch

# How long ranks wait for each other to join (and for a collective): torch's default is 30 minutes.
DEFAULT_RENDEZVOUS_TIMEOUT_S = 300.0


def render(result: Mapping[str, Any]) -> str:
    """An nccl-tests-like table: one block per op (size, count, type, time, algbw, busbw), then per rank."""
    lines = [f"# nemo-throughput probe: {result['world_size']} ranks, backend {result['backend'] or 'none'}, "
             f"device {result['device']}; time = {result['time_over_ranks']} over ranks of each rank's mean "
             f"time per op; GB/s = 1e9 B/s; busbw as nccl-tests (doc/PERFORMANCE.md)"]
    header = f"#{'size':>11} {'count':>11} {'type':>6} {'time(us)':>11} {'algbw(GB/s)':>12} {'busbw(GB/s)':>12} " \
             f"{'iters':>6}"
    whole_skips = {skip["reason"] for skip in result["skipped"] if skip["bytes"] is None}
    if not result["collectives"] and len(whole_skips) == 1:  # one rank: one reason for all
        lines += ["#", f"# collectives skipped: {whole_skips.pop()}"]
    for op in OPS if result["collectives"] or len(whole_skips) > 1 else ():
        rows = [row for row in result["collectives"] if row["op"] == op]
        skips = [skip for skip in result["skipped"] if skip["op"] == op]
        if not rows and not skips:
            continue
        lines += ["#", f"# {op}" + (f" (pairs {_pairs_text(result['sendrecv']['pairs'])})" if op == "sendrecv" and
                                    result["sendrecv"]["pairs"] else "")] + ([header] if rows else [])
        lines += [f" {row['bytes']:>11} {row['count']:>11} {row['type']:>6} {row['time_us']:>11.1f} "
                  f"{row['algbw_gbps']:>12.3f} {row['busbw_gbps']:>12.3f} {row['iterations']:>6}" for row in rows]
        lines += [f"  skipped{'' if skip['bytes'] is None else ' at ' + str(skip['bytes'])}: {skip['reason']}"
                  for skip in skips]
    lines += ["#", "# per rank", _PER_RANK_HEADER]
    matmul, sendrecv = result["matmul_tflops"], result["sendrecv"]
    for place, tflops, busbw in zip(result["ranks"], matmul["per_rank"], sendrecv["busbw_gbps_per_rank"],
                                    strict=True):
        gpu = "" if place["gpu_index"] is None else str(place["gpu_index"])
        lines.append(f" {place['rank']:>5} {place['host']:>20} {gpu:>4} {tflops:>16.3f} "
                     f"{'' if busbw is None else f'{busbw:.3f}':>20}")
    lines.append(f"# matmul: {matmul['n']} x {matmul['n']} {matmul['dtype']}, median {matmul['median']:.3f} TFLOP/s"
                 + (f"; send/recv per rank at {sendrecv['bytes']} bytes" if sendrecv["bytes"] else ""))
    flagged = result["flagged_ranks"]
    lines.append("# flagged (outside median +- max(3 MAD, 10 %)): "
                 + ("none" if not flagged else "; ".join(
                     f"rank {f['rank']} on {f['host']}: {f['what']} {f['value']:.3f} (median {f['median']:.3f})"
                     for f in flagged)))
    return "\n".join(lines) + "\n"


_PER_RANK_HEADER = f"#{'rank':>5} {'host':>20} {'gpu':>4} {'matmul(TFLOP/s)':>16} {'sendrecv busbw(GB/s)':>20}"


def _pairs_text(pairs: list[list[int]]) -> str:
    shown = ", ".join(f"{a}<->{b}" for a, b in pairs[:4])
    return shown + (f", ... ({len(pairs)} pairs)" if len(pairs) > 4 else "")


_SIZE = re.compile(r"^\s*(\d+)\s*([KMG]?)(?:I?B)?\s*$", re.IGNORECASE)


def parse_size_bytes(text: str) -> int:
    """"8K", "8KiB", "64M", "1G" (binary units) or plain bytes."""
    match = _SIZE.match(text)
    if not match or int(match.group(1)) < 1:
        raise ValueError(f"size {text!r} is not a positive number of bytes, e.g. 8K, 64MiB or 1048576")
    return int(match.group(1)) * {"": 1, "K": KIB, "M": MIB, "G": GIB}[match.group(2).upper()]


def _sizes_argument(text: str) -> list[int]:
    try:
        return [parse_size_bytes(part) for part in text.split(",")]
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"{error}; give a comma-separated list, e.g. 8K,1M,64M") from None


def _count_argument(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        number = whole_number(text)
        if number is None or number < minimum:
            raise argparse.ArgumentTypeError(f"must be a whole number >= {minimum}, got {text!r}")
        return number
    return parse


def _seconds_argument(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return seconds


def add_parsers(commands: argparse._SubParsersAction) -> None:
    probe = commands.add_parser(
        "probe", help="the fabric and the GPUs before a run: collectives' algbw/busbw (nccl-tests' way) and a "
                      "matmul TFLOP/s per rank, ranks out of line named",
        description="Run it on every rank, e.g. `torchrun --nproc-per-node 8 -m nemo_throughput.cli probe` or "
                    "`srun nemo-throughput probe`: a few seconds of all_reduce, all_gather, reduce_scatter, "
                    "all_to_all and send/recv at several sizes, then a matmul per rank. Rank 0 prints the table "
                    "(and writes --output). Exit status: 0 measured, 2 wrong options or launch environment.")
    probe.add_argument("--sizes", type=_sizes_argument,
                       help="message sizes, comma-separated, e.g. 8K,1M,64M (default 8K,128K,1M,8M,64M on NCCL, "
                            "4K,64K,1M on gloo)")
    probe.add_argument("--output", type=Path, help="write the result as JSON to this file (rank 0); its directory "
                                                   "must exist")
    probe.add_argument("--backend", choices=("nccl", "gloo"), help="default: nccl when CUDA is available, else gloo")
    probe.add_argument("--iterations", type=_count_argument(1), default=DEFAULT_ITERATIONS,
                       help=f"timed ops per op and size, at most ({DEFAULT_ITERATIONS})")
    probe.add_argument("--warmup", type=_count_argument(0), default=DEFAULT_WARMUP,
                       help=f"warm-up ops per op and size, at most ({DEFAULT_WARMUP})")
    probe.add_argument("--time-budget", type=_seconds_argument,
                       help="seconds for all collectives together, roughly (5 on NCCL, 2 on gloo)")
    probe.add_argument("--rendezvous-timeout", type=_seconds_argument, default=DEFAULT_RENDEZVOUS_TIMEOUT_S,
                       help=f"seconds the ranks wait for each other to start ({DEFAULT_RENDEZVOUS_TIMEOUT_S:g})")
    probe.set_defaults(handler=run_command)


def run_command(args: argparse.Namespace) -> int:
    import torch
    import torch.distributed as dist

    try:
        backend = args.backend or ("nccl" if torch.cuda.is_available() else "gloo")
        if backend == "nccl" and not torch.cuda.is_available():
            raise ValueError("--backend nccl needs CUDA, and no CUDA device is available here: use --backend gloo")
        if args.output is not None:
            check_output_file(args.output, "--output")
        rendezvous = launcher_env(os.environ)
    except ValueError as error:
        print(f"nemo-throughput probe: {printable(error)}", file=sys.stderr)
        return 2
    initialised_here = rendezvous is not None and not dist.is_initialized()
    try:
        device = _init_process_group(backend, rendezvous, args.rendezvous_timeout)
    except (RuntimeError, ValueError) as error:  # torch's DistStoreError/DistNetworkError are RuntimeErrors
        first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
        print(f"nemo-throughput probe: rank {rendezvous['RANK']} of {rendezvous['WORLD_SIZE']} could not meet the "
              f"other ranks at {printable(rendezvous['MASTER_ADDR'])}:{printable(rendezvous['MASTER_PORT'])} within "
              f"{args.rendezvous_timeout:g} s ({printable(first_line)}); are all ranks started, and are RANK, "
              "WORLD_SIZE and MASTER_ADDR this launch's? (--rendezvous-timeout to wait longer)", file=sys.stderr)
        return 2
    try:
        result = run_probe(sizes_bytes=args.sizes, iterations=args.iterations, warmup=args.warmup, device=device,
                           time_budget_s=args.time_budget)
        rank_zero = not dist.is_initialized() or dist.get_rank() == 0
    except ValueError as error:  # the same on every rank: arguments or settings
        print(f"nemo-throughput probe: {printable(error)}", file=sys.stderr)
        return 2
    finally:
        if initialised_here:
            dist.destroy_process_group()
    if rank_zero:
        print(render(result), end="", flush=True)
        if args.output is not None:
            try:
                write_output(json.dumps(result, indent=2) + "\n", args.output, "--output")
            except OutputPathError as error:  # what the check before cannot see: a full disk
                print(f"nemo-throughput probe: {printable(error)}", file=sys.stderr)
                return 2
    return 0


def _init_process_group(backend: str, rendezvous: dict[str, str] | None, timeout_s: float) -> torch.device:
    """init_process_group from the env:// variables when launched on several ranks (not when the process
    group exists already); the device this rank probes, made current on CUDA."""
    import torch
    import torch.distributed as dist

    if rendezvous is not None and not dist.is_initialized():
        os.environ.update(rendezvous)
    device = torch.device("cpu")
    if backend == "nccl":
        # LOCAL_RANK indexes the node's GPUs, unless Slurm gave each task its own (--gpus-per-task): one visible
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
        torch.cuda.set_device(device)
    if rendezvous is not None and not dist.is_initialized():
        dist.init_process_group(backend, init_method="env://", timeout=timedelta(seconds=timeout_s))
    return device
