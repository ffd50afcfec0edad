"""The package's logging set-up: our INFO lines show once, in the application's format when it has one."""

import subprocess
import sys

import pytest

EMIT = "import logging; logging.getLogger('nemo_throughput.adapters.lightning').info('[throughput] steps 1-9')"


def stderr_of(*statements: str) -> str:
    result = subprocess.run([sys.executable, "-c", "; ".join(statements)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stderr


@pytest.mark.parametrize("order", ["configured after the import", "configured before the import"])
def test_an_app_that_configures_logging_gets_each_line_once_in_its_own_format(order):
    configure = "import logging; logging.basicConfig(level=logging.INFO, format='app: %(message)s')"
    statements = ["import nemo_throughput", configure]
    if order == "configured before the import":
        statements.reverse()
    assert stderr_of(*statements, EMIT) == "app: [throughput] steps 1-9\n"


def test_without_app_logging_our_info_lines_still_show():
    assert stderr_of("import nemo_throughput", EMIT) == "[throughput] steps 1-9\n"


def test_the_root_logger_of_the_app_is_left_alone():
    stderr = stderr_of("import logging, nemo_throughput",
                       "import sys; print(logging.getLogger().handlers, logging.getLogger().level, file=sys.stderr)")
    assert stderr == "[] 30\n"


def test_every_log_line_of_the_package_is_printable_whatever_the_app_s_handler():
    """A run id, label, path or error read from an input can hold terminal escapes: no module's log line
    passes them to the application's handlers raw (one filter on every module's logger)."""
    import ast
    import logging
    from pathlib import Path

    import nemo_throughput
    from nemo_throughput.goodput.run import log as goodput_log

    package = Path(nemo_throughput.__file__).parent
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "logging.getLogger" and node.args and \
                    ast.unparse(node.args[0]) == "__name__" and path != package / "__init__.py":
                raise AssertionError(f"{path}: logging.getLogger(__name__): use text.package_logger(__name__)")
    seen = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    root = logging.getLogger()
    handler = Keep()
    root.addHandler(handler)
    try:
        goodput_log.warning("nemo-throughput: this run continues run %s", "\x1b]0;owned\x07r1\x1b[31m\n")
    finally:
        root.removeHandler(handler)
    assert seen == ["nemo-throughput: this run continues run r1 "]
