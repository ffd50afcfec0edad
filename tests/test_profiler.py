"""The profiler window: interval arithmetic on hand-built traces (CPU and GPU), a real CUDA trace from an
H200 (tests/data/profiler, origin in its ORIGIN.md), and real torch.profiler windows over a single process
and over a 2-rank gloo DDP loop with a slow rank."""

import gc
import gzip
import json
import logging
import math
import random
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from conftest import free_port
from nemo_throughput.explain.profiler import (
    FIELDS,
    UNREAD,
    Breakdown,
    ProfileWindow,
    TraceEvent,
    breakdown,
    clip,
    communication_section,
    device_breakdown,
    events_from_chrome_trace,
    host_breakdown,
    read_chrome_trace,
    subtract,
    union,
)

H200_TRACE = Path(__file__).parent / "data" / "profiler" / "h200-lightning-fit.json.gz"


# ----------------------------------------------------------------------------- interval arithmetic
def test_union_merges_overlapping_nested_and_touching_intervals():
    assert union([(5, 7), (0, 3), (2, 4), (1, 2), (4, 4), (7, 9)]) == [(0, 4), (5, 9)]
    assert union([]) == []


def test_subtract_and_clip():
    assert subtract([(0, 10), (20, 30)], [(2, 3), (5, 25), (28, 40)]) == [(0, 2), (3, 5), (25, 28)]
    assert subtract([(0, 10)], []) == [(0, 10)]
    assert subtract([(0, 10)], [(0, 10)]) == []
    assert clip([(0, 5), (8, 12), (20, 30)], (3, 10)) == [(3, 5), (8, 10)]


def test_breakdown_matches_a_nanosecond_by_nanosecond_count():
    rng = random.Random(12)

    def intervals(n):
        return [(a, a + rng.randint(0, 15)) for a in (rng.randint(-10, 110) for _ in range(n))]

    for _ in range(200):
        window = (0, 100)
        compute, communication = intervals(rng.randint(0, 8)), intervals(rng.randint(0, 8))
        parts = breakdown(window, compute, communication)
        busy = {t for a, b in compute for t in range(a, b) if 0 <= t < 100}
        talking = {t for a, b in communication for t in range(a, b) if 0 <= t < 100}
        assert parts == Breakdown(window_ns=100, compute_ns=len(busy), communication_ns=len(talking),
                                  exposed_communication_ns=len(talking - busy), idle_ns=100 - len(busy | talking))
        assert parts.compute_ns + parts.exposed_communication_ns + parts.idle_ns == parts.window_ns


def event(name, start, end, activity="cpu_op", thread=1, on_device=False, device_index=-1):
    return TraceEvent(name, activity, thread, on_device, device_index, start, end)


def steps(*ranges, thread=1):
    return [event(f"ProfilerStep#{n}", a, b, "user_annotation", thread) for n, (a, b) in enumerate(ranges, 1)]


