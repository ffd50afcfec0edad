"""SIGTERM to a 2-rank run, many times: every case of tests/test_run_status.py's SIGTERM test, repeated.

Outside the suite (it takes a quarter of an hour): `.venv/bin/python tests/scripts/sigterm_repeat.py
[--tries 10]` runs each of the 5 cases `--tries` times through pytest and prints, per case, how each
try ended (exited by itself, or killed as Slurm would after KillWait) and whether every try left an
`interrupted` summary. Exit status 0 only when every try of every case did.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
TEST = "test_run_status.py::test_sigterm_on_two_ranks_leaves_an_interrupted_summary_every_time"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tries", type=int, default=10, help="tries per case (10: 50 runs in all)")
    parser.add_argument("--log", type=Path, help="also keep pytest's whole output in this file")
    args = parser.parse_args()
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "pytest", str(TESTS / TEST), "-s", "-q", "-p", "no:cacheprovider", "--timeout", "0"],
        env={**os.environ, "NEMO_THROUGHPUT_SIGTERM_TRIES": str(args.tries), "NEMO_THROUGHPUT_KILL_WAIT_S": "20"},
        capture_output=True, text=True, cwd=TESTS.parent)
    if args.log:
        args.log.write_text(result.stdout + result.stderr)
    # pytest -q prints a test's output right after its progress dot: not always at a line's start
    endings = re.findall(r"SIGTERM to (.+?): \[(.*)\]$", result.stdout, flags=re.MULTILINE)
    for case, ended in endings:
        words = [word.strip("' ") for word in ended.split(",")]
        print(f"{case}: {len(words)} of {len(words)} interrupted summaries; "
              f"{words.count('exited')} exited by themselves, {words.count('killed')} killed after KillWait")
    failed = re.findall(r"^(?:FAILED|E  ) .*$", result.stdout, flags=re.MULTILINE)
    for line in failed:
        print(line)
    print(f"{len(endings)} of 5 cases passed every try of {args.tries}, in {time.monotonic() - started:.0f} s: "
          + ("every try left an interrupted summary" if result.returncode == 0 else f"pytest exit {result.returncode}"))
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
