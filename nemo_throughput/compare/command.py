"""`nemo-throughput compare BASELINE CANDIDATE`.

Exit status: 0 when no compared metric is slower (faster, no change or inconclusive), 1 when the
candidate is slower in some compared metric (a CI pipeline fails on it), 2 when an input cannot be
used, the two are not comparable (without --allow-different), or the options are wrong."""

from __future__ import annotations

import argparse
import io
import math
import sys

from nemo_throughput.compare.comparison import DEFAULT_THRESHOLD_PCT, METRICS, compare
from nemo_throughput.compare.render import render
from nemo_throughput.compare.sides import load_side, shared_runs
from nemo_throughput.errors import ReportError
from nemo_throughput.text import printable

NOT_SLOWER, SLOWER, UNUSABLE = 0, 1, 2


def add_parsers(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "compare", help="is a candidate slower than a baseline? repeats, a 95 %% interval and a verdict, for CI",
        description="Compares tokens/s (or samples/s), step time and MFU of a candidate with a baseline, each a "
                    "summary or a directory of summaries that are repeats of one configuration (measured or "
                    "imported). Per metric: each side's mean over its runs, the change in percent with its 95 % "
                    "interval, and a verdict: slower or faster (the whole interval beyond the threshold), no change "
                    "(the whole interval within it) or inconclusive. Refuses runs of different configurations "
                    "(model, global batch, sequence length, GPU count or model, ...). Exit status: 0 not slower, "
                    "1 slower, 2 unusable input.")
    parser.set_defaults(handler=run_compare)
    parser.add_argument("baseline", help="summary.json, or a directory of summaries: repeats of the baseline")
    parser.add_argument("candidate", help="summary.json, or a directory of summaries: repeats of the candidate")
    parser.add_argument("--metric", action="append", choices=tuple(METRICS),
                        help="compare this metric (repeat for several); default: tokens/s (samples/s for runs "
                             "without tokens), step time where both sides' steps hold the same work, and MFU "
                             "where known")
    parser.add_argument("--threshold", type=threshold, default=DEFAULT_THRESHOLD_PCT, metavar="PCT",
                        help=f"the change in speed, in percent, that matters (default {DEFAULT_THRESHOLD_PCT:g}): "
                             "slower or faster beyond it, no change within it")
    parser.add_argument("--allow-different", action="store_true",
                        help="compare runs of different configurations anyway, listing the differences")
    parser.add_argument("--format", choices=("table", "json"), default="table")


def threshold(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0 <= value < 100):
        raise argparse.ArgumentTypeError("must be a percentage from 0 to under 100, e.g. 2")
    return value


def run_compare(args: argparse.Namespace) -> int:
    if isinstance(sys.stdout, io.TextIOWrapper):  # a terminal without ± gets an escape, not a traceback
        sys.stdout.reconfigure(errors="backslashreplace")
    try:
        baseline, candidate = _side(args.baseline, "baseline"), _side(args.candidate, "candidate")
        metrics = list(dict.fromkeys(args.metric)) if args.metric else None
        comparison = compare(baseline, candidate, metrics, args.threshold, args.allow_different)
    except ReportError as error:
        say(f"nemo-throughput compare: {error}")
        return UNUSABLE
    for note in dict.fromkeys([*baseline.notes, *candidate.notes, *comparison.notes]):  # a run on both sides: once
        say(f"note: {note}")
    shared = shared_runs(baseline, candidate)
    if shared:
        say(f"note: {shared} run(s) are on both sides (the same run.id, or segments of one resumed run): the two "
            "sides are not independent")
    sys.stdout.write(render(comparison, args.format))
    return SLOWER if comparison.slower else NOT_SLOWER


def _side(given: str, role: str):  # noqa: ANN202 - a Side
    try:
        return load_side(given)
    except ReportError as error:
        raise ReportError(f"{role} {error}") from error


def say(message: str) -> None:
    """A line (or lines) on stderr, with anything that could drive the terminal removed."""
    print("\n".join(printable(line) for line in str(message).split("\n")), file=sys.stderr)
