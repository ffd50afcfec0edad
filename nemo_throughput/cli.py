"""The ``nemo-throughput`` command."""

from __future__ import annotations

import argparse
import datetime as dt
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from nemo_throughput.launch.command import add_launch_parser, run_launch
from nemo_throughput.report.command import add_report_parsers, run_import, run_report
from nemo_throughput.summary import read_summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nemo-throughput", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    demo = commands.add_parser(
        "demo",
        help="train the demo GPT on CPU with +callbacks=throughput and print its summary",
        description="Runs `python -m nemo_throughput.demo.train +callbacks=throughput` (2 gloo ranks by "
                    "default); extra arguments are passed on as Hydra overrides.",
    )
    demo.add_argument("--devices", type=int, default=2, help="CPU processes (ranks), default 2")
    demo.add_argument("--steps", type=int, default=40, help="optimizer steps, default 40")
    demo.add_argument("--output-dir", type=Path, default=None,
                      help="where the summary goes (default ./nemo_throughput_runs/demo-<time>)")
    demo.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. model.num_layers=4")

    add_launch_parser(commands)
    add_report_parsers(commands)

    bench = commands.add_parser(
        "bench", help="overhead and accuracy of the callback beside ThroughputMonitor and NeMo's TimingCallback",
        description="Trains the demo GPT under interleaved conditions and reports, per condition, the median true "
                    "step time, the overhead against no callback and the error of the step time the tool reports.")
    bench.add_argument("--size", choices=("cpu", "gpt3-126m"), help="model (default: gpt3-126m on CUDA, else cpu)")
    bench.add_argument("--steps", type=int, default=60, help="optimizer steps per trial (60)")
    bench.add_argument("--window", help="steps timed, A:B (default: the last three quarters)")
    bench.add_argument("--rounds", type=int, default=3, help="rounds of all conditions (3)")
    bench.add_argument("--conditions", help="comma-separated subset of the conditions")
    bench.add_argument("--format", choices=("table", "json"), default="table")

    args, rest = parser.parse_known_args(argv)
    if args.command == "demo":
        if rest:
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        return run_demo(args.devices, args.steps, args.output_dir, args.overrides)
    if args.command == "launch":
        return run_launch(args, rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.command == "bench":
        return run_bench_command(args)
    return run_report(args) if args.command == "report" else run_import(args)


def run_bench_command(args: argparse.Namespace) -> int:
    import torch

    from nemo_throughput import bench

    try:
        window = tuple(int(part) for part in args.window.split(":")) if args.window else None
        if window is not None and len(window) != 2:
            raise ValueError(f"--window {args.window!r} must be A:B")
        conditions = tuple(args.conditions.split(",")) if args.conditions else bench.CONDITIONS
        if args.steps < 2 or args.rounds < 1:
            raise ValueError("--steps must be at least 2 and --rounds at least 1")
        result = bench.run_bench(size=args.size or ("gpt3-126m" if torch.cuda.is_available() else "cpu"),
                                 steps=args.steps, window=window, rounds=args.rounds, conditions=conditions,
                                 progress=lambda line: print(line, file=sys.stderr, flush=True))
    except ValueError as error:
        print(f"nemo-throughput bench: {error}", file=sys.stderr)
        return 2
    print(bench.render(result, args.format), end="")
    return 0


def run_demo(devices: int, steps: int, output_dir: Path | None, overrides: list[str]) -> int:
    if devices < 1 or steps < 1:
        print("nemo-throughput demo: --devices and --steps must be at least 1", file=sys.stderr)
        return 2
    if output_dir is None:
        output_dir = Path("nemo_throughput_runs") / f"demo-{dt.datetime.now():%Y%m%d-%H%M%S}"
    output_dir = output_dir.resolve()
    command = [
        sys.executable, "-m", "nemo_throughput.demo.train",
        "+callbacks=throughput",
        f"trainer.devices={devices}",
        f"trainer.max_steps={steps}",
        f"exp_manager.exp_dir={output_dir}",
        f"hydra.run.dir={output_dir}",  # Hydra's log files go beside the summary
        f"callbacks.throughput.output_dir={output_dir / 'throughput'}",
        *overrides,
    ]
    print("$", " ".join(command), flush=True)
    returncode = subprocess.call(command, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    summary_path = output_dir / "throughput" / "summary.json"
    if not summary_path.exists():
        print(f"nemo-throughput demo: training exited with {returncode} and wrote no summary", file=sys.stderr)
        return returncode or 1
    print()
    print(headline(read_summary(summary_path)))
    print(f"summary: {summary_path}")
    return returncode


def headline(summary: dict[str, Any]) -> str:
    """A few lines with the numbers people quote from a run."""
    timing, throughput, hardware = summary["timing"], summary["throughput"], summary["hardware"]
    step = timing["step_time_s"]
    lines = [f"run {summary['run']['name']} [{summary['run']['label']}]: {summary['status']}, "
             f"{timing['steps_measured']} steps measured after {timing['warmup_steps']} warm-up"]
    if step is None:
        lines.append("no step was measured (the run was shorter than its warm-up)")
        return "\n".join(lines)
    mfu = throughput["mfu"]
    lines += [
        f"step time      {step['mean']:.4f} s (median {step['median']:.4f}, p90 {step['p90']:.4f}, "
        f"std {step['std']:.4f})",
        f"tokens/s       {throughput['tokens_per_s']:,.0f} ({throughput['tokens_per_s_per_gpu']:,.0f} per GPU, "
        f"{hardware['num_gpus']} x {hardware['gpu_name']})",
        f"model TFLOPS   {throughput['model_tflops_per_gpu']:.3f} per GPU ({summary['model']['flops_formula']} "
        f"formula, {summary['model']['name']})",
        "MFU            " + (f"{100 * mfu:.2f} %" if mfu is not None
                             else f"n/a (no peak FLOPs for {hardware['gpu_name']}; set peak_tflops)"),
        f"slowest rank   {timing['slowest_rank']} (+{timing['straggler']['excess_pct']:.1f} % "
        f"{timing['straggler']['metric']} over the median rank)",
        f"1T tokens in   {throughput['days_to_train_1t_tokens']:,.1f} days",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
