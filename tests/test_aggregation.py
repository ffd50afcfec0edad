"""Cross-rank statistics, and the all-gather over a real two-process gloo group."""

import math

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from conftest import free_port
from nemo_throughput.aggregation import Exchange, step_times, steps_tensor
from nemo_throughput.run_stats import RunStats, SortedValues
from nemo_throughput.timing import StepTimes


def rank_steps(first, step_times, local=None):
    return [StepTimes(first + i, t, data_s=None if local is None else 0.0,
                      forward_s=None if local is None else local[i]) for i, t in enumerate(step_times)]


def test_global_step_time_is_the_slowest_rank_per_step_and_warmup_is_left_out():
    stats = RunStats(world_size=2, warmup_steps=2)
    interval = stats.add(steps_tensor([
        rank_steps(1, [9.0, 9.0, 1.0, 2.0, 1.0, 1.0], local=[1, 1, 0.2, 0.2, 0.2, 0.2]),
        rank_steps(1, [9.0, 9.0, 1.5, 1.0, 1.0, 4.0], local=[1, 1, 0.5, 0.5, 0.5, 0.5]),
    ]))
    # steps 3-6 (1-2 were warm-up); the slowest rank's times are 1.5, 2.0, 1.0, 4.0
    assert stats.steps_measured == 4
    summary = stats.step_time_summary()
    assert summary["mean"] == pytest.approx(2.125) == stats.mean_step_time_s()
    assert summary["median"] == pytest.approx(1.75)
    assert (summary["min"], summary["max"]) == (1.0, 4.0)
    assert summary["p90"] == pytest.approx(3.4)  # between 2.0 and 4.0, 70 % of the way
    assert summary["std"] == pytest.approx(1.3149778, rel=1e-6)  # sample standard deviation
    assert stats.per_rank_step_time_s() == pytest.approx([1.25, 1.875])
    assert stats.per_rank_phase_s("local_s") == pytest.approx([0.2, 0.5])
    assert stats.per_rank_phase_s("data_s") == pytest.approx([0.0, 0.0])
    assert stats.per_rank_phase_s("backward_s") is None  # not observed
    straggler = stats.straggler()
    assert straggler["rank"] == 1 and straggler["metric"] == "local_time_s"
    assert straggler["excess_pct"] == pytest.approx(100 * (0.5 / 0.35 - 1))
    assert straggler["spread_s"] == pytest.approx({"min": 0.2, "median": 0.35, "max": 0.5})
    assert straggler["others_wait_s"] == pytest.approx(0.5 - 0.35)  # the median rank's wait for rank 1
    assert (interval.first_step, interval.last_step, interval.slowest_rank) == (1, 6, 1)
    # the live figures are the counted steps' too: the warm-up steps' 9 s are in neither
    assert interval.step_time_s == pytest.approx(2.125) and interval.max_step_time_s == 4.0
    assert not interval.warmup and (interval.left_out, interval.left_out_reasons) == (2, ("warm-up",))


def test_statistics_accumulate_over_intervals_as_over_one():
    times = [0.5 + (i * 7919 % 13) / 100 for i in range(200)]
    whole = RunStats(world_size=1, warmup_steps=0)
    whole.add(steps_tensor([rank_steps(1, times)]))
    pieces = RunStats(world_size=1, warmup_steps=0)
    for start in range(0, 200, 10):
        pieces.add(steps_tensor([rank_steps(start + 1, times[start:start + 10])]))
    assert pieces.step_time_summary() == pytest.approx(whole.step_time_summary())
    assert pieces.per_rank_step_time_s() == pytest.approx(whole.per_rank_step_time_s())


def test_without_phases_the_straggler_is_the_rank_with_the_longest_steps():
    stats = RunStats(world_size=3, warmup_steps=0)
    stats.add(steps_tensor([rank_steps(1, [1.0, 1.0]), rank_steps(1, [1.0, 1.2]), rank_steps(1, [3.0, 1.0])]))
    assert stats.per_rank_phase_s("local_s") is None
    assert stats.straggler() == {"rank": 2, "metric": "step_time_s", "excess_pct": pytest.approx(81.818181),
                                 "spread_s": pytest.approx({"min": 1.0, "median": 1.1, "max": 2.0}),
                                 "others_wait_s": None}  # step times cannot tell a wait


