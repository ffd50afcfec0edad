"""Two ranks over gloo: a real Lightning DDP run with one rank made slower, and the final
exchange that must end in bounded time whatever the other ranks do."""

import json
import os
import time

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

from conftest import free_port, read_json, run_train_tiny
from nemo_throughput.aggregation import ENV_FINAL_EXCHANGE_TIMEOUT_S, Exchange, step_times
from nemo_throughput.timing import StepTimes

pytestmark = pytest.mark.slow

SLOW_S = 0.15


def test_a_slow_rank_is_named_and_the_global_step_time_follows_it(tmp_path):
    proc = run_train_tiny("--output-dir", tmp_path, "--devices", 2, "--steps", 16, "--log-every", 4,
                          "--warmup", 2, "--slow-rank", 1, "--slow-s", SLOW_S, "--per-step-jsonl",
                          "--profile-steps", 6, 8, "--trace-rank", 0, "--probe")
    output, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, output
    summary = read_json(tmp_path / "summary.json")
    timing = summary["timing"]

    assert summary["status"] == "completed" and summary["hardware"]["num_gpus"] == 2
    assert summary["parallel"]["data"] == 2
    (node,) = summary["environment"]["nodes"]  # both ranks on this host, recorded once
    assert node["ranks"] == [0, 1]
    assert timing["steps_measured"] == 14 - 3  # after warm-up, without the profiled steps 6-8
    # Rank 1 spends SLOW_S more before its gradient all-reduce; rank 0 waits for it inside the step.
    assert timing["slowest_rank"] == 1 and timing["straggler"]["metric"] == "local_time_s"
    local = timing["per_rank_local_time_s"]
    assert local[1] - local[0] >= 0.8 * SLOW_S
    # so every rank's step, and the global step time, carries the slow rank's delay
    assert timing["step_time_s"]["min"] >= SLOW_S
    assert min(timing["per_rank_step_time_s"]) >= SLOW_S
    assert summary["throughput"]["tokens_per_s"] == pytest.approx(
        summary["batch"]["tokens_per_step"] / timing["step_time_s"]["mean"])
    # the live log line on rank 0 names it too
    assert "slowest rank 1" in output
    # where it ran, the spread over ranks, and how long the other rank waits for it per step
    straggler = timing["straggler"]
    assert (straggler["host"], straggler["gpu_index"]) == (node["name"], None)
    assert straggler["spread_s"] == pytest.approx({"min": local[0], "median": (local[0] + local[1]) / 2,
                                                   "max": local[1]})
    assert straggler["others_wait_s"] == pytest.approx(local[1] - (local[0] + local[1]) / 2)

    # The profiled window: rank 0 spends the slow rank's delay blocked in the gradient all-reduce
    # (exposed communication), rank 1 its own sleep (idle, not compute: no op runs).
    communication = summary["communication"]
    assert communication["window"] == {"first_step": 6, "last_step": 8, "mode": "torch", "steps": 3}
    waiting, slow = communication["per_rank"]
    assert (waiting["rank"], slow["rank"]) == (0, 1) and waiting["host"] == node["name"]
    assert waiting["exposed_communication_s"] > slow["exposed_communication_s"]
    assert slow["idle_s"] > waiting["idle_s"] and slow["idle_s"] > slow["compute_s"]
    for part in (waiting, slow):
        assert part["compute_s"] + part["exposed_communication_s"] + part["idle_s"] == pytest.approx(part["window_s"])
    assert communication["traces"] == ["traces/rank0.json"]
    assert (tmp_path / "traces" / "rank0.json").stat().st_size > 0 and not (tmp_path / "traces" / "rank1.json").exists()
    assert "steps 4-7 (2 profiled steps not counted)" in output
    assert "steps 1-3 (2 warm-up steps not counted)" in output
    assert summary["network"]["backend"] == "gloo" and summary["network"]["label"] is None
    assert summary["telemetry"] is None  # no memory statistics, no NVML on a CPU
    # the start-up probe ran over the same gloo group, before the first step
    probe = summary["probe"]
    assert probe["world_size"] == 2 and probe["backend"] == "gloo"
    assert {row["op"] for row in probe["collectives"]} >= {"all_reduce", "all_gather", "sendrecv"}
    assert all(row["busbw_gbps"] > 0 for row in probe["collectives"])

    # steps.jsonl: both ranks' phases for every step; the global time is the larger of the two
    steps = [json.loads(line) for line in open(tmp_path / "steps.jsonl")]
    assert [s["step"] for s in steps] == list(range(1, 17))
    assert [s["step"] for s in steps if s["profiled"]] == [6, 7, 8]
    for s in steps:
        assert len(s["ranks"]) == 2
        assert s["step_time_s"] == max(r["step_s"] for r in s["ranks"])


