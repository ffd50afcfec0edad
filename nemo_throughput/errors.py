"""The package's exceptions: one base, so that a caller can catch everything nemo-throughput refuses
with one `except NemoThroughputError`, and the errors every layer shares.

Each subclass also keeps the built-in base it always had (ValueError, OSError), so `except
ValueError` around a call still catches what it caught before.
"""

from __future__ import annotations


class NemoThroughputError(Exception):
    """Anything nemo-throughput refuses: a setting, an input, an output path, a launch request."""


class ReportError(NemoThroughputError, ValueError):
    """Input that cannot be used (a summary, a training log, a step window), naming the input and
    what is wrong with it."""
