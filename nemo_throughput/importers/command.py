"""`nemo-throughput import`: summaries of runs made without the plugin, from their logs."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from nemo_throughput.flops import FORMULAS, ModelSpec
from nemo_throughput.hardware import DTYPES
from nemo_throughput.importers.logs import FORMATS, import_run
from nemo_throughput.presets import PRESETS, preset
from nemo_throughput.report.runs import ReportError, Window
from nemo_throughput.summary import write_json_atomic


def add_parsers(commands: argparse._SubParsersAction) -> None:
    imports = commands.add_parser(
        "import", help="summaries from NeMo / Megatron-LM logs or TensorBoard event files of runs without the plugin",
        description="Writes <output-dir>/<name>/summary.json per input, from the step times the log holds and "
                    "the facts it lacks, given here.")
    imports.set_defaults(handler=run_import)
    imports.add_argument("logs", nargs="+", type=Path, help="log files, event files or directories of them")
    imports.add_argument("--format", choices=("auto", *FORMATS), default="auto")
    imports.add_argument("--label", required=True, help="run.label, e.g. bare-metal or kubernetes")
    model = imports.add_mutually_exclusive_group(required=True)
    model.add_argument("--model", help=f"size preset: {', '.join(PRESETS)}")
    model.add_argument("--model-spec", help='ModelSpec fields as JSON, e.g. \'{"num_layers": 12, ...}\'')
    imports.add_argument("--model-name", help="model.name (default: the preset, or one from the parameter count)")
    imports.add_argument("--global-batch-size", type=int, help="samples per step (Megatron-LM logs state it)")
    imports.add_argument("--seq-length", type=int, required=True)
    imports.add_argument("--num-gpus", type=int, required=True)
    imports.add_argument("--gpus-per-node", type=int, default=8, help="to count the nodes (default 8)")
    imports.add_argument("--window", help="steps that count, e.g. 35:45, -10: or last (default: all after the "
                                          "--warmup steps)")
    imports.add_argument("--warmup", type=int, default=10, help="first steps left out without --window (10)")
    imports.add_argument("--gpu-name", help='driver name of the GPU, e.g. "NVIDIA H100 80GB HBM3", for MFU')
    imports.add_argument("--dtype", choices=DTYPES, help="dtype of the peak FLOPs, for MFU")
    imports.add_argument("--peak-tflops", type=float, help="per-GPU peak instead of the table's")
    imports.add_argument("--flops-formula", choices=FORMULAS, default="megatron")
    imports.add_argument("--orchestrator", help="where it ran (slurm, kubernetes, ...), for the record")
    imports.add_argument("--output-dir", type=Path, default=Path("imported"))



def run_import(args: argparse.Namespace) -> int:
    try:
        if args.model:
            spec, model_name = preset(args.model), args.model_name or args.model.lower()
        else:
            spec = _spec_from_json(args.model_spec, args.seq_length)
            model_name = args.model_name or spec.default_name()
        for name in ("seq_length", "num_gpus", "gpus_per_node"):
            if getattr(args, name) < 1:
                raise ReportError(f"--{name.replace('_', '-')} must be at least 1")
        window = Window.parse(args.window) if args.window else None
        for log in args.logs:
            summary = import_run(
                log, fmt=None if args.format == "auto" else args.format,
                global_batch_size=args.global_batch_size, seq_length=args.seq_length, spec=spec,
                model_name=model_name, num_gpus=args.num_gpus, num_nodes=math.ceil(args.num_gpus / args.gpus_per_node),
                label=args.label, window=window, warmup_steps=args.warmup, gpu_name=args.gpu_name, dtype=args.dtype,
                peak=args.peak_tflops, flops_formula=args.flops_formula, orchestrator=args.orchestrator)
            path = args.output_dir / summary["run"]["name"] / "summary.json"
            write_json_atomic(path, summary)
            timing = summary["timing"]
            print(f"{path}: {timing['steps_measured']} steps ({timing['window']}), "
                  f"{timing['step_time_s']['mean']:.4g} s/step, {summary['throughput']['tokens_per_s']:,.0f} tokens/s")
    except (ReportError, ValueError) as error:
        print(f"nemo-throughput import: {error}", file=sys.stderr)
        return 2
    return 0


def _spec_from_json(text: str, seq_length: int) -> ModelSpec:
    try:
        fields = json.loads(text)
    except json.JSONDecodeError as error:
        raise ReportError(f"--model-spec is not JSON: {error}") from error
    return ModelSpec.from_dict({"seq_length": seq_length, **fields})
