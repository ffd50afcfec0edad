"""`nemo-throughput demo`: the demo GPT on CPU ranks with `+callbacks=throughput`, then its headline."""

from __future__ import annotations

import argparse
import datetime as dt
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from nemo_throughput.summary import read_summary


def add_parsers(commands: argparse._SubParsersAction) -> None:
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
    demo.set_defaults(handler=lambda args: run_demo(args.devices, args.steps, args.output_dir, args.overrides))


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
