"""The ``nemo-throughput`` command: each feature module registers its subcommand and handler.

Every module imported here (and what it imports at its top) stays free of torch, Lightning,
matplotlib and Megatron: `--help`, `launch`, `report` and `import` then start in a fraction of a
second. Handlers import them where they are used (tests/test_cli_startup.py checks)."""

from __future__ import annotations

import argparse
import sys

from nemo_throughput import bench
from nemo_throughput.demo import command as demo
from nemo_throughput.explain import probe
from nemo_throughput.importers import command as importers
from nemo_throughput.launch import command as launch
from nemo_throughput.report import command as report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nemo-throughput", description="Step time, tokens/s and MFU for "
                                     "NeMo / Megatron GPT pretraining: demo, launch, report, import, bench.")
    commands = parser.add_subparsers(dest="command", required=True)
    for feature in (demo, launch, report, importers, bench, probe):
        feature.add_parsers(commands)
    args, rest = parser.parse_known_args(_join_window_values(sys.argv[1:] if argv is None else argv))
    if getattr(args, "takes_command", False):  # `launch ... -- <training command>`
        return args.handler(args, rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    return args.handler(args)


def _join_window_values(argv: list[str]) -> list[str]:
    """`--window -10:` as `--window=-10:`: argparse takes a value starting with '-' for an option."""
    joined, rest = [], iter(argv)
    for arg in rest:
        if arg == "--":
            joined += [arg, *rest]
            break
        if arg == "--window":
            value = next(rest, None)
            joined.append(arg if value is None else f"--window={value}")
        else:
            joined.append(arg)
    return joined


if __name__ == "__main__":
    sys.exit(main())
