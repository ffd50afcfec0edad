"""`nemo-throughput demo`: the demo GPT on CPU ranks with `+callbacks=throughput`, then its headline."""

from __future__ import annotations

import argparse
import datetime as dt
import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from nemo_throughput.distributed import check_cpu_ranks
from nemo_throughput.outputs import OutputPathError, check_output_dir
from nemo_throughput.redact import redact_argument
from nemo_throughput.summary import outliers_text, read_summary
from nemo_throughput.text import printable


def add_parsers(commands: argparse._SubParsersAction) -> None:
    demo = commands.add_parser(
        "demo",
        help="train the demo GPT on CPU with +callbacks=throughput and print its summary",
        description="Runs `python -m nemo_throughput.demo.train +callbacks=throughput` (2 gloo ranks by "
                    "default); extra arguments are passed on as Hydra overrides.",
    )
    demo.add_argument("--devices", type=int, default=2, help="CPU processes (ranks), default 2; at most 4 per CPU")
    demo.add_argument("--steps", type=int, default=40, help="optimizer steps, default 40")
    demo.add_argument("--output-dir", type=Path, default=None,
                      help="where the summary goes (default ./nemo_throughput_runs/demo-<time>)")
    demo.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. model.num_layers=4")
    demo.set_defaults(handler=lambda args: run_demo(args.devices, args.steps, args.output_dir, args.overrides))


# Overrides the demo writes itself: a second value would silently win over the option (Hydra
# keeps the last), and the demo would then look for the summary where it is not.
OPTION_FOR_KEY = {
    "trainer.devices": "--devices",
    "trainer.max_steps": "--steps",
    "exp_manager.exp_dir": "--output-dir",
    "hydra.run.dir": "--output-dir",
    "callbacks.throughput.output_dir": "--output-dir",
}


def run_demo(devices: int, steps: int, output_dir: Path | None, overrides: list[str]) -> int:
    if output_dir is None:
        output_dir = Path("nemo_throughput_runs") / f"demo-{dt.datetime.now():%Y%m%d-%H%M%S}"
    output_dir = output_dir.resolve()
    refusal = _refusal(devices, steps, output_dir, overrides)
    if refusal is not None:
        print(f"nemo-throughput demo: {refusal}", file=sys.stderr)
        return 2
    command = [
        sys.executable, "-m", "nemo_throughput.demo.train",
        "+callbacks=throughput",
        f"trainer.devices={devices}",
        f"trainer.max_steps={steps}",
        f"exp_manager.exp_dir={hydra_quoted(output_dir)}",
        f"hydra.run.dir={hydra_quoted(output_dir)}",  # the log files go beside the summary
        f"callbacks.throughput.output_dir={hydra_quoted(output_dir / 'throughput')}",
        *overrides,
    ]
    print("$", shlex.join(redact_argument(word) for word in command), flush=True)  # overrides may hold API keys
    # PYTHONSAFEPATH (Python 3.11+): `python -m` would otherwise import a random.py or hydra.py from
    # the user's working directory before the real module (every rank inherits it).
    returncode, stopped_by = train(command, env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONSAFEPATH": "1"})
    summary_path = output_dir / "throughput" / "summary.json"
    log_path = output_dir / "train.log"  # Hydra's job name is the script's; other ranks: train_ddp_process_<rank>.log
    if not summary_path.exists():
        print(f"nemo-throughput demo: training exited with {returncode} and wrote no summary", file=sys.stderr)
        if log_path.exists():
            print(f"log: {log_path}", file=sys.stderr)
        return returncode or 1
    print()
    print(headline(read_summary(summary_path)))
    print(f"summary: {summary_path}")
    print(f"log: {log_path}" + (" (other ranks: train_ddp_process_<rank>.log beside it)" if devices > 1 else ""))
    if stopped_by is not None:
        return 128 + stopped_by  # as a shell reports a job ended by that signal
    return returncode


def _refusal(devices: int, steps: int, output_dir: Path, overrides: list[str]) -> str | None:
    """Why the demo cannot run as asked, said before any process starts; None when it can."""
    if devices < 1 or steps < 1:
        return "--devices and --steps must be at least 1"
    try:
        check_cpu_ranks("--devices", devices)
        check_output_dir(output_dir, "--output-dir")
    except OutputPathError as error:
        return printable(error)
    except ValueError as error:
        return str(error)
    if (output_dir / "throughput").is_dir() and any((output_dir / "throughput").iterdir()):
        # The headline must be this run's: the callback would write beside the earlier run's summary.
        return (f"--output-dir {printable(output_dir)} holds an earlier run; choose a new directory (without "
                "--output-dir each demo gets its own)")
    problem = unpassable_part(str(output_dir))
    if problem:
        return (f"the output directory {output_dir} contains {problem}, which cannot be passed to Hydra unchanged; "
                "choose another --output-dir")
    for override in overrides:
        key = override.split("=", 1)[0].lstrip("+~")
        if key in OPTION_FOR_KEY:
            return f"the demo sets {key} itself; use {OPTION_FOR_KEY[key]} instead of the override {override!r}"
    return None


def train(command: list[str], env: dict[str, str]) -> tuple[int, int | None]:
    """Run the training ranks; a SIGTERM or SIGHUP to the demo is handed to rank 0, which hands it to
    the other ranks (Lightning's launcher), so that the run ends as interrupted with its summary,
    never orphaned. Ctrl-C reaches every process of the terminal's group already: only noted here.
    Returns the training's exit status and the signal that stopped the demo, if any."""
    stopped_by: list[int] = []
    child = subprocess.Popen(command, env=env)

    def hand_on(signum: int, frame: Any) -> None:
        stopped_by.append(signum)
        if signum != signal.SIGINT and child.poll() is None:
            child.send_signal(signal.SIGTERM)

    previous = {signum: signal.signal(signum, hand_on) for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)}
    try:
        returncode = child.wait()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return returncode, (stopped_by[0] if stopped_by else None)


