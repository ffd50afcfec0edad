"""The versioned JSON run summary, and writers that never leave a file half-written."""

from __future__ import annotations

import errno
import json
import os
import socket
import stat
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nemo_throughput.errors import NemoThroughputError
from nemo_throughput.flops import CAUSAL_ATTENTION, MEASURED
from nemo_throughput.outputs import write_text_atomic
from nemo_throughput.run_facts import RunFacts, now_iso
from nemo_throughput.schemas import SUMMARY_SCHEMA_ID
from nemo_throughput.text import package_logger, printable
from nemo_throughput.throughput import RATES, CountedStep, Workload
from nemo_throughput.timing import PHASE_TIMES

if TYPE_CHECKING:
    from nemo_throughput.run_stats import RunStats

log = package_logger(__name__)

SCHEMA = SUMMARY_SCHEMA_ID
STATUSES = ("running", "stalled", "completed", "failed", "interrupted")
STEPS_FILE = "steps.jsonl"
EXPLAINED = ("telemetry", "communication", "network", "probe")  # sections explaining the numbers
CLAIM_FILE = ".nemo-throughput-run.json"  # which run owns an output directory
_MAX_SAME_NAME = 1000  # runs of one name in one output directory: <name>, <name>-2, ...


@dataclass(frozen=True)
class LogTiming:
    """What an imported log adds to the timing. A log is one rank's view of the run: its summary
    has no per-rank times and no straggler."""

    window: str  # the steps counted, in window.SYNTAX
    steps: list[list[Any]]  # every [step, seconds] of the log
    excluded_step_times: dict[str, Any]  # {"count", "steps": [[step, repr(value)], ...]}: not positive finite


@dataclass(frozen=True)
class ResultRate:
    """An imported result's own rate (samples/s), in place of one from step times."""

    samples_per_s: float | None
    source: str | None  # where in the result it was read, None when the result has none


