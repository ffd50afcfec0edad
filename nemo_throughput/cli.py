"""The ``nemo-throughput`` command: each feature module registers its subcommand and handler.

Every module imported here (and what it imports at its top) stays free of torch, Lightning,
matplotlib and Megatron: `--help`, `launch`, `report`, `compare` and `import` then start in a fraction of a
second. Handlers import them where they are used (tests/test_cli_startup.py checks)."""

from __future__ import annotations

import argparse
import re
import sys

from nemo_throughput.bench import command as bench
from nemo_throughput.compare import command as compare
from nemo_throughput.demo import command as demo
from nemo_throughput.explain import probe_command as probe
from nemo_throughput.importers import command as importers
from nemo_throughput.launch import command as launch
from nemo_throughput.report import command as report


class _Parser(argparse.ArgumentParser):
    """argparse's parser, reading a window that counts from the end (`--window -10:`) as the option's
    value: argparse takes every word that starts with '-' and is not a negative number for an option.
    The sub-parsers made from it are of its class too."""

    def _parse_optional(self, arg_string: str):  # noqa: ANN202 - argparse's own (private) hook
        return None if _is_window(arg_string) else super()._parse_optional(arg_string)


def _is_window(text: str) -> bool:
    """Written as a window, whether or not it selects steps (`-0:` is then refused as one, naming it)."""
    return re.fullmatch(r"-\d+:-?\d*", text) is not None


def build_parser() -> argparse.ArgumentParser:
    """The whole command line, every subcommand registered (the CLI reference page is made from it)."""
    parser = _Parser(prog="nemo-throughput", description="Step time, tokens/s and MFU for "
                                     "NeMo / Megatron GPT pretraining: demo, launch, report, compare, import, bench.")
    commands = parser.add_subparsers(dest="command", required=True)
    for feature in (demo, launch, report, compare, importers, bench, probe):
        feature.add_parsers(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if getattr(args, "takes_command", False):  # `launch ... -- <training command>`
        return args.handler(args, rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