def unpassable_part(path: str) -> str | None:
    """What in `path` the demo cannot hand to Hydra intact, or None.

    OmegaConf would resolve "${...}" as an interpolation, and Lightning re-launches ranks > 0 with
    `hydra.run.dir="<dir>"`, which a double quote or a trailing backslash breaks.
    """
    if "${" in path:
        return "'${'"
    if '"' in path:
        return "a double quote"
    if path.endswith("\\"):
        return "a trailing backslash"
    return None


def hydra_quoted(path: Path) -> str:
    """`path` as a Hydra override value: quoted when it holds more than [\\w/.-], so that spaces, commas,
    '=' or brackets stay part of it instead of making a list or a sweep."""
    from hydra.core.override_parser.types import Quote, QuotedString

    if re.fullmatch(r"[\w/.-]+", str(path), flags=re.ASCII):
        return str(path)
    return QuotedString(text=str(path), quote=Quote.double).with_quotes()


def headline(summary: dict[str, Any]) -> str:
    """A few lines with the numbers people quote from a run."""
    timing, throughput, hardware = summary["timing"], summary["throughput"], summary["hardware"]
    step = timing["step_time_s"]
    run, model = summary["run"], summary["model"]
    lines = [f"run {printable(run['name'])} [{printable(run['label'])}]: {summary['status']}, "
             f"{timing['steps_measured']} steps measured after {timing['warmup_steps']} warm-up"]
    if step is None:
        lines.append("no step was measured (the run was shorter than its warm-up)")
        return "\n".join(lines)
    mfu = throughput["mfu"]
    lines += [
        f"step time      {step['mean']:.4f} s (median {step['median']:.4f}, p90 {step['p90']:.4f}, "
        f"std {step['std']:.4f})",
        f"tokens/s       {throughput['tokens_per_s']:,.0f} ({throughput['tokens_per_s_per_gpu']:,.0f} per GPU, "
        f"{hardware['num_gpus']} x {printable(hardware['gpu_name'])})",
        f"model TFLOPS   {throughput['model_tflops_per_gpu']:.3f} per GPU ({printable(model['flops_formula'])} "
        f"formula, {printable(model['name'])})",
        "MFU            " + (f"{100 * mfu:.2f} %" if mfu is not None
                             else f"n/a (no peak FLOPs for {printable(hardware['gpu_name'])}; set peak_tflops)"),
        f"slowest rank   {timing['slowest_rank']} (+{timing['straggler']['excess_pct']:.1f} % "
        f"{timing['straggler']['metric']} over the median rank)",
        f"1T tokens in   {throughput['days_to_train_1t_tokens']:,.1f} days",
    ]
    if (outliers := outliers_text(timing)) is not None:
        lines.insert(2, f"outlier steps  {outliers}")
    return "\n".join(lines)
