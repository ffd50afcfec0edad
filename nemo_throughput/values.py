"""What counts as a number where a user, a file or a log gives one: an int or a float, never a bool
(Python's True is the int 1, and a YAML or JSON ``true`` is no count) and never a numeric string."""

from __future__ import annotations

from typing import Any


def is_int(value: Any) -> bool:
    """An int, not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """An int or a float, not a bool (inf and NaN are numbers here: check finiteness apart)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)
