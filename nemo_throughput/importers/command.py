"""`nemo-throughput import`: summaries of runs made without the plugin, from their logs."""

from __future__ import annotations

import argparse
import functools
import json
import math
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nemo_throughput.config import check_batch_or_length, check_one_seq_length
from nemo_throughput.errors import ReportError
from nemo_throughput.flops import FORMULAS, ModelSpec
from nemo_throughput.hardware import DTYPES
from nemo_throughput.importers import DEFAULT_GPUS_PER_NODE, mlperf, notice, segments
from nemo_throughput.importers.logs import FORMATS, Imported, import_run
from nemo_throughput.outputs import check_output_dir, check_output_file, write_text_atomic
from nemo_throughput.presets import PRESETS, preset
from nemo_throughput.summary import MAX_SUMMARY_BYTES, json_text
from nemo_throughput.text import printable
from nemo_throughput.window import Window


def add_parsers(commands: argparse._SubParsersAction) -> None:
    imports = commands.add_parser(
        "import", help="summaries from NeMo / Megatron-LM logs, TensorBoard event files or MLPerf result files "
                       "of runs without the plugin",
        description="Writes <output-dir>/<name>/summary.json per input, from the step times the log holds and "
                    "the facts it lacks, given here. <name> is the input's file name, with as many parent "
                    "directories as it takes to tell the inputs apart. Importing the same input again replaces "
                    "its summary; a summary of another input or run is never replaced.")
    imports.set_defaults(handler=run_import)
    imports.add_argument("logs", nargs="+", type=Path, help="log files, event files or directories of them")
    imports.add_argument("--format", choices=("auto", *FORMATS), default="auto",
                         help="auto: directories and event files (by name or first bytes) are tensorboard, a text "
                              "log's format is told by its lines; tensorboard reads NeMo's train_step_timing scalar "
                              "or Megatron-LM / Megatron-Bridge's iteration-time (written with "
                              "--log-timers-to-tensorboard)")
    imports.add_argument("--label", help="run.label, e.g. bare-metal or kubernetes (required; with --format mlperf "
                                         "the default is the log's system name)")
    model = imports.add_mutually_exclusive_group()
    model.add_argument("--model", help=f"size preset: {', '.join(PRESETS)}")
    model.add_argument("--model-spec", help='ModelSpec fields as JSON, e.g. \'{"num_layers": 12, ...}\' (a '
                       'seq_length in it must be --seq-length)')
    imports.add_argument("--flops-per-sample", type=float, help="model FLOPs per sample as published (recorded as "
                         "given, formula 'user'); then --model and --model-spec are optional")
    imports.add_argument("--model-name", help="model.name (default: the preset, or one from the parameter count)")
    imports.add_argument("--global-batch-size", type=int, help="samples per step (checked against the log where it "
                                                               "states it)")
    imports.add_argument("--seq-length", type=int, help="required, except with --format mlperf")
    imports.add_argument("--num-gpus", type=int, help="required, except with --format mlperf (there: only for logs "
                                                      "that do not state their accelerators)")
    imports.add_argument("--gpus-per-node", type=int, help=f"to count the nodes (default {DEFAULT_GPUS_PER_NODE}; "
                                                           "--format mlperf: the nodes of the log's "
                                                           "submission_platform, e.g. 18xNVIDIA GB200, where it "
                                                           "names them); --num-gpus fills whole nodes of it")
    imports.add_argument("--rank", help="the rank to read where several print (srun --label / torchrun prefix "
                                        "number, e.g. 0 or 1/7; default: the lowest)")
    imports.add_argument("--segment", help=segments.SEGMENT_HELP)
    imports.add_argument("--window", help="steps that count, e.g. 35:45, -10: or last (default: all after the "
                                          "--warmup steps)")
    imports.add_argument("--warmup", type=int, default=10, help="first steps of the log left out without --window "
                                                                "(10)")
    imports.add_argument("--gpu-name", help='driver name of the GPU, e.g. "NVIDIA H100 80GB HBM3", for MFU')
    imports.add_argument("--dtype", choices=DTYPES, help="dtype of the peak FLOPs, for MFU")
    imports.add_argument("--peak-tflops", type=float, help="per-GPU peak instead of the table's")
    imports.add_argument("--flops-formula", choices=FORMULAS, default="megatron",
                         help="the FLOPs convention MFU is counted by (default: megatron, causal attention halved)")
    imports.add_argument("--orchestrator", help="where it ran (slurm, kubernetes, ...), for the record")
    imports.add_argument("--output-dir", type=Path, default=Path("imported"),
                         help="where each input's <name>/summary.json goes (default: imported)")
    imports.add_argument("--ruleset", help="--format mlperf: the MLPerf Training ruleset to check compliance "
                                           "against, e.g. 4.0.0 (default: the newest the log complies with)")


