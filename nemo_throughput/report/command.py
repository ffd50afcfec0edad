"""`nemo-throughput report`.

Exit status: 0 when every summary was reported (runs that did not complete are left out with a
note and still count as fine), 1 when some inputs were unusable and excluded but the others were
reported, 2 when nothing could be reported (or the options are wrong)."""

from __future__ import annotations

import argparse
import io
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nemo_throughput.outputs import OutputPathError, check_output_file, write_output
from nemo_throughput.report.goodput import latest_per_run
from nemo_throughput.report.grouping import Report, build_report
from nemo_throughput.report.rendering import render
from nemo_throughput.report.runs import (
    IncompleteRun,
    ReportError,
    Run,
    SummaryDocument,
    TrainingRun,
    Window,
    find_summaries,
    goodput_of,
    read_summary_document,
    run_of,
    training_run_of,
)
from nemo_throughput.report.time_to_train import build_time_to_train
from nemo_throughput.summary import STEPS_FILE
from nemo_throughput.text import printable

REPORTED, SOME_EXCLUDED, NOTHING_REPORTED = 0, 1, 2


def add_parsers(commands: argparse._SubParsersAction) -> None:
    report = commands.add_parser(
        "report", help="tables (and plots) from many run summaries: scaling, environments, MFU, time to train",
        description="Groups runs by label (or --group-by network), model and node count; repeats give mean and "
                    "standard deviation (shown as mean ± 2σ). Where the summaries explain their numbers, columns "
                    "for communication, memory, clocks, power, energy, probe bandwidth and the slowest rank, and "
                    "tables of where the step time goes and of the fabric probe follow. Runs imported with "
                    "--format mlperf get a time-to-train table: olympic average as MLPerf scores it, mean ± 2σ, "
                    "speedup and scaling efficiency across GPU counts. Unusable summaries are "
                    "listed on stderr and left out. Exit status: 0 all reported, 1 some summaries excluded, 2 "
                    "nothing reported.")
    report.set_defaults(handler=run_report)
    report.add_argument("summaries", nargs="+", help="summary.json files or directories holding them")
    report.add_argument("--baseline", help="label the others are compared with, e.g. bare-metal")
    report.add_argument("--tokens", type=token_budget, default=1e12,
                        help="token budget for time to train: a number, or one with K, M, B or T, e.g. 1e12 or 15T "
                             "(default 1e12)")
    report.add_argument("--format", choices=("table", "markdown", "csv", "json"), default="table")
    report.add_argument("--output", type=Path, help="write the table (or markdown, CSV, JSON) to this file instead "
                                                    "of stdout; its directory must exist")
    report.add_argument("--plot", type=Path, help="write an image (.png, .svg or .pdf): tokens/s and MFU against "
                                                  "GPU count; its directory must exist. Where the summaries say "
                                                  "where the step time goes, the breakdown goes beside it (e.g. "
                                                  "scaling.png, scaling-breakdown.png)")
    report.add_argument("--group-by", choices=("label", "network"), default="label",
                        help="group runs by their label (default) or by the network the summaries record (RDMA, "
                             "IPoIB, TCP, intra-node); --baseline then names a network, e.g. --baseline RDMA")
    report.add_argument("--window", help="count only these steps, e.g. 35:45, -10: or last (needs per-step "
                                         "times: imported runs, or steps.jsonl beside the summary)")


# The budgets' own words: "15T tokens", "300B". Decimal, as token counts are given.
TOKEN_SUFFIXES = {"K": 1e3, "M": 1e6, "B": 1e9, "T": 1e12}
FEWEST_BUDGET_TOKENS = 1e6  # fewer is no training run's budget: a suffix left out (15 for 15T)


def token_budget(text: str) -> float:
    """--tokens: a number, or one with K, M, B or T (15T = 1.5e13); at least FEWEST_BUDGET_TOKENS."""
    number, scale = text.strip(), 1.0
    suffixed = number[-1:].upper() in TOKEN_SUFFIXES
    if suffixed:
        number, scale = number[:-1], TOKEN_SUFFIXES[number[-1].upper()]
    try:
        tokens = float(number) * scale
    except ValueError:
        tokens = math.nan
    if not (math.isfinite(tokens) and tokens > 0):
        raise argparse.ArgumentTypeError("must be a positive number of tokens, e.g. 1e12 or 15T")
    if tokens < FEWEST_BUDGET_TOKENS:
        hint = "" if suffixed else f"; give the unit, e.g. {text}T for {tokens * 1e12:.3g} tokens"
        raise argparse.ArgumentTypeError(f"{text} tokens is no training budget (at least {FEWEST_BUDGET_TOKENS:.0e})"
                                         + hint)
    return tokens


def run_report(args: argparse.Namespace) -> int:
    _never_fail_on_unencodable_output()
    try:
        window = Window.parse(args.window) if args.window else None
        paths, problems = find_summaries(args.summaries)
        _check_destinations(args.output, args.plot, paths)
        inputs = _read_inputs(paths, problems, window)
        runs, training, rejected = inputs.runs, inputs.training, inputs.rejected
        goodput = latest_per_run(inputs.goodput)
        if not runs and not training and not goodput:
            raise ReportError("no run left to report on")
        report = (build_report(runs, tokens=args.tokens, baseline=args.baseline, group_by=args.group_by) if runs
                  else Report([], [], args.tokens, args.baseline, group_by=args.group_by))
        rejected += _say_left_out(report.left_out)
        if not report.groups and not training and not goodput:
            raise ReportError("no run left to report on")
        report.time_to_train = build_time_to_train(training)
        report.goodput = goodput
        for note in report.notes:
            say(f"note: {note}")
        for group in report.time_to_train:
            for note in group.notes:
                say(f"note: {group.benchmark} on {group.label}, {group.shown}: {note}")
        text = render(report, args.format)
        if args.plot and not report.groups:
            say("note: --plot draws tokens/s and MFU of throughput runs; these summaries are time-to-train runs "
                "only, so no plot was written")
        elif args.plot:
            _plot(report, args.plot)
        _write(text, args.output)
    except (ReportError, OutputPathError) as error:
        say(f"nemo-throughput report: {error}")
        return NOTHING_REPORTED
    covered = sum(len(group.files) for group in report.groups) + len(training)
    if rejected:
        say(f"nemo-throughput report: {rejected} of {len(paths) + len(problems)} summaries were excluded as "
            f"unusable (listed above); the report covers the other {covered}")
        return SOME_EXCLUDED
    return REPORTED


