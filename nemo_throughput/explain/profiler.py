"""Where the step time goes: a profiler window over chosen training steps, per rank.

``profile_steps: [first, last]`` profiles those global steps only (the caller leaves them out of
throughput). Two modes:

``torch``
    torch.profiler runs from the start of step ``first`` to the end of step ``last`` (CPU
    activity, plus CUDA on a CUDA device); each step is a ``ProfilerStep#<n>`` range, the name
    torch's own scheduler uses, so trace tools split the window into steps. After the window the
    trace is exported as a Chrome trace (to ``trace_path`` on the ranks given one, else to a
    temporary file) and reduced, once, to four parts of the window's wall time (below). The
    exported trace is what is read, since every torch from 2.1 on writes each event's kineto
    category (``cat``: ``kernel``, ``gpu_memcpy``, ``cpu_op``, ...) there, while the in-memory
    events' attributes differ between versions (2.11's have no ``activity_type``).
``nsys``
    ``cudaProfilerStart``/``cudaProfilerStop`` around the window and an NVTX range ``step <n>``
    per step, so ``nsys profile --capture-range=cudaProfilerApi --capture-range-end=stop``
    records exactly those steps. Only the window's wall time and step count are measured here.

The four parts, per rank. Each is a union of intervals (nested or overlapping events are
counted once) clipped to the window, so ``compute + exposed communication + idle = window``
exactly, and communication = overlapped + exposed communication.

On a CUDA device (the timeline of this rank's GPU):
    communication  NCCL kernels (``ncclKernel*``, ``ncclDevKernel*``).
    compute        every other kernel, memcpy and memset: the GPU is busy.
    exposed comm.  NCCL kernel time during which no compute runs: communication the GPU waits for.
    idle           no device work at all: launch latency, host-side stalls, data loading.
    The device is synchronized at the window's start and end (the window is not measured for
    throughput), so all of the window's device work falls inside it.

On a CPU device (gloo). torch.profiler shows a gloo collective as a ``gloo:<op>`` range on a
gloo worker thread (the transfer, including the wait for the other ranks) and a
``c10d::<op>_`` op on the calling thread (the hand-over). DDP's reducer waits for its bucket
all-reduces without any recorded op: the wait is a gap on the training thread. Hence:
    communication  collective ranges on any thread (``gloo:*``, ``c10d::*``, ``nccl:*``,
                   ``record_param_comms``).
    compute        the training thread's recorded ops (``cpu_op``: forward, backward, optimizer
                   kernels) minus its own collective calls; not the ranges around them
                   (``record_function``), which also cover waits. The training thread is the
                   one that runs the steps.
    exposed comm.  communication time in which the training thread computes nothing: it is
                   blocked on a collective (the gradient all-reduce waiting for a slow rank).
    idle           neither computing nor communicating: Python between ops, data loading,
                   sleeps. Work on other threads (data loader workers) is not compute.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch

from nemo_throughput.text import package_logger
from nemo_throughput.values import is_number

log = package_logger(__name__)

# Per rank, travelling in the log step's vector; "unread" is a code of UNREAD (NaN: read, or nsys mode).
FIELDS = ("window_s", "steps", "compute_s", "communication_s", "exposed_communication_s", "idle_s", "unread")
# Why a rank's window has no breakdown, by code (a float travels; the words are rank 0's).
UNREAD = {
    1.0: "another torch profiler was running in this process",
    2.0: "the torch profiler did not start",
    3.0: "the trace could not be exported or read (the rank's log says why)",
    4.0: "the trace holds no ProfilerStep range of the window",
}
_NOT_RECORDED = "no window result from this rank (the window did not open or close there)"
PARTS = ("compute", "communication", "exposed_communication", "idle")  # fields <part>_s, fractions of window_s
MODES = ("torch", "nsys")

STEP_RANGE_PREFIX = "ProfilerStep#"  # torch mode: one user annotation per step on the training thread
NCCL_KERNEL_PREFIXES = ("ncclKernel", "ncclDevKernel")
HOST_COLLECTIVE_PREFIXES = ("gloo:", "c10d::", "nccl:", "record_param_comms")
DEVICE_WORK_ACTIVITIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})  # not gpu_user_annotation
DEVICE_ACTIVITIES = DEVICE_WORK_ACTIVITIES | {"gpu_user_annotation"}  # on a device's timeline
# Ops only: user annotations are ranges around work, not work. Lightning's `Optimizer.step#...`
# range wraps forward, backward and the wait for the gradient all-reduce (the closure runs inside
# the optimizer step), so counting it would call that wait compute.
HOST_OP_ACTIVITIES = frozenset({"cpu_op"})

Interval = tuple[int, int]  # [start_ns, end_ns)


# ----------------------------------------------------------------------------- interval arithmetic
def union(intervals: Iterable[Interval]) -> list[Interval]:
    """Sorted, disjoint intervals covering the same time; empty intervals are dropped."""
    merged: list[list[int]] = []
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(start, end) for start, end in merged]


def clip(intervals: Iterable[Interval], window: Interval) -> list[Interval]:
    """The parts of ``intervals`` inside ``window``."""
    first, last = window
    return [(max(start, first), min(end, last)) for start, end in intervals if end > first and start < last]


def subtract(kept: Sequence[Interval], removed: Sequence[Interval]) -> list[Interval]:
    """``kept`` minus ``removed``; both sorted and disjoint (as ``union`` returns them)."""
    result: list[Interval] = []
    j = 0
    for start, end in kept:
        while j < len(removed) and removed[j][1] <= start:
            j += 1
        k = j
        while k < len(removed) and removed[k][0] < end:
            if removed[k][0] > start:
                result.append((start, removed[k][0]))
            start = max(start, removed[k][1])
            k += 1
        if start < end:
            result.append((start, end))
    return result


def total_ns(intervals: Iterable[Interval]) -> int:
    return sum(end - start for start, end in intervals)


@dataclass(frozen=True)
class Breakdown:
    """One rank's window in nanoseconds; compute + exposed + idle == window by construction."""

    window_ns: int
    compute_ns: int
    communication_ns: int
    exposed_communication_ns: int
    idle_ns: int


