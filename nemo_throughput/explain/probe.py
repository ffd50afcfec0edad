"""Start-up fabric probe: a few seconds of collectives and send/recv at several sizes, reported as
nccl-tests reports them (time per op, algbw, busbw), plus a matmul rate per rank; ranks whose matmul
rate or send/recv bandwidth lies outside the pack are named with their host.

Timing follows nccl-tests (src/common.cu, BenchTime): warm-up ops, a barrier, then N ops back to
back with one device synchronisation at the END of the loop only (on CUDA; gloo ops block on the
host), time per op = elapsed / N. Each rank times its own loop; the reported time is the maximum
over ranks (nccl-tests' `-a 3`; its default `-a 1` averages, but the slowest rank is what training
waits for). Everything here is collective: every rank of the group calls :func:`run_probe`, and
every decision that changes which collectives run next (skip an op, how many iterations) is taken
from values all ranks share, so no rank can run a collective the others do not.

`nemo-throughput probe` (:mod:`nemo_throughput.explain.probe_command`) runs it as a command under
torchrun or srun.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nemo_throughput import distributed
from nemo_throughput.environment import gpu_index, node_name
from nemo_throughput.text import package_logger
from nemo_throughput.values import is_int, whole_number

if TYPE_CHECKING:
    import torch

# torch is imported in the functions that use it: `nemo-throughput probe --help` does not load it.

log = package_logger(__name__)

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "sendrecv")
KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
DEFAULT_SIZES_BYTES_CUDA = (8 * KIB, 128 * KIB, 1 * MIB, 8 * MIB, 64 * MIB)
DEFAULT_SIZES_BYTES_CPU = (4 * KIB, 64 * KIB, 1 * MIB)  # gloo on CPU: keeps the probe to a couple of seconds
DEFAULT_ITERATIONS, DEFAULT_WARMUP = 20, 5  # nccl-tests' defaults (-n 20, -w 5)
COLLECTIVES_BUDGET_S = {"cuda": 5.0, "cpu": 2.0}  # all ops and sizes together, roughly
MATMUL_BUDGET_S = {"cuda": 0.5, "cpu": 0.25}
MATMUL_SIZE = {"cuda": (8192, "bfloat16"), "cpu": (512, "float32")}  # n, torch dtype
MATMUL_ROUNDS = 5
PROBE_DTYPE, PROBE_DTYPE_NAME = "float32", "float"  # torch's name, nccl-tests' default type (-d float)
ELEMENT_BYTES = 4
# nccl-tests rounds per-rank (all_gather, reduce_scatter) and per-peer (all_to_all) counts down to 16 bytes
ALIGN_ELEMENTS = 16 // ELEMENT_BYTES
OUTLIER_MADS, OUTLIER_MIN_FRACTION = 3.0, 0.10
# Only for tests: this rank repeats every matmul N times but counts it once (a rank made slow on purpose).
ENV_TEST_SLOWDOWN = "NEMO_THROUGHPUT_PROBE_TEST_SLOWDOWN"


# ------------------------------------------------------------------------------ nccl-tests arithmetic
def bus_factor(op: str, ranks: int) -> float:
    """busbw / algbw, nccl-tests doc/PERFORMANCE.md ("Summary"): the share of the data each rank's link
    must carry in an optimal algorithm, so busbw compares with the hardware's peak whatever the rank count.

    all_reduce 2(n-1)/n (a reduce-scatter then an all-gather); reduce_scatter, all_gather and all_to_all
    (n-1)/n (each rank keeps 1/n of the data locally); send/recv 1 (point to point: all of it crosses).
    """
    if ranks < 1:
        raise ValueError(f"ranks must be at least 1, got {ranks}")
    factors = {"all_reduce": 2 * (ranks - 1) / ranks, "all_gather": (ranks - 1) / ranks,
               "reduce_scatter": (ranks - 1) / ranks, "all_to_all": (ranks - 1) / ranks, "sendrecv": 1.0}
    if op not in factors:
        raise ValueError(f"unknown op {op!r}: one of {', '.join(OPS)}")
    return factors[op]


def bandwidths_gbps(op: str, size_bytes: int, time_s: float, ranks: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s (1e9 bytes/s, as nccl-tests) for one op of `size_bytes` taking `time_s`.

    algbw = S / t (PERFORMANCE.md), with S as nccl-tests' `size` column means it (its *GetBw functions):
    all_reduce and sendrecv the buffer; all_gather the gathered output (per-rank count x n); reduce_scatter
    the input being reduced (per-rank count x n); all_to_all one rank's whole send buffer (per-peer count x n).
    busbw = algbw x :func:`bus_factor`.
    """
    if time_s <= 0:
        raise ValueError(f"time_s must be positive, got {time_s}")
    algbw = size_bytes / time_s / 1e9
    return algbw, algbw * bus_factor(op, ranks)


