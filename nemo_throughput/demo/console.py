"""What the demo prints to its console: our lines, anyone's warnings and errors, nothing else.

Used by ``conf/hydra/job_logging/demo.yaml``; the log file beside the summary keeps every record,
library INFO lines (Lightning's device banner, its tips) included.
"""

from __future__ import annotations

import logging

OUR_LOGGER = "nemo_throughput"


class OursAndProblems(logging.Filter):
    """Passes nemo-throughput's records at any level and other libraries' warnings and errors."""

    def filter(self, record: logging.LogRecord) -> bool:
        ours = record.name == OUR_LOGGER or record.name.startswith(OUR_LOGGER + ".")
        return ours or record.levelno >= logging.WARNING


class ProblemsPrefixedFormatter(logging.Formatter):
    """The bare message; warnings and errors start with their level (``WARNING: ...``)."""

    def format(self, record: logging.LogRecord) -> str:
        message = super().format(record)
        return f"{record.levelname}: {message}" if record.levelno >= logging.WARNING else message