def breakdown(window: Interval, compute: Iterable[Interval], communication: Iterable[Interval]) -> Breakdown:
    """Split ``window`` into compute, exposed communication and idle time (plus all communication)."""
    busy = union(clip(compute, window))
    talking = union(clip(communication, window))
    exposed = subtract(talking, busy)
    window_ns = window[1] - window[0]
    return Breakdown(window_ns=window_ns, compute_ns=total_ns(busy), communication_ns=total_ns(talking),
                     exposed_communication_ns=total_ns(exposed),
                     idle_ns=window_ns - total_ns(busy) - total_ns(exposed))


# ----------------------------------------------------------------------------- trace events
class TraceEvent(NamedTuple):
    """The few facts of a profiler event that the breakdown needs (a tuple: traces are large)."""

    name: str
    activity: str  # kineto's activity type: "cpu_op", "user_annotation", "kernel", "gpu_memcpy", ...
    thread: int  # profiler thread id (host events)
    on_device: bool  # on a device timeline (kernels, copies, device-side annotations)
    device_index: int
    start_ns: int
    end_ns: int


def events_from_chrome_trace(trace: Mapping[str, Any] | Sequence[Any]) -> list[TraceEvent]:
    """The complete events (``"ph": "X"``) of a Chrome trace as torch.profiler exports it: a
    ``{"traceEvents": [...]}`` object or the bare list. Timestamps are microseconds; events
    without a category or a numeric time (flows, metadata, a cut entry) are passed over."""
    events = trace.get("traceEvents") if isinstance(trace, Mapping) else trace
    if not isinstance(events, Sequence) or isinstance(events, (str, bytes)):
        raise ValueError("not a Chrome trace: no traceEvents list")
    found = []
    for e in events:
        if not isinstance(e, Mapping) or e.get("ph") != "X":
            continue
        category, ts, dur = e.get("cat"), e.get("ts"), e.get("dur")
        if not isinstance(category, str) or not is_number(ts) or not is_number(dur) or not math.isfinite(ts + dur):
            continue
        on_device = category in DEVICE_ACTIVITIES
        args = e.get("args") if isinstance(e.get("args"), Mapping) else {}
        device = args.get("device", e.get("pid")) if on_device else -1
        start_ns = round(ts * 1000)
        found.append(TraceEvent(name=str(e.get("name", "")), activity=category, thread=e.get("tid"),
                                on_device=on_device, device_index=device if isinstance(device, int) else -1,
                                start_ns=start_ns, end_ns=start_ns + round(dur * 1000)))
    return found


