"""Run several programs as `__main__`, one after another, in this one interpreter.

Importing NeMo (or torch, Lightning and Hydra) costs most of each test's time, so the tests of a
module hand their runs to one process: each run executes the program's file exactly as
`python FILE ARGS` would, or a module as `python -m MODULE ARGS` would (runpy with
run_name="__main__", its own sys.argv, working directory and extra environment), with file
descriptors 1 and 2 sent to its own files, so every line any library writes is caught.
Its exit status is worked out as the interpreter does at exit (None -> 0, an int -> itself,
anything else -> printed to stderr, 1; an uncaught exception -> its traceback, 1).

Usage: run_in_one_process.py RUNS.json, a list of {"program" or "module", "argv", "cwd", "env"}; writes
stdout.txt, stderr.txt and exit_code into each run's cwd.
"""

import json
import os
import runpy
import sys
import traceback
from pathlib import Path


def exit_code_of(exit: SystemExit) -> int:
    if exit.code is None:
        return 0
    if isinstance(exit.code, int):
        return exit.code
    print(exit.code, file=sys.stderr)
    return 1


def run_as_main(program: str | None, module: str | None, argv: list[str]) -> int:
    sys.argv = [program or module, *argv]
    sys.path[0] = str(Path(program).parent) if program else os.getcwd()
    try:
        if program:
            runpy.run_path(program, run_name="__main__")
        else:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exit:
        return exit_code_of(exit)
    except BaseException:  # noqa: BLE001 - reported as the interpreter would, then the next run
        traceback.print_exc()
        return 1
    return 0


def run(program: str | None, module: str | None, argv: list[str], cwd: str, env: dict[str, str]) -> None:
    saved_fds = os.dup(1), os.dup(2)
    saved_env = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    os.chdir(cwd)
    with open("stdout.txt", "w") as stdout, open("stderr.txt", "w") as stderr:
        os.dup2(stdout.fileno(), 1)
        os.dup2(stderr.fileno(), 2)
        try:
            exit_code = run_as_main(program, module, argv)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved_fds[0], 1)
            os.dup2(saved_fds[1], 2)
    Path("exit_code").write_text(str(exit_code))
    for name, value in saved_env.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


if __name__ == "__main__":
    for spec in json.loads(Path(sys.argv[1]).read_text()):
        run(spec.get("program"), spec.get("module"), spec["argv"], spec["cwd"], spec.get("env", {}))