def run_import(args: argparse.Namespace) -> int:
    """Import every input, then write every summary: nothing is written unless all of them import.
    Any failure is one line on stderr naming the input (or output) and exit code 2, never a traceback."""
    is_mlperf = args.format == mlperf.NAME
    progress = {"at": "arguments"}  # the input or output being handled, for the error message
    try:
        check_output_dir(args.output_dir, "--output-dir")
        written = _import_mlperf(args, progress) if is_mlperf else _import_logs(args, progress)
        reads = [Path(summary["environment"]["imported_from"]) for _, summary, _ in written]
        texts = []
        for path, summary, _ in written:
            check_summary_target(path, Path(summary["environment"]["imported_from"]), reads)
            texts.append(_summary_text(summary))
        for (path, _, say), text in zip(written, texts, strict=True):
            progress["at"] = str(path)
            write_text_atomic(path, text)
            say(path)
    except (ReportError, ValueError) as error:
        print(f"nemo-throughput import: {printable(error)}", file=sys.stderr)
        return 2
    except OSError as error:
        print(f"nemo-throughput import: {printable(error.filename or progress['at'])}: {error.strerror or error} "
              "(check the path "
              "and its permissions)", file=sys.stderr)
        return 2
    except Exception as error:  # noqa: BLE001 - an input must never end in a traceback
        what, hint = MLPERF_UNREADABLE if is_mlperf else ("could not import it", "(please report this with the file)")
        print(f"nemo-throughput import: {printable(progress['at'])}: {what} ({type(error).__name__}: "
              f"{printable(error)}) {hint}",
              file=sys.stderr)
        return 2
    return 0


def _summary_text(summary: dict[str, Any]) -> str:
    """The summary as written, refused where report and compare would not read it back."""
    text = json_text(summary)
    if len(text.encode()) > MAX_SUMMARY_BYTES:
        raise ReportError(f"{printable(summary['environment']['imported_from'])}: its summary, with every one of its "
                          f"{len(summary['timing']['steps']):,} steps, would be {len(text.encode()) / 1024 ** 2:,.0f} "
                          f"MiB, over the {MAX_SUMMARY_BYTES // 1024 ** 2} MiB a summary is read from (import part "
                          "of it with --window)")
    return text


Written = list[tuple[Path, dict, Callable[[Path], None]]]  # (summary path, summary, what to print once written)


def _import_logs(args: argparse.Namespace, progress: dict[str, str]) -> Written:
    _require(args, "label", "seq_length", "num_gpus")
    _check_arguments(args)
    if args.gpus_per_node is None:
        args.gpus_per_node = DEFAULT_GPUS_PER_NODE
    num_nodes = _whole_nodes(args.num_gpus, args.gpus_per_node)
    spec, model_name = _model(args)
    window = Window.parse(args.window) if args.window else None
    segment = segments.parse_choice(args.segment)
    names = output_names(args.logs)
    for log, name in zip(args.logs, names, strict=True):  # before any work; again before writing
        check_summary_target(_summary_path(args.output_dir, name), log, args.logs)
    written: Written = []
    for log, name in zip(args.logs, names, strict=True):
        progress["at"] = str(log)
        imported = import_run(
            log, fmt=None if args.format == "auto" else args.format, global_batch_size=args.global_batch_size,
            seq_length=args.seq_length, spec=spec, model_name=model_name, num_gpus=args.num_gpus,
            num_nodes=num_nodes, label=args.label, name=name, rank=args.rank,
            window=window, warmup_steps=args.warmup, gpu_name=args.gpu_name, dtype=args.dtype,
            peak=args.peak_tflops, flops_formula=args.flops_formula, flops_per_sample=args.flops_per_sample,
            orchestrator=args.orchestrator, segment=segment)
        written.append((_summary_path(args.output_dir, name), imported.summary,
                        functools.partial(_report, imported=imported, source=log)))
    return written


