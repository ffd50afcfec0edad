"""Summaries for runs made without the plugin, from what they left behind:

* NeMo training logs (a Slurm .out file): the progress lines with ``train_step_timing in s``,
  as NeMo 1.x's tqdm bar (``global_step=9.000, ..., train_step_timing in s=3.41``) and NeMo 2's
  ProgressPrinter (``iteration 9/99 | ... | train_step_timing in s: 3.41``) print them;
* Megatron-LM logs: ``iteration 10/1000 | ... | elapsed time per iteration (ms): 3410.5 | ...
  | global batch size: 128 |``;
* TensorBoard event files of NeMo runs: the ``train_step_timing in s`` scalar.

Steps are numbered from 1 as in the callback's summaries (NeMo's 0-based global step + 1). A
value that a log prints as the average of a logging interval counts as one sample at its step.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from nemo_throughput import environment
from nemo_throughput.aggregation import RunStats, steps_tensor
from nemo_throughput.flops import ModelSpec, model_flops_per_sample
from nemo_throughput.hardware import identify, peak_tflops
from nemo_throughput.report.runs import ReportError, Window
from nemo_throughput.summary import RunFacts, build_summary
from nemo_throughput.timing import StepTimes

FORMATS = ("nemo", "megatron", "tensorboard")
NEMO_TAG = "train_step_timing in s"

_NUMBER = r"([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"
_NEMO_TIME = re.compile(NEMO_TAG + r"\s*[=:]\s*" + _NUMBER)
_NEMO_GLOBAL_STEP = re.compile(r"global_step\s*[=:]\s*([0-9]+)(?:\.0*)?\b")
_NEMO_ITERATION = re.compile(r"iteration ([0-9]+)/[0-9]+")
_MEGATRON = re.compile(r"iteration\s+([0-9]+)/\s*[0-9]+\s*\|.*?elapsed time per iteration \(ms\):\s*" + _NUMBER)
_MEGATRON_BATCH = re.compile(r"global batch size:\s*([0-9]+)")


def detect_format(path: Path) -> str:
    if path.is_dir() or "tfevents" in path.name:
        return "tensorboard"
    text = _read_text(path)
    if "elapsed time per iteration (ms)" in text:
        return "megatron"
    if NEMO_TAG in text:
        return "nemo"
    raise ReportError(f"{path}: no step lines: neither NeMo's `{NEMO_TAG}` nor Megatron-LM's "
                      "`elapsed time per iteration (ms)` appears in it")


def read_steps(path: Path, fmt: str) -> tuple[list[tuple[int, float]], dict[str, int]]:
    """(step, seconds) in step order, and facts the log itself states (Megatron's global batch)."""
    facts: dict[str, int] = {}
    steps: dict[int, float] = {}  # a step printed twice (progress bar refreshes): the last print wins
    if fmt == "tensorboard":
        for step, value in _tensorboard_scalars(path, NEMO_TAG):
            steps[step + 1] = value
    else:
        for line in re.split(r"[\r\n]+", _read_text(path)):
            if fmt == "megatron":
                match = _MEGATRON.search(line)
                if match:
                    steps[int(match.group(1))] = float(match.group(2)) / 1e3
                    batch = _MEGATRON_BATCH.search(line)
                    if batch:
                        facts["global_batch_size"] = int(batch.group(1))
            elif (time_match := _NEMO_TIME.search(line)):
                step_match = _NEMO_GLOBAL_STEP.search(line) or _NEMO_ITERATION.search(line)
                if step_match:
                    steps[int(step_match.group(1)) + 1] = float(time_match.group(1))
    if not steps:
        what = {"nemo": f"`{NEMO_TAG}` progress lines", "megatron": "`elapsed time per iteration (ms)` lines",
                "tensorboard": f"`{NEMO_TAG}` scalars"}[fmt]
        raise ReportError(f"{path}: no {what} with a step number found")
    return sorted(steps.items()), facts


def import_run(path: Path, *, fmt: str | None = None, global_batch_size: int | None, seq_length: int,
               spec: ModelSpec, model_name: str, num_gpus: int, num_nodes: int, label: str,
               window: Window | None = None, warmup_steps: int = 10, gpu_name: str | None = None,
               dtype: str | None = None, peak: float | None = None, flops_formula: str = "megatron",
               orchestrator: str | None = None) -> dict[str, Any]:
    """A schema-v1 summary of a run from its log; the facts a log lacks come as arguments."""
    fmt = fmt or detect_format(path)
    if fmt not in FORMATS:
        raise ReportError(f"unknown log format {fmt!r}; choose one of {list(FORMATS)}")
    steps, stated = read_steps(path, fmt)
    if global_batch_size is None:
        global_batch_size = stated.get("global_batch_size")
        if global_batch_size is None:
            raise ReportError(f"{path}: the log does not state the global batch size: give --global-batch-size")
    elif stated.get("global_batch_size", global_batch_size) != global_batch_size:
        raise ReportError(f"{path}: --global-batch-size {global_batch_size} but the log says "
                          f"{stated['global_batch_size']}")
    spec = ModelSpec.from_dict({**spec.to_dict(), "seq_length": seq_length})

    stats = RunStats(world_size=1, warmup_steps=0 if window else warmup_steps)
    counted = window.select(steps) if window else steps
    if not [s for s in counted if not stats.is_warmup(s[0])]:
        raise ReportError(f"{path}: no step left to measure: it has steps {steps[0][0]} to {steps[-1][0]}, "
                          + (f"--window {window.text}" if window else f"the first {warmup_steps} are warm-up"))
    stats.add(steps_tensor([[StepTimes(step, seconds) for step, seconds in counted]]))

    if peak is not None:
        peak_source = "user"
    elif gpu_name and dtype:
        peak = peak_tflops(gpu_name, dtype)
        peak_source = f"table:{identify(gpu_name).name}" if peak is not None else None
    else:
        peak_source = None
    facts = RunFacts(
        name=path.stem if path.is_file() else path.name, label=label, global_batch_size=global_batch_size,
        micro_batch_size=None, seq_length=seq_length, model_name=model_name, model_spec=spec,
        flops_formula=flops_formula, flops_per_sample=model_flops_per_sample(spec, flops_formula),
        gpu_name=gpu_name or "unknown", num_gpus=num_gpus, num_nodes=num_nodes, dtype=dtype, peak_tflops=peak,
        peak_source=peak_source, source=f"import:{fmt}",
        environment={"orchestrator": orchestrator or "unknown", "imported_from": str(path),
                     "versions": environment.library_versions()},
    )
    summary = build_summary(facts, stats, "completed")
    timing = summary["timing"]
    timing.update(window=window.text if window else f"{warmup_steps + 1}:", steps=[list(s) for s in steps],
                  per_rank_step_time_s=None, per_rank_local_time_s=None, slowest_rank=None, straggler=None)
    return summary


def _read_text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError as error:
        raise ReportError(f"{path}: cannot read it ({error.strerror})") from error


# ------------------------------------------------------------------------------------ TensorBoard
def _tensorboard_scalars(path: Path, tag: str) -> Iterator[tuple[int, float]]:
    """(step, value) of one scalar tag in a TensorBoard event file or a directory of them."""
    files = sorted(path.rglob("*tfevents*")) if path.is_dir() else [path]
    if not files:
        raise ReportError(f"{path}: no TensorBoard event files (*tfevents*) in it")
    for file in files:
        try:
            with file.open("rb") as f:
                for record in _tfrecords(f):
                    yield from _scalars_of_event(record, tag)
        except (OSError, ValueError, struct.error) as error:
            raise ReportError(f"{file}: not a readable TensorBoard event file ({error})") from error


def _tfrecords(f: BinaryIO) -> Iterator[bytes]:
    # TFRecord: uint64 length, uint32 length CRC, data, uint32 data CRC (little-endian).
    while header := f.read(12):
        if len(header) < 12:
            raise ValueError("truncated record")
        (length,) = struct.unpack("<Q", header[:8])
        data = f.read(length)
        if len(data) < length or len(f.read(4)) < 4:
            raise ValueError("truncated record")
        yield data


def _scalars_of_event(event: bytes, tag: str) -> Iterator[tuple[int, float]]:
    # Event{2: step (varint), 5: Summary{1: repeated Value{1: tag, 2: simple_value (float),
    # 8: TensorProto{1: dtype, 5: float_val, 6: double_val}}}}
    step = 0
    summaries = []
    for number, _, value in _protobuf_fields(event):
        if number == 2:
            step = value
        elif number == 5:
            summaries.append(value)
    for summary in summaries:
        for number, _, value in _protobuf_fields(summary):
            if number != 1:
                continue
            fields = {n: v for n, _, v in _protobuf_fields(value)}
            if fields.get(1, b"").decode(errors="replace") != tag:
                continue
            if 2 in fields:
                yield step, struct.unpack("<f", fields[2])[0]
            elif 8 in fields:
                yield step, _tensor_scalar(fields[8])


def _tensor_scalar(tensor: bytes) -> float:
    fields = {n: v for n, _, v in _protobuf_fields(tensor)}
    if 5 in fields:  # float_val, packed
        return struct.unpack("<f", fields[5][:4])[0]
    if 6 in fields:  # double_val, packed
        return struct.unpack("<d", fields[6][:8])[0]
    content, dtype = fields.get(4, b""), fields.get(1, 1)
    return struct.unpack("<d" if dtype == 2 else "<f", content[:8 if dtype == 2 else 4])[0]


def _protobuf_fields(buffer: bytes) -> Iterator[tuple[int, int, Any]]:
    i = 0
    while i < len(buffer):
        key, i = _varint(buffer, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(buffer, i)
        elif wire == 1:
            value, i = buffer[i:i + 8], i + 8
        elif wire == 2:
            length, i = _varint(buffer, i)
            value, i = buffer[i:i + length], i + length
        elif wire == 5:
            value, i = buffer[i:i + 4], i + 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        yield number, wire, value


def _varint(buffer: bytes, i: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = buffer[i]
        i += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, i
        shift += 7