def test_gpu_breakdown_counts_nccl_kernels_as_communication_on_this_device_only():
    events = [
        *steps((100, 200), (200, 300)),  # window 100..300 on the host
        event("ProfilerStep#1", 100, 300, "gpu_user_annotation", on_device=True, device_index=0),  # not work
        event("cudaLaunchKernel", 120, 290),  # host runtime calls are not device work
        event("ampere_sgemm_128x64", 90, 130, "kernel", on_device=True, device_index=0),  # clipped to 100..130
        event("elementwise_kernel", 120, 140, "kernel", on_device=True, device_index=0),  # nested in the union
        event("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 135, 180, "kernel", on_device=True, device_index=0),
        event("Memcpy DtoH (Device -> Pinned)", 200, 210, "gpu_memcpy", on_device=True, device_index=0),
        event("ncclKernel_AllGather_RING_LL_Sum_int8_t", 205, 215, "kernel", on_device=True, device_index=0),
        event("sgemm_other_gpu", 150, 300, "kernel", on_device=True, device_index=1),  # another GPU
        event("ncclDevKernel_late", 290, 400, "kernel", on_device=True, device_index=0),  # clipped to 290..300
    ]
    parts = device_breakdown(events, device_index=0)
    # compute 100..140 and 200..210 = 50; NCCL 135..180, 205..215, 290..300 = 65
    # exposed: 140..180, 210..215, 290..300 = 55; idle: 200 - 50 - 55 = 95
    assert parts == Breakdown(window_ns=200, compute_ns=50, communication_ns=65, exposed_communication_ns=55,
                              idle_ns=95)
    # With one GPU in the trace, its work counts whatever index CUPTI gave it.
    only_gpu_1 = [e for e in events if e.device_index != 0]
    assert device_breakdown(only_gpu_1, device_index=0).compute_ns == 150


def test_cpu_breakdown_uses_the_training_thread_for_compute_and_any_thread_for_collectives():
    events = [
        *steps((0, 50), (50, 100), thread=1),
        event("aten::linear", 5, 20), event("aten::addmm", 6, 19),  # nested: counted once
        # a range around work and waits (Lightning runs forward and backward inside it): not compute
        event("Optimizer.step#SGD.step", 4, 46, "user_annotation"),
        event("c10d::allreduce_", 30, 32),  # hand-over on the training thread: communication, not compute
        event("aten::copy_", 31, 32),  # inside the collective call: not compute either
        event("gloo:all_reduce", 31, 45, "user_annotation", thread=3),  # the transfer on gloo's thread
        event("aten::mm", 40, 44),  # compute that hides part of it
        event("aten::mm", 60, 70, thread=2),  # another thread: not compute
        event("gloo:barrier", 90, 120, "user_annotation", thread=4),  # clipped to 90..100
    ]
    parts = host_breakdown(events)
    # compute 5..20 and 40..44 = 19; communication 30..45 and 90..100 = 25
    # exposed 30..40 and 44..45 and 90..100 = 21; idle 100 - 19 - 21 = 60
    assert parts == Breakdown(window_ns=100, compute_ns=19, communication_ns=25, exposed_communication_ns=21,
                              idle_ns=60)


def test_a_trace_without_step_ranges_has_no_breakdown():
    assert host_breakdown([event("aten::mm", 0, 10)]) is None
    assert device_breakdown([event("k", 0, 10, "kernel", on_device=True, device_index=0)], 0) is None


# ----------------------------------------------------------------------------- construction
def test_nsys_mode_needs_cuda():
    with pytest.raises(ValueError, match="'nsys' needs a CUDA device"):
        ProfileWindow(2, 3, "nsys", torch.device("cpu"), None)


@pytest.mark.parametrize("args, message", [
    ((2, 3, "perf"), "Unknown profile mode 'perf'"),
    ((4, 3, "torch"), r"1 <= first <= last, got \[4, 3\]"),
    ((0, 3, "torch"), r"got \[0, 3\]"),
])
def test_a_wrong_window_is_refused(args, message):
    with pytest.raises(ValueError, match=message):
        ProfileWindow(*args, device=torch.device("cpu"), trace_path=None)


# ----------------------------------------------------------------------------- one real process
def train(window, first, last, model, optimizer, x):
    for step in range(first, last + 1):
        window.step_start(step)
        model(x).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        window.step_end(step)


def tiny_model():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32))
    return model, torch.optim.SGD(model.parameters(), lr=0.01), torch.randn(8, 32)


def assert_parts_add_up(fields):
    values = dict(zip(FIELDS, fields, strict=True))
    assert math.isnan(values.pop("unread")), values  # read: no reason why not
    assert all(math.isfinite(v) and v >= 0 for v in values.values()), values
    assert values["compute_s"] + values["exposed_communication_s"] + values["idle_s"] == pytest.approx(
        values["window_s"], rel=1e-9, abs=1e-9)
    assert values["exposed_communication_s"] <= values["communication_s"] + 1e-12
    return values


