"""What counts as a number where a user, a file or a log gives one: an int or a float, never a bool
(Python's True is the int 1, and a YAML or JSON ``true`` is no count) and never a numeric string."""

from __future__ import annotations

import re
from typing import Any

_WHOLE_NUMBER = re.compile(r"[0-9]+")


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