def read_chrome_trace(path: str | os.PathLike) -> list[TraceEvent]:
    """:func:`events_from_chrome_trace` of a trace file (gzip where its name ends in .gz)."""
    import gzip

    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as file:
        return events_from_chrome_trace(json.load(file))


def step_ranges(events: Iterable[TraceEvent]) -> list[TraceEvent]:
    """The host-side ``ProfilerStep#<n>`` ranges, in time order."""
    return sorted((e for e in events if not e.on_device and e.name.startswith(STEP_RANGE_PREFIX)),
                  key=lambda e: e.start_ns)


def is_host_collective(event: TraceEvent) -> bool:
    return not event.on_device and event.name.startswith(HOST_COLLECTIVE_PREFIXES)


def host_breakdown(events: Sequence[TraceEvent]) -> Breakdown | None:
    """CPU device: compute on the training thread, collectives on any thread (module docstring)."""
    steps = step_ranges(events)
    if not steps:
        return None
    window = (steps[0].start_ns, steps[-1].end_ns)
    training_thread = steps[0].thread
    own_ops = [e for e in events if not e.on_device and e.thread == training_thread
               and e.activity in HOST_OP_ACTIVITIES and not e.name.startswith(STEP_RANGE_PREFIX)]
    own_collectives = union((e.start_ns, e.end_ns) for e in own_ops if is_host_collective(e))
    compute = subtract(union((e.start_ns, e.end_ns) for e in own_ops if not is_host_collective(e)), own_collectives)
    communication = [(e.start_ns, e.end_ns) for e in events if is_host_collective(e)]
    return breakdown(window, compute, communication)


def device_breakdown(events: Sequence[TraceEvent], device_index: int) -> Breakdown | None:
    """CUDA device: NCCL kernels against all other device work on this rank's GPU.

    Work on other GPUs is left out only when the trace has several: with one GPU visible per
    process its index in the trace can differ from ``device_index``."""
    steps = step_ranges(events)
    if not steps:
        return None
    window = (steps[0].start_ns, steps[-1].end_ns)
    work = [e for e in events if e.on_device and e.activity in DEVICE_WORK_ACTIVITIES]
    if len({e.device_index for e in work}) > 1:  # one GPU seen is ours, whatever numbering CUPTI used
        work = [e for e in work if e.device_index == device_index]
    nccl = [(e.start_ns, e.end_ns) for e in work if e.name.startswith(NCCL_KERNEL_PREFIXES)]
    compute = [(e.start_ns, e.end_ns) for e in work if not e.name.startswith(NCCL_KERNEL_PREFIXES)]
    return breakdown(window, compute, nccl)