def test_a_single_process_window_profiles_only_its_steps(tmp_path):
    model, optimizer, x = tiny_model()
    window = ProfileWindow(3, 4, "torch", torch.device("cpu"), str(tmp_path / "traces" / "rank0.json"))
    assert [window.contains(s) for s in (2, 3, 4, 5)] == [False, True, True, False]
    train(window, 1, 2, model, optimizer, x)
    assert window.result() is None and not torch.autograd._profiler_enabled()
    window.step_start(3)
    assert torch.autograd._profiler_enabled()
    window.step_start(3)  # the next micro-batch of the same step (gradient accumulation): one step range
    window.step_end(3)
    assert window.result() is None  # still open until the last step ended
    train(window, 4, 6, model, optimizer, x)
    assert not torch.autograd._profiler_enabled()

    values = assert_parts_add_up(window.result())
    assert values["steps"] == 2 and values["compute_s"] > 0
    assert values["communication_s"] == 0 and values["exposed_communication_s"] == 0  # nothing distributed
    names = [e["name"] for e in json.loads((tmp_path / "traces" / "rank0.json").read_text())["traceEvents"]]
    assert sorted(n for n in names if n.startswith("ProfilerStep#")) == ["ProfilerStep#3", "ProfilerStep#4"]


def test_close_ends_a_window_that_training_left_early():
    model, optimizer, x = tiny_model()
    window = ProfileWindow(2, 10, "torch", torch.device("cpu"), None)
    train(window, 1, 3, model, optimizer, x)
    window.step_start(4)  # interrupted inside step 4
    window.close()
    assert not torch.autograd._profiler_enabled()
    values = assert_parts_add_up(window.result())
    assert values["steps"] == 2  # steps 2 and 3 ended; 4 is inside the window's time but did not finish
    window.step_start(5)  # closed for good
    assert not torch.autograd._profiler_enabled()


def test_a_window_leaves_a_running_profiler_alone(caplog):
    model, optimizer, x = tiny_model()
    window = ProfileWindow(1, 2, "torch", torch.device("cpu"), None)
    with torch.profiler.profile() as other, caplog.at_level(logging.WARNING):
        train(window, 1, 2, model, optimizer, x)
    values = dict(zip(FIELDS, window.result(), strict=True))
    assert math.isnan(values["compute_s"]) and UNREAD[values["unread"]] == "another torch profiler was running in this process"
    assert "another torch profiler is already running" in caplog.text
    assert any(e.name == "aten::addmm" for e in other.events())  # the other profiler kept recording