def test_profiled_steps_are_reported_but_left_out_of_the_statistics():
    stats = RunStats(world_size=1, warmup_steps=1, excluded=(3, 4))
    first = stats.add(steps_tensor([rank_steps(1, [9.0, 1.0])]))
    window = stats.add(steps_tensor([rank_steps(3, [7.0, 8.0, 2.0])]))
    assert not first.profiled and window.profiled
    assert window.step_time_s == window.max_step_time_s == 2.0  # step 5 alone is counted
    assert (window.left_out, window.left_out_reasons) == (2, ("profiled",))
    only_profiled = RunStats(world_size=1, warmup_steps=0, excluded=(1, 2)).add(
        steps_tensor([rank_steps(1, [7.0, 8.0])]))
    assert only_profiled.step_time_s == 7.5 and only_profiled.left_out == 2  # nothing counted: all its steps
    assert stats.steps_measured == 2 and stats.mean_step_time_s() == pytest.approx(1.5)  # steps 2 and 5
    assert stats.per_rank_step_time_s() == pytest.approx([1.5])


def test_warmup_counts_from_the_step_the_run_started_at():
    stats = RunStats(world_size=1, warmup_steps=2, start_step=100)  # resumed from a checkpoint
    interval = stats.add(steps_tensor([rank_steps(101, [5.0, 5.0, 1.0])]))
    assert stats.steps_measured == 1 and stats.mean_step_time_s() == 1.0 and not interval.warmup
    assert stats.add(steps_tensor([[]])) is None


def test_no_measured_steps_gives_empty_statistics():
    stats = RunStats(world_size=2, warmup_steps=10)
    assert stats.add(steps_tensor([rank_steps(1, [1.0]), rank_steps(1, [1.0])])).warmup
    assert stats.step_time_summary() is None and stats.straggler() is None and stats.mean_step_time_s() is None


def test_ranks_disagreeing_on_steps_is_an_error():
    stats = RunStats(world_size=2, warmup_steps=0)
    with pytest.raises(RuntimeError, match=r"Rank 1 reported steps \[2, 3\] but rank 0 reported \[1, 2\]"):
        stats.add(steps_tensor([rank_steps(1, [1.0, 1.0]), rank_steps(2, [1.0, 1.0])]))


def test_exchange_without_torch_distributed_returns_the_local_steps():
    steps = rank_steps(5, [0.5, 0.25], local=[0.1, 0.2])
    gathered, extras = Exchange(extras_width=2).start(steps, [3.0, math.nan]).wait()
    assert step_times(gathered, 0) == steps
    assert extras.shape == (1, 2) and extras[0, 0] == 3.0 and extras[0, 1].isnan()
    with pytest.raises(ValueError, match="Expected 2 per-rank values, got 1"):
        Exchange(extras_width=2).start(steps, [1.0])


def test_a_world_of_one_hands_its_steps_to_the_reporting_thread_unbuilt():
    """The log step hands the reporting thread a call; the tensors are built where it is made,
    on that thread, and hold what the log step sent."""
    import threading

    steps = rank_steps(5, [0.5, 0.25], local=[0.1, 0.2])
    handed = Exchange(extras_width=1).start(steps, [3.0]).received()
    built = {}
    worker = threading.Thread(target=lambda: built.update(result=handed(), thread=threading.current_thread()))
    worker.start()
    worker.join()
    gathered, extras = built["result"]
    assert built["thread"] is worker and step_times(gathered, 0) == steps and extras.tolist() == [[3.0]]


def _gloo_worker(rank: int, world_size: int, port: int, results) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    try:
        exchange = Exchange(extras_width=1)
        first = exchange.start(rank_steps(1, [1.0 + rank, 2.0 + rank], local=[rank, rank]), [100.0 + rank])
        second = exchange.start(rank_steps(3, [10.0 * (rank + 1)]))  # started before the first is read
        (first_steps, first_extras), (second_steps, second_extras) = first.wait(), second.wait()
        results[rank] = [[step_times(m, r) for r in range(world_size)] for m in (first_steps, second_steps)]
        results[f"extras{rank}"] = (first_extras.tolist(), second_extras.isnan().all().item())
    finally:
        dist.destroy_process_group()


def test_exchange_all_gathers_every_ranks_steps_over_gloo():
    port = free_port()
    manager = mp.Manager()
    results = manager.dict()
    mp.spawn(_gloo_worker, args=(2, port, results), nprocs=2, join=True)
    for rank in (0, 1):
        first, second = results[rank]
        assert first == [rank_steps(1, [1.0, 2.0], local=[0, 0]), rank_steps(1, [2.0, 3.0], local=[1, 1])]
        assert second == [rank_steps(3, [10.0]), rank_steps(3, [20.0])]
        assert results[f"extras{rank}"] == ([[100.0], [101.0]], True)  # every rank's, in rank order; NaN if none