# ----------------------------------------------------------------------------- the window
class ProfileWindow:
    """Profiles global steps ``first_step..last_step`` (inclusive) of this rank.

    Call ``step_start(n)`` when global step ``n`` (1-based, the one about to run) starts and
    ``step_end(n)`` after its optimizer step, on every step: calls outside the window do
    nothing. The window opens at the first window step seen (a run resumed inside the window
    profiles the rest of it) and closes after ``last_step``, or at ``close()`` when training
    stops inside it. ``result()`` then gives this rank's ``FIELDS``; NaN where not measured.
    """

    FIELDS = FIELDS

    def __init__(self, first_step: int, last_step: int, mode: str, device: torch.device,
                 trace_path: str | None) -> None:
        if mode not in MODES:
            raise ValueError(f"Unknown profile mode {mode!r}; choose one of {list(MODES)}")
        if not (isinstance(first_step, int) and isinstance(last_step, int) and 1 <= first_step <= last_step):
            raise ValueError(f"profile window must be global steps 1 <= first <= last, got [{first_step}, {last_step}]")
        device = torch.device(device)
        if mode == "nsys" and device.type != "cuda":
            raise ValueError(f"profile_mode 'nsys' needs a CUDA device (Nsight Systems traces CUDA), got {device}; "
                             "use profile_mode 'torch' on this device")
        self.first_step, self.last_step, self.mode, self.trace_path = first_step, last_step, mode, trace_path
        self.device = device
        if mode == "nsys" and trace_path:
            log.info("profile_mode 'nsys' writes no chrome trace (%s): the nsys report holds the trace", trace_path)
        self._state = "waiting"  # -> "open" -> "closed"
        self._profiler: torch.profiler.profile | None = None
        self._step_range: Any = None  # the open ProfilerStep record_function (torch mode)
        self._open_step: int | None = None
        self._steps = 0
        self._started_ns = 0
        self._result: list[float] | None = None

    def contains(self, step: int) -> bool:
        return self.first_step <= step <= self.last_step

    def step_start(self, step: int) -> None:
        if self._state == "closed" or not self.contains(step) or step == self._open_step:
            return  # (the same step again: the next micro-batch under gradient accumulation)
        if self._state == "waiting" and not self._open(step):
            return
        self._begin_step(step)

    def step_end(self, step: int) -> None:
        if self._state != "open" or step != self._open_step:
            return
        last = step >= self.last_step
        if last:
            self._synchronize()  # the last step's device work ends inside its step range
        self._end_step()
        self._steps += 1
        if last:
            self._close()

    def close(self) -> None:
        """Close a window that training left early (the result covers the steps that ended)."""
        if self._state == "open":
            self._synchronize()
            if self._open_step is not None:
                self._end_step()
            self._close()
        self._state = "closed"

    def result(self) -> list[float] | None:
        return None if self._result is None else list(self._result)

    # -- opening and closing
    def _synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _open(self, step: int) -> bool:
        if step != self.first_step:
            log.warning("Profile window [%d, %d] opens at step %d (training started inside it)",
                        self.first_step, self.last_step, step)
        if self.mode == "torch" and torch.autograd._profiler_enabled():
            # Starting ours would silently end the other one (NeMo's or the user's own profiler).
            log.warning("Profile window [%d, %d] not recorded: another torch profiler is already running in "
                        "this process; drop profile_steps or the other profiler", self.first_step, self.last_step)
            self._not_read(1.0)
            return False
        self._synchronize()  # earlier steps' device work stays out of the window
        try:
            if self.mode == "torch":
                activities = [torch.profiler.ProfilerActivity.CPU]
                if self.device.type == "cuda":
                    activities.append(torch.profiler.ProfilerActivity.CUDA)
                self._profiler = torch.profiler.profile(activities=activities)
                self._profiler.start()
            else:
                torch.cuda.cudart().cudaProfilerStart()
        except RuntimeError as error:  # e.g. no CUDA profiler API in this build
            log.warning("Profile window [%d, %d] not recorded: starting the %s profiler failed (%s); "
                        "the window is left out of the summary", self.first_step, self.last_step,
                        self.mode, error)
            self._not_read(2.0)
            return False
        self._state = "open"
        self._started_ns = time.perf_counter_ns()
        log.info("Profiling steps %d-%d (%s mode)", self.first_step, self.last_step, self.mode)
        return True

    def _not_read(self, code: float) -> None:
        """The window closes without a breakdown, for the reason UNREAD[code]."""
        self._state = "closed"
        self._result = [math.nan] * (len(FIELDS) - 1) + [code]

    def _close(self) -> None:
        window_s = (time.perf_counter_ns() - self._started_ns) / 1e9
        self._state = "closed"
        if self.mode == "nsys":
            torch.cuda.cudart().cudaProfilerStop()
            self._result = [window_s, float(self._steps)] + [math.nan] * 5
            return
        self._profiler.stop()
        self._result = self._analysed(window_s)
        self._profiler = None  # the trace can be large: keep only the numbers

    def _analysed(self, host_window_s: float) -> list[float]:
        """The window's FIELDS from its exported trace; a trace that cannot be read leaves the parts
        NaN with the reason's code, and a warning says so (training goes on)."""
        started = time.perf_counter()
        code, parts, events = math.nan, None, []
        try:
            events = self._exported_events()
            if self.device.type == "cuda":
                index = self.device.index if self.device.index is not None else torch.cuda.current_device()
                parts = device_breakdown(events, index)
            else:
                parts = host_breakdown(events)
            if parts is None:
                code = 4.0
        except Exception as error:  # a surprising trace must not stop training; the numbers stay NaN
            log.warning("Profile window [%d, %d]: could not read the trace (%r); the summary's communication "
                        "section has no breakdown for this rank", self.first_step, self.last_step, error)
            code = 3.0
        if parts is None:
            if code == 4.0:
                log.warning("Profile window [%d, %d]: %s; the summary's communication section has no breakdown "
                            "for this rank", self.first_step, self.last_step, UNREAD[code])
            return [host_window_s, float(self._steps)] + [math.nan] * 4 + [code]
        log.info("Profile window [%d, %d] analysed in %.2f s (%d events)", self.first_step, self.last_step,
                 time.perf_counter() - started, len(events))
        return [parts.window_ns / 1e9, float(self._steps), parts.compute_ns / 1e9, parts.communication_ns / 1e9,
                parts.exposed_communication_ns / 1e9, parts.idle_ns / 1e9, math.nan]

    def _exported_events(self) -> list[TraceEvent]:
        """Export the trace (to ``trace_path``, else a temporary file) and read it back."""
        if self.trace_path:
            Path(self.trace_path).parent.mkdir(parents=True, exist_ok=True)
            self._profiler.export_chrome_trace(str(self.trace_path))
            return read_chrome_trace(self.trace_path)
        fd, path = tempfile.mkstemp(prefix="nemo-throughput-window-", suffix=".json")
        os.close(fd)
        try:
            self._profiler.export_chrome_trace(path)
            return read_chrome_trace(path)
        finally:
            os.remove(path)

    # -- one step
    def _begin_step(self, step: int) -> None:
        if self._open_step is not None:  # a step that never ended (an exception inside it)
            self._end_step()
        self._open_step = step
        if self.mode == "torch":
            self._step_range = torch.profiler.record_function(f"{STEP_RANGE_PREFIX}{step}")
            self._step_range.__enter__()
        else:
            _nvtx_push(f"step {step}")

    def _end_step(self) -> None:
        if self.mode == "torch":
            self._step_range.__exit__(None, None, None)
            self._step_range = None
        else:
            _nvtx_pop()
        self._open_step = None


