"""NCCL at world size 1, through the code path of many ranks (run by test_nccl.py in its own process,
so that no process group outlives it). Prints one JSON line: what each part found.

1. nemo_throughput.aggregation.Exchange over dist.init_process_group("nccl", world_size=1): the
   pinned-memory all-gather of log steps (called directly: ``start`` sends a world of one nothing)
   and the final exchange on its gloo group.
2. A Lightning fit with DDPStrategy(process_group_backend="nccl") on one GPU and ThroughputCallback,
   its per-step hooks under set_sync_debug_mode("error") on non-log steps.
"""

import json
import math
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from nemo_throughput.aggregation import Exchange, steps_tensor
from nemo_throughput.run_stats import COLUMNS
from nemo_throughput.timing import StepTimes

sys.path.insert(0, str(Path(__file__).parent.parent))  # tests/, for the gpu package
from gpu.workloads import SyncGuard, fit, lightning_namespace  # noqa: E402


def step_times(first: int, count: int) -> list[StepTimes]:
    return [StepTimes(step=s, step_s=0.1 + s / 1000, data_s=0.01, forward_s=0.04, backward_s=None, optimizer_s=0.02)
            for s in range(first, first + count)]


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and all(x == y or (math.isnan(x) and math.isnan(y))
                                      for x, y in zip(a.flatten().tolist(), b.flatten().tolist(), strict=True))


def steps_of(gathered) -> torch.Tensor:
    """Gathered.wait()'s steps: ``[ranks, steps, COLUMNS]`` (alone, or first beside the extras)."""
    return gathered[0] if isinstance(gathered, tuple) else gathered


def exchange_host_us(exchange: Exchange, steps: list[StepTimes], rounds: int = 200) -> dict:
    """Host µs of one log step's exchange (started, then the previous one received), the NCCL round
    against a world of one's local path: recorded for the docs, asserted nowhere (timing is the
    benchmark's business)."""
    import time

    found = {}
    for name, start in (("nccl_round", lambda: exchange._start_nccl(exchange._payload(steps, None))),
                        ("world_of_one", lambda: exchange.start(steps))):
        previous = start()
        begin = time.perf_counter()
        for _ in range(rounds):
            started = start()
            previous.received()
            previous = started
        found[name] = (time.perf_counter() - begin) / rounds * 1e6
        previous.received()
    return found


def exchange_part(port: int) -> dict:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1)
    try:
        exchange = Exchange()
        first, second, pending = step_times(1, 10), step_times(11, 10), step_times(21, 3)
        alone = exchange.start(first).wait()[0]  # a world of one: no collective
        started = exchange._start_nccl(exchange._payload(first, None))  # the path of many ranks
        later = exchange._start_nccl(exchange._payload(second, None))  # started before the previous is read
        exchange._sent.extend([first, second])  # what start() keeps for the final exchange
        got_first, got_second = steps_of(started.wait()), steps_of(later.wait())
        final = exchange.finish(pending, absorbed_through=10)
        return {
            "host_us_per_log_step_exchange": exchange_host_us(exchange, second),
            "backend": dist.get_backend(), "nccl": exchange.nccl, "world_size": exchange.world_size,
            "first_interval_equal": same(got_first, steps_tensor([first]).reshape(1, 10, len(COLUMNS))),
            "second_interval_equal": same(got_second, steps_tensor([second]).reshape(1, 10, len(COLUMNS))),
            "result_pinned": got_first.is_pinned(),
            "alone_equal": same(alone, steps_tensor([first]).reshape(1, 10, len(COLUMNS))),
            "final_steps": final.steps[0, :, 0].tolist() if final.steps is not None else None,
            "final_missing": final.missing,
        }
    finally:
        dist.destroy_process_group()


def lightning_part(out: Path) -> dict:
    import importlib

    from nemo_throughput import ThroughputCallback

    strategies = importlib.import_module(f"{lightning_namespace()}.strategies")
    os.environ.pop("MASTER_PORT", None)  # Lightning picks a free one
    ours = ThroughputCallback(log_every_n_steps=5, warmup_steps=2, output_dir=str(out / "throughput"))
    guard = SyncGuard(ours)
    fit(out, [ours], 20, strategy=strategies.DDPStrategy(process_group_backend="nccl"))
    summary = json.loads(Path(ours.summary_path).read_text())
    return {"status": summary["status"], "last_step": summary["timing"]["last_step"],
            "steps_measured": summary["timing"]["steps_measured"], "num_gpus": summary["hardware"]["num_gpus"],
            "exchange_was_nccl": ours.measurement._exchange.nccl, "guarded_calls": guard.guarded_calls,
            "syncs_by_log_step": guard.syncs_by_log_step, "mfu": summary["throughput"]["mfu"]}


if __name__ == "__main__":
    port, out = int(sys.argv[1]), Path(sys.argv[2])
    result = {"exchange": exchange_part(port)}
    result["lightning"] = lightning_part(out)
    print(json.dumps(result))