@dataclass
class Inputs:
    """What the summaries give the report, each file read (and schema-checked) once: the runs that can
    be reported, the time-to-train runs (imported MLPerf results: aborted or failing ones too, since
    MLPerf scoring counts them as dropped) and the goodput sections (of any status)."""

    runs: list[Run] = field(default_factory=list)
    training: list[TrainingRun] = field(default_factory=list)
    goodput: list[dict[str, Any]] = field(default_factory=list)
    rejected: int = 0  # inputs that cannot be used (a run that did not complete is left out, not unusable)


def _read_inputs(paths: list[Path], problems: list[ReportError], window: Window | None) -> Inputs:
    """Each summary read once; each input that cannot be used is listed on stderr, those left out of
    the goodput table after the others (unless for what already left them out whole)."""
    inputs = Inputs(rejected=len(problems))
    for problem in problems:
        say(f"excluded: {problem}")
    no_goodput: list[ReportError] = []  # said after the runs' lines, where the goodput table's own pass said them
    for path in paths:
        try:
            summary = read_summary_document(path)
        except ReportError as error:
            say(f"excluded: {error}")
            inputs.rejected += 1
            continue
        excluded = _add_run(summary, window, inputs)
        try:
            if (section := goodput_of(summary)) is not None:
                inputs.goodput.append(section)
        except ReportError as error:
            if str(error) != excluded:
                no_goodput.append(error)
    for error in no_goodput:
        say(f"excluded from goodput: {error}")
    return inputs


def _add_run(summary: SummaryDocument, window: Window | None, inputs: Inputs) -> str | None:
    """The summary's time-to-train run, or its throughput run, where it can be reported; else why not
    (said)."""
    try:
        training_run = training_run_of(summary)
        if training_run is not None:
            inputs.training.append(training_run)
            return None
        run = run_of(summary, window)
    except IncompleteRun as note:
        say(f"excluded: {note}")
        return str(note)
    except ReportError as error:
        say(f"excluded: {error}")
        inputs.rejected += 1
        return str(error)
    for note in run.notes:
        say(f"note: {note}")
    inputs.runs.append(run)
    return None


def _say_left_out(left_out: list[ReportError]) -> int:
    """The runs left out once segments were joined, as those left out on reading; how many were unusable
    (a run that did not complete is left out, not unusable)."""
    for error in left_out:
        say(f"excluded: {error}")
    return sum(not isinstance(error, IncompleteRun) for error in left_out)


def _plot(report: Report, path: Path) -> None:
    from nemo_throughput.report.plots import has_breakdown, plot_breakdown, plot_report

    plot_report(report, path)
    say(f"plot: {path}")
    if has_breakdown(report):
        plot_breakdown(report, breakdown_path(path))
        say(f"plot: {breakdown_path(path)}")


def breakdown_path(plot: Path) -> Path:
    """Where the step-time breakdown goes: beside --plot, e.g. scaling.png -> scaling-breakdown.png."""
    return plot.with_name(f"{plot.stem}-breakdown{plot.suffix}")


def _check_destinations(output: Path | None, plot: Path | None, inputs: list[Path]) -> None:
    """Before any work: each file given can be written where it is meant to go (the shared rule of
    `outputs`: no missing directory is created, no summary read or kept is replaced), and no two
    of them are the same file."""
    from nemo_throughput.report.plots import IMAGE_SUFFIXES

    if plot is not None and plot.suffix.lower() not in IMAGE_SUFFIXES:
        raise ReportError(f"--plot {printable(plot)}: the name must end in .png, .svg or .pdf (the image format)")
    destinations = [("--output", output), ("--plot", plot)]
    if plot is not None:
        destinations.append(("--plot's step-time breakdown", breakdown_path(plot)))
    given = [(option, path) for option, path in destinations if path is not None]
    # A summary's steps.jsonl is read too (--window): never a destination either.
    reads = [*inputs, *(path.parent / STEPS_FILE for path in inputs)]
    for option, path in given:
        check_output_file(path, option, reads=reads)
    for i, (option, path) in enumerate(given):
        for other_option, other in given[i + 1:]:
            if path.resolve() == other.resolve():
                raise ReportError(f"{option} and {other_option} are the same file, {printable(path)}")


def _write(text: str, output: Path | None) -> None:
    write_output(text, output, "--output")
    if output is not None:
        say(f"report: {output}")


def say(message: str) -> None:
    """A line (or lines) on stderr, with anything that could drive the terminal removed."""
    print("\n".join(printable(line) for line in str(message).split("\n")), file=sys.stderr)


def _never_fail_on_unencodable_output() -> None:
    """A terminal whose encoding lacks ± or a label's characters gets escapes, not a traceback."""
    if isinstance(sys.stdout, io.TextIOWrapper):
        sys.stdout.reconfigure(errors="backslashreplace")
