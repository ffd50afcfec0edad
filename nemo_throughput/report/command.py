"""`nemo-throughput report`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from nemo_throughput.report.runs import IncompleteRun, ReportError, Window, find_summaries, load_run
from nemo_throughput.report.tables import build_report, render


def add_parsers(commands: argparse._SubParsersAction) -> None:
    report = commands.add_parser(
        "report", help="tables (and plots) from many run summaries: scaling, environments, MFU, time to train",
        description="Groups runs by label, model and node count; repeats give mean and standard deviation "
                    "(shown as mean ± 2σ).")
    report.set_defaults(handler=run_report)
    report.add_argument("summaries", nargs="+", help="summary.json files or directories holding them")
    report.add_argument("--baseline", help="label the others are compared with, e.g. bare-metal")
    report.add_argument("--tokens", type=float, default=1e12, help="token budget for time to train (1e12)")
    report.add_argument("--format", choices=("table", "markdown", "csv", "json"), default="table")
    report.add_argument("--plot", type=Path, help="write a PNG: tokens/s and MFU against GPU count")
    report.add_argument("--window", help="count only these steps, e.g. 35:45, -10: or last (needs per-step "
                                         "times: imported runs, or steps.jsonl beside the summary)")


def run_report(args: argparse.Namespace) -> int:
    try:
        window = Window.parse(args.window) if args.window else None
        runs, excluded = [], []
        for path in find_summaries(args.summaries):
            try:
                runs.append(load_run(path, window))
            except IncompleteRun as error:
                excluded.append(str(error))
        for reason in excluded:
            print(f"excluded: {reason}", file=sys.stderr)
        if not runs:
            raise ReportError("no completed run to report on")
        report = build_report(runs, tokens=args.tokens, baseline=args.baseline)
        print(render(report, args.format), end="")
        if args.plot:
            from nemo_throughput.report.plots import plot_report

            plot_report(report, args.plot)
            print(f"plot: {args.plot}", file=sys.stderr)
    except ReportError as error:
        print(f"nemo-throughput report: {error}", file=sys.stderr)
        return 2
    return 0
