"""`nemo-throughput bench --ranks 2,4,8`: the host cost of a log step against the number of ranks
and the number of steps done, on CPU processes over gloo.

Each rank drives the framework-free :class:`~nemo_throughput.run.measurement.Measurement` through the
events a framework would send (step start, backward, optimizer, step end), with one small
all-reduce per step on the default group standing in for the gradient all-reduce (it lines the
ranks up, as in data-parallel training), and times the step-end event on the training thread:
wall clock and this thread's CPU time. Steps are run quickly up to each point of ``steps_done``
(the statistics, the summary and steps.jsonl grow as in a long run), then ``samples`` log steps
are timed there, with a short host pause per step so that the reporting thread runs as it would
beside real steps.

On a shared 2-CPU machine the wall figures swing by 2-4x from run to run (other processes take
the CPUs); compare the thread's CPU time, and runs made back to back. A log step there costs
about 0.4-0.5 ms of CPU at 2 to 8 ranks, flat from 100 to 10,000 steps done, and an ordinary
step 16-30 us.
"""

from __future__ import annotations

import logging
import os
import socket
import statistics
import tempfile
import time
from typing import Any

DEFAULT_STEPS_DONE = (100, 1_000, 10_000)
LOG_EVERY_N_STEPS = 10
SAMPLES = 30  # log steps timed at each point


def parse_counts(option: str, text: str, example: str) -> tuple[int, ...]:
    """``--ranks 2,4,8``, ``--steps-done 100,1000``: whole numbers of at least 1, each once, in order."""
    try:
        counts = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise ValueError(f"{option} {text!r}: expected comma-separated whole numbers, e.g. {example}") from None
    if any(n < 1 for n in counts) or len(set(counts)) != len(counts):
        raise ValueError(f"{option} {text!r}: each number must be at least 1 and given once")
    return tuple(sorted(counts))


def run_log_step_bench(ranks: tuple[int, ...], steps_done: tuple[int, ...] = DEFAULT_STEPS_DONE,
                       samples: int = SAMPLES, step_pause_s: float = 0.002, progress: Any = print) -> dict[str, Any]:
    import torch.multiprocessing as mp

    results = []
    for world_size in ranks:
        progress(f"log-step cost: {world_size} gloo rank{'s' if world_size > 1 else ''}")
        with mp.Manager() as manager:
            shared = manager.dict()
            mp.spawn(_rank_main, args=(world_size, _free_port(), steps_done, samples, step_pause_s, shared),
                     nprocs=world_size, join=True)
            rank0 = dict(shared)
        results.append({"ranks": world_size, **rank0})
    return {"log_every_n_steps": LOG_EVERY_N_STEPS, "samples": samples, "step_pause_s": step_pause_s,
            "steps_done": list(steps_done), "cpus": os.cpu_count(), "results": results}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, world_size: int, port: int, steps_done: tuple[int, ...], samples: int,
               step_pause_s: float, shared: Any) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    logging.getLogger("nemo_throughput").setLevel(logging.ERROR)  # no live lines from every rank
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    try:
        with tempfile.TemporaryDirectory() as out:
            measured = _drive(rank, world_size, out, steps_done, samples, step_pause_s)
        if rank == 0:
            shared.update(measured)
    finally:
        dist.destroy_process_group()


def _drive(rank: int, world_size: int, out: str, steps_done: tuple[int, ...], samples: int,
           step_pause_s: float) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from nemo_throughput.config import ThroughputConfig
    from nemo_throughput.run.measurement import Measurement
    from nemo_throughput.run_facts import resolve_run_facts

    config = ThroughputConfig.from_mapping({"log_every_n_steps": LOG_EVERY_N_STEPS, "warmup_steps": 10,
                                            "output_dir": out, "per_step_jsonl": True})
    device = torch.device("cpu")
    spec = {"num_layers": 2, "hidden_size": 128, "num_attention_heads": 4, "seq_length": 128, "vocab_size": 2048,
            "ffn_hidden_size": 512}

    def describe(records: list[dict[str, Any]]) -> Any:
        return resolve_run_facts(config, spec_fields=spec, source=None, parallel={}, global_batch_size=8 * world_size,
                                 micro_batch_size=8, batches_per_step=1, world_size=world_size, num_nodes=1,
                                 device=device, framework_dtype="fp32", rank_records=records)

    measurement = Measurement(config)
    measurement.set_up(describe, device, rank, default_dir=out, loggers=lambda: [])
    measurement.train_start(0, world_size)
    gradients = torch.zeros(1024)
    step, by_point = 0, {}
    for point in steps_done:
        while step < point:  # fast, untimed: the run grows to this point
            step += 1
            _one_step(measurement, step, gradients, dist)
        measurement._reporter.drain(raise_error=True)  # the timed steps start with the reporting thread idle
        log_wall, log_cpu, other_wall, other_cpu = [], [], [], []
        while len(log_wall) < samples:
            step += 1
            time.sleep(step_pause_s)
            wall_ns, cpu_ns = _one_step(measurement, step, gradients, dist)
            is_log = step % LOG_EVERY_N_STEPS == 0
            (log_wall if is_log else other_wall).append(wall_ns / 1e3)
            (log_cpu if is_log else other_cpu).append(cpu_ns / 1e3)
        by_point[str(point)] = {"log_step_us": statistics.median(log_wall),
                                "log_step_cpu_us": statistics.median(log_cpu),
                                "non_log_step_us": statistics.median(other_wall),
                                "non_log_step_cpu_us": statistics.median(other_cpu)}
    measurement.train_end(step)
    return {"steps": step, "by_steps_done": by_point}


def _one_step(measurement: Any, step: int, gradients: Any, dist: Any) -> tuple[int, int]:
    """The events of one step; returns the wall and CPU nanoseconds of all our hooks of it."""
    wall, cpu = time.perf_counter_ns, time.thread_time_ns
    w0, c0 = wall(), cpu()
    measurement.step_start()
    measurement.before_backward()
    w1, c1 = wall(), cpu()
    dist.all_reduce(gradients)  # the harness's stand-in for the gradient all-reduce: not ours, not timed
    w2, c2 = wall(), cpu()
    measurement.before_optimizer()
    measurement.step_end(step)
    w3, c3 = wall(), cpu()
    return (w1 - w0) + (w3 - w2), (c1 - c0) + (c3 - c2)


def render_log_step(result: dict[str, Any]) -> str:
    points = result["steps_done"]
    header = ["ranks", *(f"log step @{p:,}" for p in points), "non-log step", "log/non-log (CPU)"]
    rows = []
    for r in result["results"]:
        cells = [str(r["ranks"])]
        for p in points:
            at = r["by_steps_done"][str(p)]
            cells.append(f"{at['log_step_us']:.0f} µs (cpu {at['log_step_cpu_us']:.0f})")
        last = r["by_steps_done"][str(points[-1])]
        cells.append(f"{last['non_log_step_us']:.1f} µs (cpu {last['non_log_step_cpu_us']:.1f})")
        cells.append(f"{last['log_step_cpu_us'] / max(last['non_log_step_cpu_us'], 1e-9):.0f}x")
        rows.append(cells)
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = [f"nemo-throughput bench --ranks: host time of our hooks per step on the training thread (median of "
             f"{result['samples']} log steps per point; wall, and the thread's CPU time), log_every_n_steps="
             f"{result['log_every_n_steps']}, gloo on {result['cpus']} CPUs", ""]
    lines += ["  ".join(cell.rjust(widths[i]) for i, cell in enumerate(row)) for row in [header, *rows]]
    return "\n".join(lines) + "\n"
