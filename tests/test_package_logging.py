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
