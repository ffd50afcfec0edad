"""What counts as a number where a user, a file or a log gives one: an int or a float, never a bool
(Python's True is the int 1, and a YAML or JSON ``true`` is no count) and never a numeric string; and
what counts as a name a file states: never a template's placeholder."""

from __future__ import annotations

import re
from typing import Any

_WHOLE_NUMBER = re.compile(r"[0-9]+")
# What reference scripts log until a submitter fills it in: MLPerf's SUBMISSION_ORG_PLACEHOLDER and
# 2xSUBMISSION_PLATFORM_PLACEHOLDER, NVIDIA's UNKNOWN_MLPERF_SUBMITTER and UNKNOWN_MLPERF_SYSTEM_NAME.
_PLACEHOLDER = re.compile(r"PLACEHOLDER|^\s*UNKNOWN(_|\s*$)", re.IGNORECASE)


def is_int(value: Any) -> bool:
    """An int, not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """An int or a float, not a bool (inf and NaN are numbers here: check finiteness apart)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def whole_number(text: str) -> int | None:
    """The whole number ``text`` writes in ASCII digits (an environment variable, a log's field), else
    None: ``str.isdigit`` also takes "²" and other digits that ``int`` refuses."""
    return int(text) if _WHOLE_NUMBER.fullmatch(text) else None


def stated_name(value: Any) -> str | None:
    """A name (submitter, system, accelerator) as a file states it; None for no text, an empty one or a
    template's placeholder: a placeholder names no one, and every submitter's is the same text."""
    if not isinstance(value, str) or not value.strip() or _PLACEHOLDER.search(value):
        return None
    return value