def op_shape(op: str, requested_bytes: int, ranks: int) -> tuple[int, int] | None:
    """(size_bytes, count) of `op` for a requested size, as nccl-tests sizes its buffers, or None when
    the size holds less than one aligned element per rank. count is nccl-tests' `count` column: elements
    of the buffer (all_reduce, sendrecv), per rank (all_gather, reduce_scatter) or per peer (all_to_all)."""
    elements = requested_bytes // ELEMENT_BYTES
    if op in ("all_reduce", "sendrecv"):
        return (elements * ELEMENT_BYTES, elements) if elements else None
    per_rank = (elements // ranks) // ALIGN_ELEMENTS * ALIGN_ELEMENTS
    return (per_rank * ranks * ELEMENT_BYTES, per_rank) if per_rank else None


# ------------------------------------------------------------------------------------ outliers
def outlier_bounds(values: Sequence[float]) -> tuple[float, float, float]:
    """(low, high, median): the range median +- max(3 MAD, 10 % of the median). The 10 % floor keeps
    a tight pack (MAD near 0) from flagging ranks over noise. With two values nothing can fall outside
    (each is MAD from the median), so naming a rank takes at least three."""
    median = statistics.median(values)
    mad = statistics.median(abs(value - median) for value in values)
    half_width = max(OUTLIER_MADS * mad, OUTLIER_MIN_FRACTION * abs(median))
    return median - half_width, median + half_width, median


def flag_outliers(values: Sequence[float | None], places: Sequence[Mapping[str, Any]], what: str) -> list[dict]:
    """Ranks whose value lies outside :func:`outlier_bounds` of all ranks' values (None: not measured)."""
    known = [value for value in values if value is not None and math.isfinite(value)]
    if not known:
        return []
    low, high, median = outlier_bounds(known)
    return [{"rank": place["rank"], "host": place["host"], "gpu_index": place.get("gpu_index"), "what": what,
             "value": value, "median": median}
            for value, place in zip(values, places, strict=True)
            if value is not None and math.isfinite(value) and not low <= value <= high]


# ------------------------------------------------------------------------------------ the probe
@dataclass(frozen=True)
class _Fabric:
    group: Any
    rank: int
    world_size: int
    device: torch.device
    backend: str | None

    @property
    def distributed(self) -> bool:
        return self.backend is not None

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            import torch

            torch.cuda.synchronize(self.device)

    def per_rank(self, values: Sequence[float]) -> torch.Tensor:
        """Every rank's `values` as a float64 [world_size, len(values)] CPU tensor, on every rank. An
        all-reduce (sum) of a zero matrix holding this rank's row: supported by every backend."""
        import torch
        import torch.distributed as dist

        rows = torch.zeros(self.world_size, len(values), dtype=torch.float64, device=self.device)
        rows[self.rank] = torch.tensor(values, dtype=torch.float64)
        if self.distributed:
            dist.all_reduce(rows, group=self.group)
        return rows.cpu()

    def barrier(self) -> None:
        self.per_rank([0.0])


def run_probe(group: Any = None, sizes_bytes: Sequence[int] | None = None, iterations: int = DEFAULT_ITERATIONS,
              warmup: int = DEFAULT_WARMUP, device: torch.device | str | None = None,
              time_budget_s: float | None = None, matmul_budget_s: float | None = None,
              places: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Probe the fabric and the ranks' compute; collective: every rank of `group` calls it, with the same
    arguments. Returns the same dict on every rank (the summary's "probe" section).

    sizes_bytes: requested message sizes (default 8 KiB..64 MiB on CUDA, 4 KiB..1 MiB on CPU).
    iterations / warmup: timed and warm-up ops per op and size (at most: fewer when one size would take
    more than its share of `time_budget_s`, all ops and sizes together, 5 s on CUDA, 2 s on CPU).
    device: where buffers live (default: the current CUDA device under NCCL, else the CPU).
    places: every rank's {"rank", "host", "gpu_index"} when the caller knows them already (the
    callback gathered them at set-up); else gathered here.
    Without torch.distributed initialised (or on a 1-rank group) the collectives are skipped, with
    that reason in "skipped": there is nothing to communicate; the matmul is still measured.
    """
    _require_positive_int("iterations", iterations)
    _require_positive_int("warmup", warmup, allow_zero=True)
    for name, seconds in (("time_budget_s", time_budget_s), ("matmul_budget_s", matmul_budget_s)):
        if seconds is not None and not (isinstance(seconds, (int, float)) and 0 < seconds < math.inf):
            raise ValueError(f"{name} must be a positive number of seconds, got {seconds!r}")
    started = time.perf_counter()
    fabric = _fabric(group, device)
    kind = "cuda" if fabric.device.type == "cuda" else "cpu"
    sizes = sorted(set(sizes_bytes or (DEFAULT_SIZES_BYTES_CUDA if kind == "cuda" else DEFAULT_SIZES_BYTES_CPU)))
    for size in sizes:
        _require_positive_int("sizes_bytes", size)
    places = places or _places(fabric)
    if fabric.world_size < 2:
        why = "torch.distributed is not initialised" if not fabric.distributed else "the process group has one rank"
        rows, skipped = [], [{"op": op, "bytes": None, "reason": f"{why}: nothing to communicate"} for op in OPS]
        sendrecv = {"pairs": [], "bytes": None, "busbw_gbps_per_rank": [None]}
    else:
        pairs = sendrecv_pairs(fabric.world_size, [place["host"] for place in places])
        budget_s = COLLECTIVES_BUDGET_S[kind] if time_budget_s is None else time_budget_s
        rows, skipped, sendrecv = _collectives(fabric, sizes, pairs, iterations, warmup, budget_s)
    matmul = _matmul_section(fabric, MATMUL_BUDGET_S[kind] if matmul_budget_s is None else matmul_budget_s)
    flagged = (flag_outliers(matmul["per_rank"], places, "matmul_tflops")
               + flag_outliers(sendrecv["busbw_gbps_per_rank"], places, "sendrecv_busbw_gbps"))
    return {
        "backend": fabric.backend,
        "world_size": fabric.world_size,
        "device": str(fabric.device),
        "dtype": PROBE_DTYPE_NAME,
        "time_over_ranks": "max",
        "collectives": rows,
        "skipped": skipped,
        "sendrecv": sendrecv,
        "matmul_tflops": matmul,
        "ranks": places,
        "flagged_ranks": flagged,
        "duration_s": time.perf_counter() - started,
    }


def _collectives(fabric: _Fabric, sizes: list[int], pairs: list[tuple[int, int]], iterations: int, warmup: int,
                 budget_s: float) -> tuple[list[dict], list[dict], dict[str, Any]]:
    """Every op at every size: the table's rows, what was skipped and why, and each rank's send/recv
    bandwidth at the largest size that ran."""
    per_case_budget_s = budget_s / (len(OPS) * len(sizes))
    rows, skipped = [], []
    sendrecv = {"pairs": [list(pair) for pair in pairs], "bytes": None,
                "busbw_gbps_per_rank": [None] * fabric.world_size}
    for op in OPS:
        for size in sizes:
            outcome = _probe_case(fabric, op, size, pairs, iterations, warmup, per_case_budget_s)
            if isinstance(outcome, str):
                skipped.append({"op": op, "bytes": size, "reason": outcome})
                continue
            row, per_rank_s = outcome
            rows.append(row)
            if op == "sendrecv":  # sizes ascend: the last one that ran wins
                sendrecv["bytes"] = row["bytes"]
                sendrecv["busbw_gbps_per_rank"] = [
                    None if seconds is None else bandwidths_gbps(op, row["bytes"], seconds, 2)[1]
                    for seconds in per_rank_s]
    return rows, skipped, sendrecv


def sendrecv_pairs(world_size: int, hosts: Sequence[str]) -> list[tuple[int, int]]:
    """Rank pairs that exchange at the same time. On one host: 0<->1, 2<->3, ... On several hosts, rank r
    with r + n/2: under the usual block placement (ranks of a node contiguous) each pair then crosses
    nodes, so a slow NIC or link shows; neighbouring ranks would all talk over NVLink. With an odd rank
    count the last rank sits out."""
    half = world_size // 2
    if len(set(hosts)) > 1:
        return [(rank, rank + half) for rank in range(half)]
    return [(rank, rank + 1) for rank in range(0, 2 * half, 2)]


def _fabric(group: Any, device: torch.device | str | None) -> _Fabric:
    import torch
    import torch.distributed as dist

    if not distributed.is_up():
        if group is not None:
            raise ValueError("run_probe was given a process group but torch.distributed is not initialised: "
                             "call torch.distributed.init_process_group first, or pass group=None")
        chosen = torch.device(device) if device is not None else torch.device(
            "cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
        return _Fabric(None, 0, 1, chosen, None)
    backends = str(dist.get_backend(group))
    if device is not None:
        chosen = torch.device(device)
    elif "nccl" in backends and torch.cuda.is_available():
        chosen = torch.device("cuda", torch.cuda.current_device())
    else:
        chosen = torch.device("cpu")
    if chosen.type == "cuda" and chosen.index is None:
        chosen = torch.device("cuda", torch.cuda.current_device())
    return _Fabric(group, dist.get_rank(group), dist.get_world_size(group), chosen,
                   _backend_for(backends, chosen.type))


def _backend_for(backends: str, device_type: str) -> str:
    """The backend that serves `device_type`: "cpu:gloo,cuda:nccl" (a group with both) -> "nccl" on cuda."""
    if ":" not in backends:
        return backends
    named = dict(entry.split(":", 1) for entry in backends.split(","))
    return named.get(device_type, backends)


def _places(fabric: _Fabric) -> list[dict[str, Any]]:
    """{"rank", "host", "gpu_index"} of every rank, in rank order."""
    import torch
    import torch.distributed as dist

    mine = {"rank": fabric.rank, "host": node_name(), "gpu_index": None}
    if fabric.device.type == "cuda":  # as nvidia-smi numbers it (through CUDA_VISIBLE_DEVICES) when it can
        mine["gpu_index"] = gpu_index() if fabric.device.index == torch.cuda.current_device() else fabric.device.index
    if not fabric.distributed:
        return [mine]
    everyone: list[Any] = [None] * fabric.world_size
    dist.all_gather_object(everyone, mine, group=fabric.group)
    return everyone


# ------------------------------------------------------------------------------------ one op, one size
def _probe_case(fabric: _Fabric, op: str, requested_bytes: int, pairs: list[tuple[int, int]], iterations: int,
                warmup: int, budget_s: float) -> tuple[dict[str, Any], list[float | None]] | str:
    """The table row of `op` at one size and each rank's own seconds per op (None: took no part),
    or why it did not run."""
    shape = op_shape(op, requested_bytes, fabric.world_size)
    if shape is None:
        return (f"{requested_bytes} bytes hold less than {ALIGN_ELEMENTS} {PROBE_DTYPE_NAME}s per rank on "
                f"{fabric.world_size} ranks")
    size_bytes, count = shape
    partner = _partner(fabric.rank, pairs)
    takes_part = op != "sendrecv" or partner is not None
    run_once = _operation(fabric, op, count, partner)
    timed = _time_op(fabric, run_once, iterations, warmup, budget_s)
    if isinstance(timed, str):
        return timed
    seconds, done = timed
    everyone = fabric.per_rank([seconds if takes_part else math.nan])[:, 0].tolist()
    per_rank_s = [None if math.isnan(value) else value for value in everyone]
    slowest_s = max(value for value in per_rank_s if value is not None)
    ranks_in_op = 2 if op == "sendrecv" else fabric.world_size
    algbw, busbw = bandwidths_gbps(op, size_bytes, slowest_s, ranks_in_op)
    row = {"op": op, "bytes": size_bytes, "count": count, "type": PROBE_DTYPE_NAME, "time_us": slowest_s * 1e6,
           "algbw_gbps": algbw, "busbw_gbps": busbw, "iterations": done}
    return row, per_rank_s


def _partner(rank: int, pairs: list[tuple[int, int]]) -> int | None:
    for first, second in pairs:
        if rank in (first, second):
            return second if rank == first else first
    return None


def _operation(fabric: _Fabric, op: str, count: int, partner: int | None) -> Callable[[], None]:
    """One op on buffers allocated once (zeros: sums stay finite, no denormals to slow a CPU reduction)."""
    import torch
    import torch.distributed as dist

    group, ranks = fabric.group, fabric.world_size

    def zeros(elements: int) -> torch.Tensor:
        return torch.zeros(elements, dtype=getattr(torch, PROBE_DTYPE), device=fabric.device)

    if op == "all_reduce":
        buffer = zeros(count)
        return lambda: dist.all_reduce(buffer, group=group)
    if op == "all_gather":
        # all_gather_single is the newer name of all_gather_into_tensor (the old one warns from torch 2.13)
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        gathered, mine = zeros(count * ranks), zeros(count)
        return lambda: gather(gathered, mine, group=group)
    if op == "reduce_scatter":
        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        reduced, full = zeros(count), zeros(count * ranks)
        return lambda: scatter(reduced, full, group=group)
    if op == "all_to_all":
        received, sent = zeros(count * ranks), zeros(count * ranks)
        return lambda: dist.all_to_all_single(received, sent, group=group)
    if op == "sendrecv":
        return _exchange(fabric, count, partner)
    raise ValueError(f"unknown op {op!r}")


def _exchange(fabric: _Fabric, count: int, partner: int | None) -> Callable[[], None]:
    """Send `count` elements to the partner while receiving as many from it. Batched, because NCCL runs a
    pair's sends and receives on one stream: unbatched, both ranks would wait in their send."""
    if partner is None:
        return lambda: None
    import torch
    import torch.distributed as dist

    sent = torch.zeros(count, dtype=getattr(torch, PROBE_DTYPE), device=fabric.device)
    received = torch.empty_like(sent)
    peer = partner if fabric.group is None else dist.get_global_rank(fabric.group, partner)

    def exchange() -> None:
        operations = [dist.P2POp(dist.isend, sent, peer, fabric.group),
                      dist.P2POp(dist.irecv, received, peer, fabric.group)]
        for work in dist.batch_isend_irecv(operations):
            work.wait()
    return exchange


def _time_op(fabric: _Fabric, run_once: Callable[[], None], iterations: int, warmup: int,
             budget_s: float) -> tuple[float, int] | str:
    """(this rank's seconds per op, timed ops) the nccl-tests way, or why the op cannot run here.

    The first op checks the backend supports it (gloo lacks some ops in some torch versions; every rank
    fails alike) and opens its connections. The op counts come from times agreed over ranks (their
    maximum), so all ranks run the same number of collectives: warm-ups within a quarter of the budget,
    timed ops within the rest, at least one of each when asked for any.
    """
    failure = None
    started = time.perf_counter()
    try:
        run_once()
        fabric.synchronize()
    except (RuntimeError, NotImplementedError, ValueError) as error:  # unsupported here: the same on all ranks
        failure = f"{type(error).__name__}: {(str(error).strip().splitlines() or [''])[0]}"
    failed, first_s = fabric.per_rank([1.0 if failure else 0.0, time.perf_counter() - started]).max(dim=0).values
    if failed:
        return f"{fabric.backend} cannot run it here ({failure or 'it failed on another rank'})"
    warmups = min(warmup, max(1, int(0.25 * budget_s / max(float(first_s), 1e-9)))) if warmup else 0
    warm_s = _timed_loop(fabric, run_once, warmups) if warmups else float(first_s)
    estimate_s = float(fabric.per_rank([warm_s])[:, 0].max())
    timed = min(iterations, max(1, int(0.75 * budget_s / max(estimate_s, 1e-9))))
    fabric.barrier()
    return _timed_loop(fabric, run_once, timed), timed


def _timed_loop(fabric: _Fabric, run_once: Callable[[], None], ops: int) -> float:
    """Seconds per op over `ops` back-to-back ops: a device synchronisation at the end of the loop only."""
    started = time.perf_counter()
    for _ in range(ops):
        run_once()
    fabric.synchronize()
    return (time.perf_counter() - started) / ops


# ------------------------------------------------------------------------------------ matmul
def matmul_tflops(device: torch.device, budget_s: float, rounds: int = MATMUL_ROUNDS) -> tuple[float, int, torch.dtype]:
    """(TFLOP/s, n, dtype) of back-to-back n x n matmuls on `device` for about `budget_s`: bf16 n=8192 on CUDA
    (tensor cores, the training dtype), fp32 n=512 on CPU; 2 n^3 FLOPs each. The best of `rounds` rounds:
    another process taking the device for a moment only ever slows a round, while a slow GPU (clocks,
    power, thermals) is slow in every round.

    On CUDA the clock is the wall clock with a synchronisation per batch. On CPU it is the process's CPU
    time: the CPU path serves tests and demos on machines whose cores other processes share, and CPU time
    measures the cores' speed without the time the scheduler gave to others.
    """
    import torch

    n, dtype_name = MATMUL_SIZE["cuda" if device.type == "cuda" else "cpu"]
    dtype = getattr(torch, dtype_name)
    repeats = _test_slowdown()
    first, second = (torch.randn(n, n, device=device).to(dtype) for _ in range(2))
    product = torch.empty(n, n, dtype=dtype, device=device)
    clock = time.perf_counter if device.type == "cuda" else time.process_time

    def synchronize() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def one_round(round_budget_s: float) -> float:
        """Matmuls per second, in batches that grow while the budget lasts: one synchronisation per batch."""
        done, batch, started = 0, 1, clock()
        while True:
            for _ in range(batch * repeats):  # a rank made slow on purpose (tests) repeats each, counts it once
                torch.mm(first, second, out=product)
            synchronize()
            done += batch
            elapsed_s = clock() - started
            if elapsed_s >= round_budget_s:
                return done / elapsed_s
            batch = max(1, min(2 * done, int((round_budget_s - elapsed_s) / (elapsed_s / done))))

    torch.mm(first, second, out=product)  # warm-up: library handles, kernel choice
    synchronize()
    best_per_s = max(one_round(budget_s / rounds) for _ in range(rounds))
    return 2 * n**3 * best_per_s / 1e12, n, dtype


def _test_slowdown() -> int:
    text = os.environ.get(ENV_TEST_SLOWDOWN, "1")
    slowdown = whole_number(text)
    if slowdown is None or slowdown < 1:
        raise ValueError(f"{ENV_TEST_SLOWDOWN}={text!r} must be a whole number >= 1 (it is for tests; unset it)")
    return slowdown


def _matmul_section(fabric: _Fabric, budget_s: float) -> dict[str, Any]:
    tflops, n, dtype = matmul_tflops(fabric.device, budget_s)
    per_rank = fabric.per_rank([tflops])[:, 0].tolist()
    return {"per_rank": per_rank, "median": statistics.median(per_rank), "min": min(per_rank),
            "max": max(per_rank), "dtype": str(dtype).removeprefix("torch."), "n": n, "budget_s": budget_s,
            "rounds": MATMUL_ROUNDS}


def _require_positive_int(name: str, value: Any, allow_zero: bool = False) -> None:
    if not is_int(value) or value < (0 if allow_zero else 1):
        raise ValueError(f"{name} must be a whole number {'>= 0' if allow_zero else '>= 1'}, got {value!r}")

