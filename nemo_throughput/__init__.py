"""nemo-throughput: step timing, tokens/s and MFU for NeMo / Megatron GPT pretraining.

Layers, dependencies pointing one way (tests/test_structure.py checks the arrows):

* base, what every layer shares: errors (the exceptions), text (text safe to print), values (what
  counts as a number: never a bool; as a stated name: never a placeholder), window (the step window
  of report, import and bench), student_t (Student's t quantiles, for the bench's and compare's
  intervals).
* core, no framework (torch at most): config (the settings), flops (FLOPs formulas),
  measured_flops (FLOPs counted on one real step), hardware (GPU peaks), megatron_config (a
  megatron-core config read duck-typed), throughput (rates, MFU), timing (the step clock),
  run_stats (the statistics, plain Python), distributed (is a process group up; the set-up
  collectives), aggregation (the cross-rank exchange), summary (the run summary), environment and
  redact (where a run ran, secrets left out), target (time to target),
  batches (a batch's layout; packed and padded batches counted), batch_checks (a micro-batch's lengths
  read and checked on the device), goodput/ (ledger: a segment's ledger, the run's goodput across
  restarts; segments: which run a segment continues; run: rank 0's view), signals (SIGTERM),
  background (the reporting thread),
  progress (an interval's live line, the loggers' metrics and steps.jsonl rows), prometheus (the
  live /metrics endpoint), outputs (where commands write), presets
  (named model shapes); explain/ (run, telemetry, telemetry_stats, network, profiler, probe: why the
  numbers are what they are); run_facts (a run's facts: worked out at set-up, frozen, and what the
  run learns after); run/ (a measured run, which every adapter drives: measurement, its hot path and
  life cycle; startup, the one set-up of every stack; reporting, each interval and the summary;
  publishing, where the summary goes and how the run's end is written down; stall, the stall watch).
* adapters: lightning (the Lightning callback), megatron_bridge (the Bridge callback), nemo (NeMo
  model config readers), nemo_run (``nemo_callback``, the NeMo 2 / NeMo-Run entry), hydra (the job
  callback and Lightning's callbacks_factory).
* summaries in and out: importers/ (logs, lines, steps, segments: which part of a restarted log,
  and one module per format: nemo, megatron, tensorboard, and the package mlperf/ (tree: the result
  files found in the folders given; systems: systems/<system>.json, and the one check of every stated
  count; result_log: one result file read with mlperf-logging's parser and compliance checker;
  result_summary: the summary of one result: time to train, counts, samples/s and notes);
  crosscheck: the facts given against a log's own TFLOP/s, with crosscheck_megatron and
  crosscheck_nemo: each framework's fields and counts) make summaries of logs; report/ (runs,
  fields, comparable: which runs may be averaged, compared or scaled; segments: a resumed run's
  summaries joined; goodput: the runs' goodput table; grouping, rendering, time_to_train, plots)
  makes tables and plots of summaries; compare/ (sides, stats, comparison, render) says whether a
  candidate's runs are slower than a baseline's.
* entry points: cli and the ``command`` modules (report, compare, importers, launch, bench, demo,
  explain.probe_command); launch/ (slurm, kubernetes), bench/ (trials, harness, syncs, stats,
  render, log_step, stand_in: a slow NVML), demo/ (gpt, train, console), conf/ (the Hydra config groups).
"""

import importlib
import logging

__version__ = "0.1.0"

# Public name -> the module that defines it, imported on first use: `import nemo_throughput` (the CLI,
# Lightning's callbacks_factory entry point) loads neither torch nor Lightning until a name needs them.
_MODULE_OF = {
    "BridgeThroughputCallback": "nemo_throughput.adapters.megatron_bridge",
    "FORMULAS": "nemo_throughput.flops",
    "SCHEMA": "nemo_throughput.summary",
    "ModelSpec": "nemo_throughput.flops",
    "NemoThroughputError": "nemo_throughput.errors",
    "ThroughputCallback": "nemo_throughput.adapters.lightning",
    "ThroughputConfig": "nemo_throughput.config",
    "Workload": "nemo_throughput.throughput",
    "mfu": "nemo_throughput.throughput",
    "nemo_callback": "nemo_throughput.adapters.nemo_run",
    "model_flops_per_sample": "nemo_throughput.flops",
    "peak_tflops": "nemo_throughput.hardware",
    "read_summary": "nemo_throughput.summary",
}
__all__ = list(_MODULE_OF)


def __getattr__(name: str):
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_MODULE_OF[name]), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


class _StderrUntilTheAppConfiguresLogging(logging.StreamHandler):
    """Prints our records while the root logger has no handlers, and nothing once it has.

    Our records always propagate, so an application that configures logging (before or after
    importing us) gets each of them once, through its own handlers and format; we never touch
    the root logger.
    """

    def emit(self, record: logging.LogRecord) -> None:
        if not logging.getLogger().handlers:
            super().emit(record)


# Like Lightning: show our INFO lines (one per log interval) when the app configured no logging.
_log = logging.getLogger(__name__)
_log.addHandler(_StderrUntilTheAppConfiguresLogging())
if not logging.getLogger().handlers:
    _log.setLevel(logging.INFO)