def build_summary(facts: RunFacts, stats: RunStats, status: str, error: str | None = None,
                  explained: dict[str, Any] | None = None,
                  time_to_target: dict[str, Any] | None = None, *, log_timing: LogTiming | None = None,
                  result_rate: ResultRate | None = None,
                  time_to_train: dict[str, Any] | None = None, counted: CountedStep | None = None,
                  goodput: dict[str, Any] | None = None, stalls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The summary, every route's (callback, import); it conforms to schemas/summary-v1.json.

    ``explained`` adds the sections that explain the numbers (telemetry, communication, network,
    probe: see nemo_throughput.explain), each None when not collected; ``time_to_target``:
    TimeToTarget.section() when a target is set. What only an import knows: ``log_timing`` (an
    imported log), ``result_rate`` and ``time_to_train`` (an imported MLPerf result). ``counted``: the
    mean measured step as counted from packed or padded batches; ``goodput``: the run's goodput so
    far (goodput.stitch), on rank 0 of a callback's run; ``stalls``: the stall watch's records
    (run.stall), None where no watch ran.
    """
    if status not in STATUSES:
        raise ValueError(f"Unknown status {status!r}; expected one of {STATUSES}")
    workload = replace(facts.workload, counted=counted)
    throughput = {"primary": RATES[facts.rate], **workload.metrics(stats.mean_step_time_s())}
    if result_rate is not None:
        throughput.update(samples_per_s=result_rate.samples_per_s, rate_source=result_rate.source)
    return {
        "schema": SCHEMA,
        "status": status,
        "error": error,
        "run": {
            "name": facts.name,
            "id": facts.run_id,
            "label": facts.label,
            "source": facts.source,
            "started_at": facts.started_at,
            "updated_at": now_iso(),
        },
        "timing": _timing(facts, stats, log_timing),
        "throughput": throughput,
        "time_to_target": time_to_target,
        **({"time_to_train": time_to_train} if time_to_train is not None else {}),
        "batch": _batch(facts, workload),
        "model": _model(facts, workload),
        "hardware": {
            "gpu_name": facts.gpu_name,
            "num_gpus": facts.num_gpus,
            "num_nodes": facts.num_nodes,
            "dtype": facts.dtype,
            "peak_tflops": facts.peak_tflops,
            "peak_source": facts.peak_source,
            "precision_mix": facts.precision_mix,
        },
        "parallel": facts.parallel,
        "environment": facts.environment,
        "settings": facts.settings,
        "files": {"steps_jsonl": dict(facts.steps_jsonl) if facts.steps_jsonl else None},
        "goodput": goodput,
        **({"stalls": stalls} if stalls is not None else {}),
        **{name: None for name in EXPLAINED}, **(explained or {}),
    }


def _batch(facts: RunFacts, workload: Workload) -> dict[str, Any]:
    counted = workload.counted
    return {
        "global_batch_size": facts.global_batch_size,
        "micro_batch_size": facts.micro_batch_size,
        "seq_length": facts.seq_length,
        "tokens_per_step": workload.tokens_per_step,
        "token_count": _count_source(counted and counted.tokens, workload.tokens_per_step),
        "layout": facts.batch_layout,
        "counted": _counted(counted),
        "uncounted": facts.batch_uncounted,
        "uncounted_batches": facts.batch_uncounted_batches,
        "rampup": facts.batch_ramp,
    }


def _model(facts: RunFacts, workload: Workload) -> dict[str, Any]:
    counted = workload.counted
    return {
        "name": facts.model_name,
        "flops_per_sample": facts.flops_per_sample,
        "flops_per_step": workload.step_flops,
        "flops_count": _count_source(counted and counted.flops, workload.step_flops),
        "flops_formula": facts.flops_formula,
        "spec": facts.spec_dict,
        **({"measured_flops": facts.measured_flops} if facts.flops_formula == MEASURED else {}),
        "mfu_convention": mfu_convention(facts),
    }


def _count_source(counted: float | None, value: float | None) -> str | None:
    """Where a per-step figure comes from: "batch" (counted), "config", or None (unknown)."""
    return "batch" if counted is not None else "config" if value is not None else None


def _counted(counted: CountedStep | None) -> dict[str, Any] | None:
    """The batch section's mean measured step as its packed or padded batches held it."""
    if counted is None:
        return None
    return {"source": counted.source, "tokens_per_step": counted.tokens, "slots_per_step": counted.slots,
            "padding_share": counted.padding_share, "seqlen_sq_per_step": counted.seqlen_sq}


def _timing(facts: RunFacts, stats: RunStats, log_timing: LogTiming | None) -> dict[str, Any]:
    """The timing section, seconds; an imported log's without per-rank figures (one rank's view)."""
    per_rank = log_timing is None
    straggler = stats.straggler() if per_rank else None
    if straggler is not None and straggler["rank"] < len(facts.places):
        place = facts.places[straggler["rank"]]
        straggler = {**straggler, "host": place["host"], "gpu_index": place["gpu_index"]}
    outlier_count, outlier_steps = stats.outliers()
    timing = {
        "step_time_s": stats.step_time_summary(),
        "outlier_count": outlier_count,
        "outlier_steps": outlier_steps,
        "steps_measured": stats.steps_measured,
        "warmup_steps": stats.warmup_steps,
        "skipped_steps": len(stats.skipped),  # iterations the framework skipped (Bridge's skipped_iter)
        "last_step": stats.last_step,
        "per_rank_step_time_s": stats.per_rank_step_time_s() if per_rank else None,
        "per_rank_local_time_s": stats.per_rank_phase_s("local_s") if per_rank else None,
        "slowest_rank": straggler["rank"] if straggler else None,
        "straggler": straggler,
        "breakdown_s": {name.removesuffix("_s"): _mean(stats.per_rank_phase_s(name)) for name in PHASE_TIMES},
    }
    if log_timing is not None:
        timing.update(window=log_timing.window, steps=log_timing.steps,
                      excluded_step_times=log_timing.excluded_step_times)
    return timing


def outliers_text(timing: dict[str, Any]) -> str | None:
    """A summary's outlier steps in words (the headline, the final log line, report's note): how many,
    the longest, and the median beside the mean that counts them; None without outliers."""
    count, longest, step = timing.get("outlier_count"), (timing.get("outlier_steps") or [None])[0], timing["step_time_s"]
    if not count or not isinstance(longest, dict) or not step:
        return None
    phase = f", in {printable(longest['phase'])}" if longest.get("phase") else ""
    return (f"{count} (the longest: step {longest['step']}, {longest['step_time_s']:.4g} s{phase}); the mean step "
            f"time {step['mean']:.4g} s counts {'them' if count > 1 else 'it'}, the median is {step['median']:.4g} s")


def mfu_convention(facts: RunFacts) -> dict[str, Any]:
    """What an MFU figure of this run means beyond the peak and dtype (the hardware section's):
    the FLOPs convention, and ``causal_attention``: causal attention counted at the full or half
    s x s score matrix; None when the FLOPs were given (the convention is the giver's)."""
    return {"formula": facts.flops_formula, "causal_attention": CAUSAL_ATTENTION.get(facts.flops_formula)}


def json_text(obj: Any) -> str:
    """``obj`` as JSON, indented by two spaces a level, with each array that holds no object or array
    on one line: a summary's every ``[step, seconds]`` of a long imported log takes one short line,
    not four (a third of the bytes)."""
    return _json_value(obj, "") + "\n"


_ENCODE = json.JSONEncoder(allow_nan=False).encode  # one encoder, not one per value (a million steps' worth)


def _json_value(value: Any, pad: str) -> str:
    inner = pad + "  "
    if isinstance(value, dict) and value:
        entries = (f"{inner}{_ENCODE(key if isinstance(key, str) else _ENCODE(key))}: {_json_value(item, inner)}"
                   for key, item in value.items())
        return "{\n" + ",\n".join(entries) + f"\n{pad}}}"
    if isinstance(value, (list, tuple)) and any(isinstance(item, (dict, list, tuple)) for item in value):
        return "[\n" + ",\n".join(inner + _json_value(item, inner) for item in value) + f"\n{pad}]"
    return _ENCODE(value)


def write_json_atomic(path: str | os.PathLike, obj: Any, durable: bool = True) -> None:
    """Write ``obj`` as JSON (:func:`json_text`) so that readers see the old file or the new one, never a mix."""
    write_text_atomic(path, json_text(obj), durable)


class SummaryFile:
    """One JSON file rewritten in the background while a run goes on.

    ``update`` hands the content to a worker thread and returns at once, so the training loop
    never waits for the disk; a request still waiting is replaced by the newer one. ``write_now``
    writes on the caller's thread (a kill may follow: SIGTERM), and nothing handed over before it
    is written after it. ``close`` waits for the worker, then writes the final content on the
    caller's thread, flushed.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self._latest: Any = None
        self._version = 0  # of the latest content handed over; a write of an older one is skipped
        self._written = 0  # the version on disk
        self._closed = False
        self._failing = False  # the last background write failed
        self._wakeup = threading.Condition()
        self._writing = threading.Lock()  # one write at a time, in version order
        self._worker = threading.Thread(target=self._run, name="nemo-throughput-summary", daemon=True)
        self._worker.start()

    def update(self, content: dict[str, Any]) -> None:
        with self._wakeup:
            self._version += 1
            self._latest = content
            self._wakeup.notify()

    def write_now(self, content: dict[str, Any]) -> None:
        """Write ``content`` before returning (after a background write in progress, never before
        one of older content that would replace it)."""
        with self._wakeup:
            self._version += 1
            version, self._latest = self._version, None
        self._write(content, version)

    def _write(self, content: dict[str, Any], version: int) -> None:
        with self._writing:
            if version < self._written:
                return  # newer content is on disk already
            write_json_atomic(self.path, content, durable=False)
            self._written = version

    def close(self, final: dict[str, Any]) -> None:
        with self._wakeup:
            self._closed, self._latest = True, None
            self._wakeup.notify()
        self._worker.join()
        write_json_atomic(self.path, final, durable=True)

    def _run(self) -> None:
        while True:
            with self._wakeup:
                self._wakeup.wait_for(lambda: self._latest is not None or self._closed)
                if self._closed:
                    return
                content, version, self._latest = self._latest, self._version, None
            try:
                self._write(content, version)
            except (OSError, ValueError) as error:  # the run goes on; the final write will tell
                if not self._failing:  # once, not every interval of a long full-disk spell
                    log.warning("nemo-throughput: could not write %s: %s; it keeps its last good version, "
                                "and the next updates will be tried", self.path, error)
                self._failing = True
            else:
                if self._failing:
                    log.warning("nemo-throughput: %s written again", self.path)
                self._failing = False


def append_jsonl(path: str | os.PathLike, rows: Iterable[dict[str, Any]]) -> None:
    """Append one JSON object per line, all rows or none: a failed write (a full disk) is cut
    back to where the file ended, so that the file never holds a half line."""
    path = Path(path)
    data = "".join(json.dumps(row, allow_nan=False) + "\n" for row in rows).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        end = os.fstat(fd).st_size
        try:
            written = 0
            while written < len(data):
                written += os.write(fd, data[written:])
        except BaseException:
            os.ftruncate(fd, end)
            raise
    finally:
        os.close(fd)


class OutputDirError(NemoThroughputError, OSError):
    """The output directory cannot be written: raised at set-up, before any training."""


def claim_output_dir(directory: str | os.PathLike, run_name: str, run_id: str) -> Path:
    """The directory this run writes to, made its own; checks on the way that it can be written.

    ``directory`` itself when no other run wrote there, else ``directory/<run name>`` (then
    ``-2``, ``-3``...): two runs never share a summary or a steps file. Ownership is a small
    file created exclusively, which is also the write probe (a full disk fails here, not at the
    end of the run).
    """
    requested = Path(directory)
    try:
        requested.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise _output_dir_error(requested, requested, error) from error
    for candidate in _candidate_dirs(requested, run_name):
        try:
            candidate.mkdir(exist_ok=True)
            if any((candidate / name).exists() for name in ("summary.json", STEPS_FILE)):
                continue  # written by another run (or by a version without ownership files)
            fd = os.open(candidate / CLAIM_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            continue
        except OSError as error:
            raise _output_dir_error(requested, candidate, error) from error
        try:
            with os.fdopen(fd, "w") as f:
                json.dump({"run_id": run_id, "name": run_name, "host": socket.gethostname(), "pid": os.getpid(),
                           "claimed_at": now_iso()}, f)
                f.flush()
                os.fsync(f.fileno())
        except OSError as error:
            (candidate / CLAIM_FILE).unlink(missing_ok=True)
            raise _output_dir_error(requested, candidate, error) from error
        if candidate != requested:
            log.warning("nemo-throughput: %s holds another run's results; this run writes to %s", requested, candidate)
        return candidate
    raise OutputDirError(f"nemo-throughput: {requested} already holds the results of {_MAX_SAME_NAME} runs named "
                         f"{run_name!r}; "
                         "set output_dir=... or run_name=... to something new.")


def _candidate_dirs(requested: Path, run_name: str) -> Iterator[Path]:
    yield requested
    subdirectory = run_name.replace(os.sep, "_")
    if subdirectory in (".", ".."):  # a name, never a way out of the directory
        subdirectory = subdirectory.replace(".", "_")
    yield requested / subdirectory
    for n in range(2, _MAX_SAME_NAME + 1):
        yield requested / f"{subdirectory}-{n}"


def _output_dir_error(requested: Path, candidate: Path, error: OSError) -> OutputDirError:
    full = " (the disk is full)" if error.errno in (errno.ENOSPC, errno.EDQUOT) else ""
    return OutputDirError(
        error.errno, f"nemo-throughput: cannot write to the output directory {printable(candidate)}{full}: "
        f"{error.strerror or error}. Set output_dir=... (callbacks.throughput.output_dir=... with Hydra, or "
        f"$NEMO_THROUGHPUT_OUTPUT_DIR) to a writable directory with free space."
        + (f" (asked for {requested})" if candidate != requested else ""))


MAX_SUMMARY_BYTES = 64 * 1024 ** 2  # the most a summary is read from; an import writes no more (2.5M steps)


def read_summary(path: str | os.PathLike) -> dict[str, Any]:
    """Load a summary, checking that it is one of ours and of this schema version. Read from a
    regular file of at most MAX_SUMMARY_BYTES only, never waiting: a FIFO where a summary belongs
    would hang every reader (report, compare, import)."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        try:  # looked at before it is read as a file: a directory's cannot be
            status = os.fstat(descriptor)
            if not stat.S_ISREG(status.st_mode) or status.st_size > MAX_SUMMARY_BYTES:
                raise ValueError(f"{path}: not a summary file (a FIFO, device or directory, or over "
                                 f"{MAX_SUMMARY_BYTES // 1024 ** 2} MiB)")
            with os.fdopen(descriptor, "rb", closefd=False) as file:
                summary = json.loads(file.read())
        finally:
            os.close(descriptor)
    except OSError as error:  # its own text: the error's filename would be the descriptor's number
        raise ValueError(f"{path}: not a readable JSON summary ({error.strerror or error})") from error
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path}: not a readable JSON summary ({error})") from error
    schema = summary.get("schema") if isinstance(summary, dict) else None
    if schema != SCHEMA:
        raise ValueError(f"{path}: schema is {schema!r}, this version reads {SCHEMA!r}")
    return summary



def _mean(values: list[float] | None) -> float | None:
    return sum(values) / len(values) if values else None