def _import_mlperf(args: argparse.Namespace, progress: dict[str, str]) -> Written:
    """`--format mlperf`: one summary per result file (the options of the other formats do not apply);
    a submitter folder (results/ and systems/) imports whole. The command's own warning is said once,
    before the first file's."""
    refuse_inapplicable_to_mlperf(args)
    _check_gpu_counts(args)
    found = mlperf.result_files(args.logs)
    imported = []
    for path, name in zip(found.files, output_names(found.files), strict=True):
        progress["at"] = str(path)
        try:
            summary, _ = mlperf.import_result(path, label=args.label, name=name, num_gpus=args.num_gpus,
                                              gpus_per_node=args.gpus_per_node, ruleset=args.ruleset,
                                              orchestrator=args.orchestrator, gpu_name=args.gpu_name)
        except mlperf.NotAResultFile as error:
            found.leave_out(path, error)
            continue
        imported.append((_summary_path(args.output_dir, name), summary))
    found.refuse_if_none(len(imported))
    mlperf.note_byte_copies([summary for _, summary in imported])
    once = (*found.notes(), *(() if args.ruleset else (mlperf.unnamed_round_note([s for _, s in imported]),)))
    return [(path, summary, functools.partial(say_mlperf_imported, summary=summary,
                                              notes=summary["time_to_train"]["notes"], once=once if i == 0 else ()))
            for i, (path, summary) in enumerate(imported)]


def output_names(logs: list[Path]) -> list[str]:
    """A directory name per input, unique within the call: the file's name, with as many parent
    directories in front as it takes to tell apart inputs of the same name."""
    resolved = [log.resolve() for log in logs]
    for i, path in enumerate(resolved):
        if path in resolved[:i]:
            raise ReportError(f"{logs[i]}: given twice (give each input once)")
    depth = 1
    while True:
        names = [_safe_name(_tail(log, depth)) for log in resolved]
        duplicated = {n for n in names if names.count(n) > 1}
        if not duplicated:
            return names
        if all(len(log.parts) <= depth for log in resolved):
            break
        depth += 1
    raise ReportError(f"inputs {', '.join(str(log) for log in logs)} give the same summary name "
                      f"{sorted(duplicated)[0]!r} (rename one, or import them with different --output-dir)")


def _tail(path: Path, depth: int) -> str:
    parts = list(path.parts[-depth:])
    parts[-1] = path.stem if path.is_file() else path.name
    return "-".join(p for p in parts if p not in ("/", ""))


def _safe_name(text: str) -> str:
    """Letters, digits, '.', '_' and '-' only, never starting with a dot: it stays one directory level."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).lstrip(".-").rstrip("-") or "run"


def _summary_path(output_dir: Path, name: str) -> Path:
    root = output_dir.resolve()
    target = (output_dir / name).resolve()
    if target.parent != root:
        raise ReportError(f"{output_dir / name}: would be written outside --output-dir {output_dir} (a link points "
                          "elsewhere: remove it or choose another --output-dir)")
    return output_dir / name / "summary.json"


def check_summary_target(path: Path, source: Path, reads: list[Path]) -> None:
    """`path` may receive the summary imported from `source`: it is new, or the summary of an earlier
    import of the same input (replaced), never another input's or run's summary nor an input."""
    if path.is_file() and _imported_from(path) == source.resolve():
        return
    earlier = _imported_from(path)
    if earlier is not None:
        raise ReportError(f"{printable(path)} is the summary imported from {printable(earlier)}, another input: "
                          "not replaced (give another --output-dir, or remove it first)")
    if path.parent.is_dir():
        check_output_file(path, "--output-dir", reads=reads)
    else:
        check_output_dir(path.parent, "--output-dir")


def _imported_from(path: Path) -> Path | None:
    """The input an existing imported summary was made from (resolved); None: not such a summary."""
    try:
        recorded = json.loads(path.read_text(encoding="utf-8"))["environment"]["imported_from"]
        return Path(recorded).resolve() if isinstance(recorded, str) and recorded else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _report(path: Path, imported: Imported, source: Path) -> None:
    for note in imported.notes:
        print(notice(source, note), file=sys.stderr)
    summary = imported.summary
    timing = summary["timing"]
    print(f"{printable(path)}: {timing['steps_measured']} steps ({timing['window']}), "
          f"{timing['step_time_s']['mean']:.4g} s/step, {summary['throughput']['tokens_per_s']:,.0f} tokens/s")


def _model(args: argparse.Namespace) -> tuple[ModelSpec | None, str]:
    if args.model:
        return preset(args.model), args.model_name or args.model.lower()
    if args.model_spec:
        spec = _spec_from_json(args.model_spec, args.seq_length)
        return spec, args.model_name or spec.default_name()
    if args.flops_per_sample is None:
        raise ReportError("give the model: --model, --model-spec, or --flops-per-sample as published")
    return None, args.model_name or "unknown"


def _require(args: argparse.Namespace, *names: str) -> None:
    missing = [f"--{name.replace('_', '-')}" for name in names if getattr(args, name) is None]
    if missing:
        raise ReportError(f"give {', '.join(missing)} (only --format mlperf reads them from the log)")


def _check_arguments(args: argparse.Namespace) -> None:
    """The numbers of a log's import, each by the rule its setting or count has everywhere."""
    for name in ("seq_length", "global_batch_size"):
        if getattr(args, name) is not None:
            check_batch_or_length(f"--{name.replace('_', '-')}", getattr(args, name))
    _check_gpu_counts(args)
    if args.warmup < 0:
        raise ReportError("--warmup must be 0 or more")
    for name in ("flops_per_sample", "peak_tflops"):
        value = getattr(args, name)
        if value is not None and not (math.isfinite(value) and value > 0):
            raise ReportError(f"--{name.replace('_', '-')} {value}: must be a positive finite number")


