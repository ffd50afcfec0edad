"""The versioned JSON run summary, and writers that never leave a file half-written."""

from __future__ import annotations

import datetime as dt
import functools
import json
import logging
import os
import tempfile
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nemo_throughput.aggregation import RunStats
from nemo_throughput.flops import ModelSpec
from nemo_throughput.throughput import Workload
from nemo_throughput.timing import PHASE_TIMES

log = logging.getLogger(__name__)

SCHEMA = "nemo-throughput/summary/v1"
STATUSES = ("running", "completed", "failed", "interrupted")
USER_FLOPS = "user"  # model.flops_formula when flops_per_sample was given, not computed


@dataclass
class RunFacts:
    """What is known about a run before its first step; the summary adds the measurements."""

    name: str
    label: str
    global_batch_size: int
    micro_batch_size: int | None
    seq_length: int
    model_name: str
    model_spec: ModelSpec | None  # None when flops_per_sample was given and the shape is unknown
    flops_formula: str  # a name of flops.FORMULAS, or USER_FLOPS when flops_per_sample was given
    flops_per_sample: float | None
    gpu_name: str
    num_gpus: int
    num_nodes: int
    dtype: str | None
    peak_tflops: float | None
    peak_source: str | None  # "table:<part>", "user", or None when unknown
    parallel: dict[str, int] = field(default_factory=dict)
    environment: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    started_at: str = field(default_factory=lambda: now_iso())
    source: str = "callback"  # or "import:<log format>"

    @functools.cached_property
    def spec_dict(self) -> dict[str, Any] | None:
        return self.model_spec.to_dict() if self.model_spec is not None else None

    @property
    def workload(self) -> Workload:
        return Workload(
            global_batch_size=self.global_batch_size,
            seq_length=self.seq_length,
            num_gpus=self.num_gpus,
            flops_per_sample=self.flops_per_sample,
            peak_tflops=self.peak_tflops,
        )


def build_summary(facts: RunFacts, stats: RunStats, status: str, error: str | None = None) -> dict[str, Any]:
    if status not in STATUSES:
        raise ValueError(f"Unknown status {status!r}; expected one of {STATUSES}")
    straggler = stats.straggler()
    breakdown = {name.removesuffix("_s"): _mean(stats.per_rank_phase_s(name)) for name in PHASE_TIMES}
    return {
        "schema": SCHEMA,
        "status": status,
        "error": error,
        "run": {
            "name": facts.name,
            "label": facts.label,
            "source": facts.source,
            "started_at": facts.started_at,
            "updated_at": now_iso(),
        },
        "timing": {
            "step_time_s": stats.step_time_summary(),
            "steps_measured": stats.steps_measured,
            "warmup_steps": stats.warmup_steps,
            "last_step": stats.last_step,
            "per_rank_step_time_s": stats.per_rank_step_time_s(),
            "per_rank_local_time_s": stats.per_rank_phase_s("local_s"),
            "slowest_rank": straggler["rank"] if straggler else None,
            "straggler": straggler,
            "breakdown_s": breakdown,
        },
        "throughput": facts.workload.metrics(stats.mean_step_time_s()),
        "batch": {
            "global_batch_size": facts.global_batch_size,
            "micro_batch_size": facts.micro_batch_size,
            "seq_length": facts.seq_length,
            "tokens_per_step": facts.workload.tokens_per_step,
        },
        "model": {
            "name": facts.model_name,
            "flops_per_sample": facts.flops_per_sample,
            "flops_formula": facts.flops_formula,
            "spec": facts.spec_dict,
        },
        "hardware": {
            "gpu_name": facts.gpu_name,
            "num_gpus": facts.num_gpus,
            "num_nodes": facts.num_nodes,
            "dtype": facts.dtype,
            "peak_tflops": facts.peak_tflops,
            "peak_source": facts.peak_source,
        },
        "parallel": facts.parallel,
        "environment": facts.environment,
        "settings": facts.settings,
    }


def write_json_atomic(path: str | os.PathLike, obj: Any, durable: bool = True) -> None:
    """Write ``obj`` as JSON so that readers see the old file or the new one, never a mix.

    Serialises first, then writes a temporary file in the same directory and renames it over
    ``path`` (atomic on POSIX file systems). ``durable`` also fsyncs it before the rename, so
    that it survives a machine crash, at the cost of a disk flush (about a millisecond).
    """
    path = Path(path)
    text = json.dumps(obj, indent=2, allow_nan=False) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class SummaryFile:
    """One JSON file rewritten in the background while a run goes on.

    ``update`` hands the content to a worker thread and returns at once, so the training loop
    never waits for the disk; a request still waiting is replaced by the newer one. ``close``
    waits for the worker, then writes the final content on the caller's thread, flushed.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self._latest: Any = None
        self._closed = False
        self._wakeup = threading.Condition()
        self._worker = threading.Thread(target=self._run, name="nemo-throughput-summary", daemon=True)
        self._worker.start()

    def update(self, content: dict[str, Any]) -> None:
        with self._wakeup:
            self._latest = content
            self._wakeup.notify()

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
                content, self._latest = self._latest, None
            try:
                write_json_atomic(self.path, content, durable=False)
            except (OSError, ValueError) as error:  # the run goes on; the final write will tell
                log.warning("nemo-throughput: could not write %s: %s", self.path, error)


def append_jsonl(path: str | os.PathLike, rows: Iterable[dict[str, Any]]) -> None:
    """Append one JSON object per line and flush, so a crash loses at most the last interval."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        for row in rows:
            f.write(json.dumps(row, allow_nan=False) + "\n")
        f.flush()


def read_summary(path: str | os.PathLike) -> dict[str, Any]:
    """Load a summary, checking that it is one of ours and of this schema version."""
    try:
        summary = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"{path}: not a readable JSON summary ({error})") from error
    schema = summary.get("schema") if isinstance(summary, dict) else None
    if schema != SCHEMA:
        raise ValueError(f"{path}: schema is {schema!r}, this version reads {SCHEMA!r}")
    return summary


def now_iso() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def _mean(values: list[float] | None) -> float | None:
    return sum(values) / len(values) if values else None
