"""`nemo-throughput bench`: its options, and the handler that checks them before any trial."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from nemo_throughput.bench.render import render
from nemo_throughput.bench.trials import DEFAULT_CONDITIONS, DEVICES, SIZES, parse_conditions, run_bench
from nemo_throughput.distributed import check_cpu_ranks
from nemo_throughput.outputs import OutputPathError, check_output_file, write_output
from nemo_throughput.text import printable
from nemo_throughput.window import SYNTAX, Window


def add_parsers(commands: argparse._SubParsersAction) -> None:
    bench = commands.add_parser(
        "bench", help="overhead and accuracy of the callback beside ThroughputMonitor and NeMo's TimingCallback",
        description="Trains the demo GPT under interleaved conditions and reports, per condition, the median true "
                    "step time, the overhead against no callback (with a 95 % confidence interval), the error of "
                    "the step time the tool reports, its host time per step and, on CUDA, the host-device "
                    "synchronizations per step.")
    bench.add_argument("--device", choices=DEVICES, default="auto", help="auto: cuda when torch sees a GPU (auto)")
    bench.add_argument("--size", choices=tuple(SIZES),
                       help="model (default: gpt3-126m on CUDA, else cpu); gpt3-2.7b is the largest for one 80 GB GPU")
    bench.add_argument("--micro-batch-size", type=int, help="override the size's micro-batch")
    bench.add_argument("--steps", type=int, default=60, help="optimizer steps per trial (60)")
    bench.add_argument("--window", help=f"steps timed, as report and import take them: {SYNTAX}; from step 2 "
                                        "on (default: the last three quarters)")
    bench.add_argument("--rounds", type=int, default=3, help="rounds of all conditions (3)")
    bench.add_argument("--conditions", help="comma-separated conditions (default: all but the diagnostic "
                       "ones, nemo-throughput-slow-nvml and nemo-throughput-idle-gpu)")
    bench.add_argument("--no-sync-count", action="store_true", help="skip the CUDA synchronization-count trials")
    bench.add_argument("--format", choices=("table", "json"), default="table")
    bench.add_argument("--output", type=Path, help="write the table (or JSON) to this file instead of stdout, as "
                                                   "report does; its directory must exist")
    bench.add_argument("--ranks", help="instead of the trials: the host cost of a log step and of an ordinary step "
                                       "at these numbers of gloo ranks (CPU processes, e.g. 2,4,8; at "
                                       "most 4 per CPU)")
    bench.add_argument("--steps-done", default="100,1000,10000",
                       help="with --ranks: measure after this many steps of the run (100,1000,10000)")
    bench.set_defaults(handler=run_command)


def run_command(args: argparse.Namespace) -> int:
    if args.ranks:
        return _run_log_step_command(args)
    try:
        window = Window.parse(args.window) if args.window else None
        conditions = parse_conditions(args.conditions) if args.conditions else DEFAULT_CONDITIONS
        if args.steps < 2 or args.rounds < 1:
            raise ValueError("--steps must be at least 2 and --rounds at least 1")
        if args.output:
            check_output_file(args.output, "--output")
        result = run_bench(size=args.size, steps=args.steps, window=window, rounds=args.rounds,
                           conditions=conditions, device=args.device, micro_batch_size=args.micro_batch_size,
                           count_syncs=not args.no_sync_count,
                           progress=lambda line: print(line, file=sys.stderr, flush=True))
    except ValueError as error:
        print(f"nemo-throughput bench: {printable(error)}", file=sys.stderr)
        return 2
    return _write(render(result, args.format), args.output)


def _run_log_step_command(args: argparse.Namespace) -> int:
    """``--ranks``: the log-step bench (nemo_throughput.bench.log_step) instead of the trials."""
    from nemo_throughput.bench.log_step import parse_counts, render_log_step, run_log_step_bench

    try:
        ranks = parse_counts("--ranks", args.ranks, "2,4,8")
        check_cpu_ranks("--ranks", ranks[-1])
        steps_done = parse_counts("--steps-done", args.steps_done, "100,1000,10000")
        if args.output:
            check_output_file(args.output, "--output")
    except ValueError as error:
        print(f"nemo-throughput bench: {printable(error)}", file=sys.stderr)
        return 2
    result = run_log_step_bench(ranks, steps_done, progress=lambda line: print(line, file=sys.stderr, flush=True))
    return _write(json.dumps(result, indent=2) + "\n" if args.format == "json" else render_log_step(result),
                  args.output)


def _write(text: str, output: Path | None) -> int:
    try:
        write_output(text, output, "--output")
    except OutputPathError as error:
        print(f"nemo-throughput bench: {printable(error)}", file=sys.stderr)
        return 1
    if output is not None:
        print(f"bench: {output}", file=sys.stderr)
    return 0