def _check_gpu_counts(args: argparse.Namespace) -> None:
    """--num-gpus and --gpus-per-node, where given: whole counts from 1 to what any system has, in every format."""
    for option in ("num_gpus", "gpus_per_node"):
        value = getattr(args, option)
        if value is not None and mlperf.plausible_count(value)[0] is None:
            raise ReportError(f"--{option.replace('_', '-')} {value}: give a count from 1 to {mlperf.MAX_COUNT:,}")


def _whole_nodes(num_gpus: int, gpus_per_node: int) -> int:
    """The nodes a log's run had. GPUs that fill no whole number of nodes are a wrong count, or nodes
    of another size: the node count (grouped by in report, compared in compare) would be a guess."""
    if num_gpus > gpus_per_node and num_gpus % gpus_per_node:
        raise ReportError(f"--num-gpus {num_gpus} is no whole number of nodes of --gpus-per-node {gpus_per_node}"
                          f"{' (the default)' if gpus_per_node == DEFAULT_GPUS_PER_NODE else ''}: give the GPUs "
                          "each node ran with --gpus-per-node, or correct --num-gpus")
    return math.ceil(num_gpus / gpus_per_node)


def _spec_from_json(text: str, seq_length: int) -> ModelSpec:
    try:
        fields = json.loads(text)
    except json.JSONDecodeError as error:
        raise ReportError(f"--model-spec is not JSON: {error}") from error
    if not isinstance(fields, dict):
        raise ReportError("--model-spec must be a JSON object of ModelSpec fields")
    check_one_seq_length(seq_length, fields, "--seq-length", "--model-spec's seq_length")
    return ModelSpec.from_dict({"seq_length": seq_length, **fields})


# --format mlperf: options of the other formats that an MLPerf log answers itself, or that have no meaning for it.
MLPERF_INAPPLICABLE = ("model", "model_spec", "flops_per_sample", "model_name", "global_batch_size", "seq_length",
                       "rank", "segment", "window", "dtype", "peak_tflops")


def refuse_inapplicable_to_mlperf(args: argparse.Namespace) -> None:
    given = [f"--{name.replace('_', '-')}" for name in MLPERF_INAPPLICABLE if getattr(args, name, None) is not None]
    if given:
        raise ReportError(f"{', '.join(given)} do(es) not apply to --format mlperf: the result file states the "
                          "benchmark, batch and timing (leave them out)")


# What import says of a file mlperf-logging's parser stops on (e.g. an :::MLLOG line without time_ms).
MLPERF_UNREADABLE = ("could not read it as an MLPerf result file",
                     "(check the file; check it with python -m mlperf_logging.compliance_checker too)")


def say_mlperf_warning(note: str, where: str | None = None) -> None:
    """Every warning of an MLPerf import, in the one format of `import` (`notice`)."""
    message = f"warning: {printable(note)}"  # notes quote the files: a log's text must not drive the terminal
    print(notice(where, message) if where else f"nemo-throughput import: {message}", file=sys.stderr)


def say_mlperf_imported(target: Path, summary: dict[str, Any], notes: list[str], once: tuple[str, ...] = ()) -> None:
    """The file's warnings (after ``once``, the command's own), then one line of what was written."""
    for note in once:
        say_mlperf_warning(note)
    for note in notes:
        say_mlperf_warning(note, summary["environment"]["imported_from"])
    ttt = summary["time_to_train"]
    minutes = f"{ttt['minutes']:.2f} min" if ttt["minutes"] is not None else "no time to train"
    rate = summary["throughput"]["samples_per_s"]
    print(f"{printable(target)}: {printable(ttt['benchmark'])} on {printable(summary['run']['label'])} "
          f"({summary['hardware']['num_gpus']} accelerators), {minutes}, {ttt['status'] or 'no status'}, "
          f"{'compliant' if ttt['compliant'] else 'NOT compliant'} ({ttt['ruleset']})"
          + (f", {rate:,.4g} samples/s" if rate is not None else ""))