def _nvtx_push(message: str) -> None:
    try:
        import nvtx
    except ImportError:
        torch.cuda.nvtx.range_push(message)
    else:
        nvtx.push_range(message)


def _nvtx_pop() -> None:
    try:
        import nvtx
    except ImportError:
        torch.cuda.nvtx.range_pop()
    else:
        nvtx.pop_range()


# ----------------------------------------------------------------------------- the summary section
def communication_section(results: torch.Tensor, places: list[dict], window: tuple[int, int], mode: str,
                          traces: list[str]) -> dict:
    """The summary's "communication" section from every rank's ``FIELDS`` (``[ranks, FIELDS]``).

    Fractions are the mean over ranks of each part / window_s, over the ranks that have it;
    None where no rank has it (nsys mode, or a window that never closed).
    """
    values = torch.as_tensor(results, dtype=torch.float64)
    if values.dim() != 2 or values.shape != (len(places), len(FIELDS)):
        raise ValueError(f"communication_section needs results of shape [ranks={len(places)}, {len(FIELDS)}] "
                         f"(one row of ProfileWindow.FIELDS per place), got {tuple(values.shape)}")
    rows = values.tolist()
    column = {name: [row[i] for row in rows] for i, name in enumerate(FIELDS)}
    per_rank = [{"rank": place["rank"], "host": place["host"], "gpu_index": place["gpu_index"],
                 **{name: _finite_or_none(row[FIELDS.index(name)]) for name in FIELDS if name not in ("steps", "unread")},
                 "unread": _unread(row, mode)}
                for place, row in zip(places, rows, strict=True)]
    steps = [s for s in column["steps"] if math.isfinite(s)]
    return {
        "window": {"first_step": window[0], "last_step": window[1], "mode": mode,
                   "steps": int(min(steps)) if steps else None},
        "per_rank": per_rank,
        "fractions": {part: _mean_fraction(column[f"{part}_s"], column["window_s"]) for part in PARTS},
        "traces": list(traces),
    }


def _unread(row: list[float], mode: str) -> str | None:
    """Why a rank's row has no breakdown; None where it has one (or in nsys mode, which measures none)."""
    if mode == "nsys" and math.isfinite(row[FIELDS.index("window_s")]):
        return None
    code = row[FIELDS.index("unread")]
    if math.isfinite(code):
        return UNREAD.get(code, f"unknown reason {code:g}")
    return None if math.isfinite(row[FIELDS.index("compute_s")]) else _NOT_RECORDED


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _mean_fraction(parts_s: list[float], windows_s: list[float]) -> float | None:
    pairs = zip(parts_s, windows_s, strict=True)
    fractions = [p / w for p, w in pairs if math.isfinite(p) and math.isfinite(w) and w > 0]
    return sum(fractions) / len(fractions) if fractions else None