# ----------------------------------------------------------------------------- reading exported traces
def test_the_real_h200_trace_reads_kernels_copies_and_sets_as_device_work():
    """A Lightning fit's torch.profiler trace from an H200 (torch 2.11, whose in-memory events lack
    activity_type): every kernel, memcpy and memset is device work; device annotations are not."""
    raw = json.load(gzip.open(H200_TRACE))["traceEvents"]
    events = read_chrome_trace(H200_TRACE)
    work = [e for e in events if e.on_device and e.activity in ("kernel", "gpu_memcpy", "gpu_memset")]
    expected = [e for e in raw if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    assert len(work) == len(expected) > 4000 and {e.device_index for e in work} == {0}
    assert all(not e.on_device for e in events if e.activity == "cpu_op")
    annotations = [e for e in events if e.activity == "gpu_user_annotation"]
    assert annotations and all(e.on_device for e in annotations)

    # The breakdown over the fit's device work, between two step ranges that span it.
    first, last = min(e.start_ns for e in work), max(e.end_ns for e in work)
    window = steps((first, (first + last) // 2), ((first + last) // 2, last))
    parts = device_breakdown(events + window, device_index=0)
    busy = union((round(e["ts"] * 1000), round(e["ts"] * 1000) + round(e["dur"] * 1000)) for e in expected)
    assert parts.window_ns == last - first and parts.compute_ns == sum(b - a for a, b in busy)
    assert parts.communication_ns == 0 and parts.idle_ns == parts.window_ns - parts.compute_ns > 0


def test_a_trace_that_is_not_one_is_refused_and_odd_events_are_passed_over():
    with pytest.raises(ValueError, match="not a Chrome trace"):
        events_from_chrome_trace({"traceEvents": "x"})
    odd = [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1.0, "dur": 2.0, "args": {"device": 0}},
           {"ph": "s", "cat": "ac2g", "ts": 1.0},  # a flow
           {"ph": "X", "cat": "kernel", "ts": "1", "dur": 2.0},  # a string timestamp
           {"ph": "X", "cat": "kernel", "ts": float("nan"), "dur": 2.0},
           {"ph": "X", "cat": "cpu_op", "ts": True, "dur": 2.0},  # a bool is no time
           {"ph": "X", "ts": 1.0, "dur": 1.0},  # no category
           "cut", None]
    (kept,) = events_from_chrome_trace(odd)
    assert kept == TraceEvent("k", "kernel", None, True, 0, 1000, 3000)


def test_a_window_reads_its_trace_where_torch_events_have_no_activity_type(monkeypatch):
    """torch 2.11's _KinetoEvent has no activity_type (it gave null parts on an H200): the window
    reads the exported trace, whose categories every torch since 2.1 writes."""
    monkeypatch.delattr(torch._C._autograd._KinetoEvent, "activity_type", raising=False)
    model, optimizer, x = tiny_model()
    window = ProfileWindow(2, 3, "torch", torch.device("cpu"), None)
    train(window, 1, 4, model, optimizer, x)
    values = assert_parts_add_up(window.result())
    assert values["steps"] == 2 and values["compute_s"] > 0


def test_a_trace_that_cannot_be_written_leaves_the_window_unread_and_says_why(tmp_path, caplog):
    model, optimizer, x = tiny_model()
    (tmp_path / "traces").write_text("a file where the trace folder belongs")
    window = ProfileWindow(2, 3, "torch", torch.device("cpu"), str(tmp_path / "traces" / "rank0.json"))
    with caplog.at_level(logging.WARNING):
        train(window, 1, 4, model, optimizer, x)
    values = dict(zip(FIELDS, window.result(), strict=True))
    assert values["window_s"] > 0 and values["steps"] == 2 and math.isnan(values["compute_s"])
    assert UNREAD[values["unread"]] == "the trace could not be exported or read (the rank's log says why)"
    assert "could not read the trace" in caplog.text and "communication section" in caplog.text
    assert not torch.autograd._profiler_enabled()


# ----------------------------------------------------------------------------- the summary section
PLACES = [{"rank": 0, "host": "node-a", "gpu_index": 0}, {"rank": 1, "host": "node-b", "gpu_index": 1}]


def test_communication_section_fractions_are_means_over_ranks():
    nan = math.nan
    nan = math.nan
    results = torch.tensor([[2.0, 3, 1.0, 0.8, 0.4, 0.6, nan],
                            [4.0, 3, 3.0, 2.0, 0.0, 1.0, nan]], dtype=torch.float64)
    section = communication_section(results, PLACES, (20, 22), "torch", ["traces/rank0.json"])
    assert section["window"] == {"first_step": 20, "last_step": 22, "mode": "torch", "steps": 3}
    assert section["per_rank"][1] == {"rank": 1, "host": "node-b", "gpu_index": 1, "window_s": 4.0,
                                      "compute_s": 3.0, "communication_s": 2.0, "exposed_communication_s": 0.0,
                                      "idle_s": 1.0, "unread": None}
    assert section["fractions"] == pytest.approx({"compute": (0.5 + 0.75) / 2, "communication": (0.4 + 0.5) / 2,
                                                  "exposed_communication": 0.1, "idle": (0.3 + 0.25) / 2})
    assert section["traces"] == ["traces/rank0.json"]

    # nsys mode, or a rank whose window never closed: NaN parts are None, fractions over those that have them
    nsys = communication_section(torch.tensor([[2.0, 3] + [nan] * 5] * 2), PLACES, (20, 22), "nsys", [])
    assert nsys["fractions"] == dict.fromkeys(("compute", "communication", "exposed_communication", "idle"))
    assert nsys["per_rank"][0]["window_s"] == 2.0 and nsys["per_rank"][0]["compute_s"] is None
    assert nsys["per_rank"][0]["unread"] is None  # nsys measures no parts: its report holds them
    partial = communication_section(torch.tensor([[2.0, 3, 1.0, 0.8, 0.4, 0.6, nan], [nan] * 7]), PLACES, (20, 22),
                                    "torch", [])
    assert partial["fractions"]["compute"] == 0.5 and partial["per_rank"][1]["window_s"] is None
    assert partial["per_rank"][1]["unread"].startswith("no window result from this rank")
    # A rank whose trace could not be read says so in the section, with the timed window kept.
    unread = communication_section(torch.tensor([[2.0, 3, 1.0, 0.8, 0.4, 0.6, nan], [2.0, 3] + [nan] * 4 + [3.0]]),
                                   PLACES, (20, 22), "torch", [])
    assert unread["per_rank"][1]["window_s"] == 2.0 and unread["per_rank"][1]["compute_s"] is None
    assert unread["per_rank"][1]["unread"] == UNREAD[3.0] and unread["per_rank"][0]["unread"] is None


def test_communication_section_refuses_a_wrong_shape():
    with pytest.raises(ValueError, match=r"shape \[ranks=2, 7\].*got \(2, 5\)"):
        communication_section(torch.zeros(2, 5), PLACES, (1, 2), "torch", [])


# ----------------------------------------------------------------------------- two ranks, gloo DDP
SLOW_RANK, SLOW_S = 1, 0.15
WINDOW = (3, 5)
TRACED_RANK = 0


def _ddp_worker(rank, port, out_dir):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    model, optimizer, x = tiny_model()
    model = torch.nn.parallel.DistributedDataParallel(model)
    trace = f"{out_dir}/traces/rank{rank}.json" if rank == TRACED_RANK else None
    window = ProfileWindow(*WINDOW, "torch", torch.device("cpu"), trace)
    profiling = []
    for step in range(1, 7):
        window.step_start(step)
        profiling.append(torch.autograd._profiler_enabled())
        loss = model(x).square().mean()
        if rank == SLOW_RANK:
            time.sleep(SLOW_S)  # before backward: the other rank waits in the gradient all-reduce
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        window.step_end(step)
    with open(f"{out_dir}/rank{rank}.json", "w") as f:
        json.dump({"result": window.result(), "profiling": profiling}, f)
    # DDP's reducer holds gloo work and tensors: freed now, not at interpreter exit, where freeing a
    # tensor retakes the GIL and aborts the process ("terminate called without an active exception")
    del model, optimizer, window
    gc.collect()
    dist.destroy_process_group()


@pytest.mark.slow
def test_two_gloo_ranks_the_waiting_rank_shows_exposed_communication(tmp_path):
    mp.spawn(_ddp_worker, args=(free_port(), str(tmp_path)), nprocs=2)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for rank in ranks:
        assert rank["profiling"] == [False, False, True, True, True, False]  # steps 3-5 only
        values = assert_parts_add_up(rank["result"])
        assert values["steps"] == 3 and values["compute_s"] > 0
        assert values["communication_s"] > 0  # the gloo all-reduces of every window step
    fast, slow = (dict(zip(FIELDS, r["result"], strict=True)) for r in ranks)
    # The fast rank blocks in the all-reduce while the slow one sleeps; the sleep itself is idle.
    assert fast["exposed_communication_s"] > slow["exposed_communication_s"]
    assert slow["idle_s"] > fast["idle_s"]

    assert sorted(p.name for p in (tmp_path / "traces").iterdir()) == [f"rank{TRACED_RANK}.json"]
    trace = json.loads((tmp_path / "traces" / f"rank{TRACED_RANK}.json").read_text())
    names = {e["name"] for e in trace["traceEvents"]}
    assert {"ProfilerStep#3", "ProfilerStep#5", "gloo:all_reduce"} <= names

    section = communication_section(torch.tensor([r["result"] for r in ranks], dtype=torch.float64), PLACES,
                                     WINDOW, "torch", [f"traces/rank{TRACED_RANK}.json"])
    fractions = section["fractions"]
    assert fractions["compute"] + fractions["exposed_communication"] + fractions["idle"] == pytest.approx(1.0)
    assert 0 < fractions["communication"] <= 1
    assert [row["rank"] for row in section["per_rank"]] == [0, 1]