def test_a_world_of_one_rank_exchanges_with_no_one(tmp_path):
    """One rank under a process group (one GPU under NeMo's strategy): its log steps start no
    collective, the final exchange neither; what comes back is its own steps. The profiler's
    record of a collective is the witness, shown to see one in the same group."""
    from torch.profiler import ProfilerActivity, profile

    def collectives(trace) -> list[str]:
        return [event.name for event in trace.events() if "all_gather" in event.name or "allgather" in event.name]

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        exchange = Exchange(extras_width=1)
        steps, later = rank_steps(1, [1.0, 2.0], local=[0.5, 0.5]), rank_steps(3, [3.0])
        with profile(activities=[ProfilerActivity.CPU]) as trace:
            gathered, extras = exchange.start(steps, [7.0]).wait()
            final = exchange.finish(later, absorbed_through=2)
        assert collectives(trace) == []
        assert step_times(gathered, 0) == steps and extras.tolist() == [[7.0]]
        assert step_times(final.steps, 0) == later and final.missing is None
        with profile(activities=[ProfilerActivity.CPU]) as control:
            dist.all_gather([torch.empty(2, dtype=torch.float64)], torch.zeros(2, dtype=torch.float64))
        assert collectives(control)  # the witness sees a collective where there is one
    finally:
        dist.destroy_process_group()


def test_a_long_run_on_many_ranks_accumulates_correctly():
    """20,000 steps on 64 ranks, then one ordinary 10-step interval (the cost per interval is the
    benchmark's business: nemo-throughput bench)."""
    stats = RunStats(world_size=64, warmup_steps=0)
    interval = steps_tensor([rank_steps(1, [1.0] * 10, local=[0.5] * 10) for _ in range(64)])

    for first in range(1, 20_001, 10_000):  # 20,000 steps in large chunks
        chunk = torch.cat([interval[:, :1, :]] * 10_000, dim=1).clone()
        chunk[:, :, 0] = torch.arange(first, first + 10_000, dtype=torch.float64)
        stats.add(chunk)
    stats.add(torch.cat([interval[:, :, :1] + 20_000, interval[:, :, 1:]], dim=2))  # steps 20,001-20,010
    assert stats.steps_measured == 20_010
    assert stats.step_time_summary()["median"] == 1.0


def test_sorted_values_keep_order_across_chunk_splits(monkeypatch):
    monkeypatch.setattr(SortedValues, "CHUNK", 3)  # many splits from few values
    values = [(i * 7919 % 1009) / 7 for i in range(2000)] + [5.0] * 50  # ties too
    ordered = SortedValues()
    for value in values:
        ordered.add(value)
    assert len(ordered) == len(values) and [ordered[i] for i in range(len(values))] == sorted(values)
    with pytest.raises(IndexError):
        ordered[len(values)]
    stats = RunStats(world_size=1, warmup_steps=0)
    stats.add(steps_tensor([rank_steps(1, values)]))
    assert stats.step_time_summary()["median"] == pytest.approx(sorted(values)[len(values) // 2 - 1] / 2
                                                                 + sorted(values)[len(values) // 2] / 2)


def test_outlier_steps_are_over_three_medians_and_a_second_over_it_and_name_their_phase(monkeypatch):
    """A step of 23 s among 0.7 s ones (a profiler export in another callback's hook): named, with the
    phase that held it; a step 3.5 x the median but under a second over it is not an outlier."""
    monkeypatch.setattr(SortedValues, "CHUNK", 4)  # counting above the threshold across chunks
    stats = RunStats(world_size=2, warmup_steps=0)
    times = [0.7] * 40
    times[19], times[29], times[9] = 23.0, 2.45, 9.0  # 2.45 s: 3.5 x the median, 1.75 s over it
    fast = [StepTimes(i + 1, t, data_s=0.1, forward_s=0.2, backward_s=0.3, optimizer_s=0.1) for i, t in enumerate(times)]
    # rank 1 waits for data in the long steps; rank 0 waits for it in the gradient all-reduce (backward)
    slow = [s._replace(data_s=s.step_s - 0.6) for s in fast]
    fast = [s._replace(backward_s=s.step_s - 0.8) for s in fast]
    stats.add(steps_tensor([fast, slow]))
    count, steps = stats.outliers()
    assert count == 3 and [s["step"] for s in steps] == [20, 10, 30]
    assert steps[0] == {"step": 20, "step_time_s": 23.0, "phase": "data"}

    small = RunStats(world_size=1, warmup_steps=0)
    small.add(steps_tensor([rank_steps(1, [0.1] * 20 + [0.35, 0.9])]))  # 3.5 x and 9 x, both under a second over
    assert small.outliers() == (0, [])
    assert RunStats(world_size=1, warmup_steps=0).outliers() == (0, [])

    many = RunStats(world_size=1, warmup_steps=0)
    many.add(steps_tensor([rank_steps(1, [1.0] * 100 + [10.0 + i for i in range(30)])]))
    count, steps = many.outliers()
    assert count == 30 and len(steps) == 10 and steps[0]["step_time_s"] == 39.0 and steps[0]["phase"] is None