# ----------------------------------------------------------------------------- the final exchange
ABSENT_S = 60  # how long an absent rank stays alive without taking part


def made_steps(first, last, rank):
    return [StepTimes(n, 1.0 + rank + n / 100, data_s=0.1, forward_s=0.2, backward_s=0.3, optimizer_s=0.4)
            for n in range(first, last + 1)]


def _final_exchange_worker(rank, port, scenario, results):
    os.environ[ENV_FINAL_EXCHANGE_TIMEOUT_S] = "2"
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    exchange = Exchange(extras_width=1)
    exchange.start(made_steps(1, 2, rank)).wait()  # absorbed by both ranks
    in_flight = exchange.start(made_steps(3, 4, rank))  # in flight: never read (a rank may be gone)
    # Rank 1 finished one step more; with "skewed" it also absorbed steps 3-4 (rank 0 had not yet).
    pending, absorbed_through = (made_steps(5, 5, rank), 2) if rank == 0 else (made_steps(5, 6, rank), 2)
    if scenario == "skewed" and rank == 1:
        absorbed_through = 4
    if scenario == "absent" and rank == 1:
        time.sleep(ABSENT_S)  # alive but never reaching the final exchange (hung elsewhere)
        return
    started = time.monotonic()
    final = exchange.finish(pending, absorbed_through, extras=[10.0 + rank])
    results[rank] = {
        "seconds": time.monotonic() - started,
        "missing": final.missing,
        "extras": None if final.extras is None else final.extras.flatten().tolist(),
        "steps": None if final.steps is None else [step_times(final.steps, r) for r in range(2)],
        # What the process's exit finds: a gloo work still pending aborts it; the final group is ended.
        "settled": in_flight.settle(5.0),
        "groups": len(dist.distributed_c10d._world.pg_map),
    }


def run_final_exchange(scenario):
    results = mp.Manager().dict()
    context = mp.start_processes(_final_exchange_worker, args=(free_port(), scenario, results), nprocs=2,
                                 join=False, start_method="spawn")
    deadline = time.monotonic() + 120
    while 0 not in results and time.monotonic() < deadline:
        time.sleep(0.1)
    for process in context.processes:
        process.kill() if scenario == "absent" else process.join(60)
    return dict(results)


def test_the_final_exchange_takes_every_step_all_ranks_finished_including_the_one_in_flight():
    results = run_final_exchange("complete")
    for rank in (0, 1):
        assert results[rank]["missing"] is None
        assert results[rank]["steps"] == [made_steps(3, 5, 0), made_steps(3, 5, 1)]  # step 6: not finished by rank 0
        assert results[rank]["extras"] == [10.0, 11.0]  # each rank's final per-rank values
        assert results[rank]["settled"] and results[rank]["groups"] == 1  # the default group alone


def test_the_final_exchange_sends_again_what_a_lagging_rank_did_not_absorb():
    results = run_final_exchange("skewed")
    assert results[0]["steps"] == [made_steps(3, 5, 0), made_steps(3, 5, 1)]
    assert results[1]["steps"] == [made_steps(5, 5, 0), made_steps(5, 5, 1)]  # it had 3-4 already
    assert results[0]["missing"] is results[1]["missing"] is None


def test_the_final_exchange_gives_up_after_its_timeout_and_says_what_is_missing():
    results = run_final_exchange("absent")
    assert 1 not in results
    assert results[0]["steps"] is None and results[0]["extras"] is None
    assert results[0]["seconds"] < ABSENT_S  # it did not wait for the absent rank
    assert results[0]["missing"].startswith("steps after 2:")
    assert "2 s" in results[0]["missing"]


@pytest.mark.parametrize("value", ["ten", "-1", "inf", "1e15"])  # 1e15 s overflowed gloo's timeout on two ranks
def test_a_final_exchange_timeout_that_is_not_a_positive_number_up_to_a_day_is_refused(monkeypatch, value):
    monkeypatch.setenv(ENV_FINAL_EXCHANGE_TIMEOUT_S, value)
    with pytest.raises(ValueError, match=f"{ENV_FINAL_EXCHANGE_TIMEOUT_S}='{value}'.*seconds greater than 0, at "
                                         "most 86400"):
        Exchange()
