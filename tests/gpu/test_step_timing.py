"""Step times from CUDA events (StepTimer + CudaClock) against a synchronized host clock, on steps of
known, varied length: 5 ms to 500 ms of bf16 matrix products, every 8th step a slow one."""

import statistics
import time

import torch

from nemo_throughput.timing import BACKWARD, OPTIMIZER, START, CudaClock, StepTimer

from .workloads import MatmulWork

STEPS, LOG_EVERY, SLOW_EVERY, SLOW_MS = 40, 10, 8, 500
BASE_MS = (5, 10, 25, 50, 100)
MAX_INTERVAL_ERROR = 0.01  # per log interval, mean step time


def planned_ms(step: int) -> float:
    return SLOW_MS if step % SLOW_EVERY == 0 else BASE_MS[step % len(BASE_MS)]


def run_step(work: MatmulWork, timer: StepTimer, step: int) -> None:
    """One step split as the callback's hooks split it: data 10 %, forward 40 %, backward 40 %, optimizer 10 %."""
    ms = planned_ms(step)
    work.run_ms(0.1 * ms)
    timer.mark(START)
    work.run_ms(0.4 * ms)
    timer.mark(BACKWARD)
    work.run_ms(0.4 * ms)
    timer.mark(OPTIMIZER)
    work.run_ms(0.1 * ms)
    timer.end_step(step)


def interval_errors(measured: dict[int, float], truth: dict[int, float]) -> list[float]:
    errors = []
    for first in range(1, STEPS + 1, LOG_EVERY):
        steps = range(first, first + LOG_EVERY)
        ours, true = statistics.fmean(measured[s] for s in steps), statistics.fmean(truth[s] for s in steps)
        errors.append(ours / true - 1)
    return errors


def slowest(times: dict[int, float], k: int) -> set[int]:
    return set(sorted(times, key=times.get, reverse=True)[:k])


SLOW_STEPS = {s for s in range(1, STEPS + 1) if s % SLOW_EVERY == 0}


def test_event_step_times_match_a_synchronized_clock_step_by_step(gpu_results):
    work = MatmulWork()
    timer = StepTimer(CudaClock())
    truth, collected = {}, []
    torch.cuda.synchronize()
    before = time.perf_counter()
    timer.anchor()
    for step in range(1, STEPS + 1):
        run_step(work, timer, step)
        torch.cuda.synchronize()  # the truth: the device idle, read the host clock
        now = time.perf_counter()
        truth[step], before = now - before, now
        if step % LOG_EVERY == 0:
            collected += timer.collect(step - 1)  # as the callback does: up to the previous step
    collected += timer.collect()

    assert [t.step for t in collected] == list(range(1, STEPS + 1))
    measured = {t.step: t.step_s for t in collected}
    errors = interval_errors(measured, truth)
    per_step_ms = [1e3 * (measured[s] - truth[s]) for s in measured]
    gpu_results["step_timing_synchronized"] = {
        "ms_per_matmul": work.ms_per_matmul, "interval_mean_error_pct": [100 * e for e in errors],
        "per_step_error_ms": {"min": min(per_step_ms), "max": max(per_step_ms)},
        "steps_ms": {s: [round(1e3 * measured[s], 3), round(1e3 * truth[s], 3)] for s in measured}}
    assert max(abs(e) for e in errors) <= MAX_INTERVAL_ERROR, errors
    assert slowest(measured, len(SLOW_STEPS)) == SLOW_STEPS
    for t in collected:  # the phases tile the step: consecutive events on one stream
        phases = t.data_s + t.forward_s + t.backward_s + t.optimizer_s
        assert abs(phases - t.step_s) <= 5e-6 + 1e-4 * t.step_s, t
        assert t.forward_s > 2 * t.data_s and t.backward_s > 2 * t.optimizer_s, t


def test_event_step_times_match_interval_truth_when_the_host_runs_ahead(gpu_results):
    """No synchronization inside an interval (as in real training): the host queues steps ahead of
    the GPU, the events still say how long each step took on the GPU."""
    work = MatmulWork()
    timer = StepTimer(CudaClock())
    truth_mean_s, host_s, collected = [], {}, []
    torch.cuda.synchronize()
    interval_start = time.perf_counter()
    host_before = interval_start
    timer.anchor()
    for step in range(1, STEPS + 1):
        run_step(work, timer, step)
        host_now = time.perf_counter()
        host_s[step], host_before = host_now - host_before, host_now  # what an unsynchronized host clock says
        if step % LOG_EVERY == 0:
            collected += timer.collect(step - 1)
            torch.cuda.synchronize()
            now = time.perf_counter()
            truth_mean_s.append((now - interval_start) / LOG_EVERY)
            interval_start = host_before = now
    collected += timer.collect()

    measured = {t.step: t.step_s for t in collected}
    ours_mean_s = [statistics.fmean(measured[s] for s in range(first, first + LOG_EVERY))
                   for first in range(1, STEPS + 1, LOG_EVERY)]
    errors = [o / t - 1 for o, t in zip(ours_mean_s, truth_mean_s, strict=True)]
    gpu_results["step_timing_pipelined"] = {
        "interval_mean_error_pct": [100 * e for e in errors],
        "slow_steps_by_events": sorted(slowest(measured, len(SLOW_STEPS))),
        "slow_steps_by_unsynchronized_host_clock": sorted(slowest(host_s, len(SLOW_STEPS))),
        "slow_steps_planned": sorted(SLOW_STEPS)}
    assert max(abs(e) for e in errors) <= MAX_INTERVAL_ERROR, errors
    assert slowest(measured, len(SLOW_STEPS)) == SLOW_STEPS


def test_marks_land_on_the_current_stream_without_torchs_python_lookup(gpu_results):
    """The clock records on the current device's current stream through torch's C layer (no
    ``torch.cuda.current_stream`` per mark): on the default stream, then inside a side stream's
    context on that stream, which a busy side stream shows by leaving the mark unfinished."""
    clock = CudaClock()
    assert clock._streams is not None, "torch's C layer differs: marks fall back to Event.record()"
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(2_000_000_000)  # about a second of a spinning kernel, on the side stream only
        on_side = clock.mark()
    on_default = clock.mark()
    on_default.synchronize()
    side_busy = not on_side.query()
    side.synchronize()
    gpu_results["clock_streams"] = {"side_mark_pending_while_side_busy": side_busy,
                                    "streams_seen": len(clock._streams)}
    assert side_busy and on_side.query()
    assert len(clock._streams) == 2
    started = time.perf_counter()
    for _ in range(1000):
        clock.release(clock.mark())
    gpu_results["clock_streams"]["mark_us"] = (time.perf_counter() - started) * 1e3
