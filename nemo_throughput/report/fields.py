"""Checked access to a JSON document's fields (a summary's, as the report reads it): each error
names where the document is from, the field, its value and what it must be."""

from __future__ import annotations

import math
from typing import Any

from nemo_throughput.errors import ReportError
from nemo_throughput.values import is_int, is_number


class Fields:
    """Checked access to the fields of a JSON document: each error names where the document is
    from, the field, its value and what it must be."""

    def __init__(self, where: str, document: Any) -> None:
        self.where = where
        self.document = document

    def value(self, dotted: str, default: Any = ...) -> Any:
        """The field at `a.b.c`; a missing one is an error unless a default is given."""
        node, walked = self.document, []
        for name in dotted.split("."):
            if not isinstance(node, dict):
                raise self.error(".".join(walked), node, "it must be an object")
            walked.append(name)
            if name not in node:
                if default is not ...:
                    return default
                raise ReportError(f"{self.where}: {'.'.join(walked)} is missing")
            node = node[name]
        return node

    def optional(self, dotted: str) -> Any:
        """The field at `a.b.c`, or None when it, or an object on the way to it, is missing or null
        (sections that older summaries lack, or that a run left empty)."""
        node, walked = self.document, []
        for name in dotted.split("."):
            if node is None:
                return None
            if not isinstance(node, dict):
                raise self.error(".".join(walked), node, "it must be an object or null")
            walked.append(name)
            node = node.get(name)
        return node

    def optional_number(self, dotted: str) -> float | None:
        value = self.optional(dotted)
        if value is None:
            return None
        if not is_non_negative_finite(value):
            raise self.error(dotted, value, "it must be a finite number >= 0 or null (not measured)")
        return float(value)

    def optional_text(self, dotted: str) -> str | None:
        value = self.optional(dotted)
        if value is not None and (not isinstance(value, str) or not value):
            raise self.error(dotted, value, "it must be a non-empty string or null")
        return value

    def count(self, dotted: str) -> int:
        value = self.value(dotted)
        if not is_count(value):
            raise self.error(dotted, value, "it must be an integer >= 1")
        return value

    def positive(self, dotted: str, *, optional: bool = False) -> float | None:
        value = self.value(dotted)
        if optional and value is None:
            return None
        if not is_positive_finite(value):
            or_null = " or null (unknown)" if optional else ""
            raise self.error(dotted, value, f"it must be a positive finite number{or_null}")
        return float(value)

    def text(self, dotted: str, *, optional: bool = False) -> str | None:
        value = self.value(dotted)
        if optional:
            if value is not None and not isinstance(value, str):
                raise self.error(dotted, value, "it must be a string or null")
            return value
        if not isinstance(value, str) or not value:
            raise self.error(dotted, value, "it must be a non-empty string")
        return value

    def error(self, dotted: str, value: Any, requirement: str) -> ReportError:
        return ReportError(f"{self.where}: {dotted} is {shown(value)}; {requirement}")


def is_count(value: Any) -> bool:
    return is_int(value) and value >= 1


def is_index(value: Any) -> bool:
    return is_int(value) and value >= 0


def is_finite(value: Any) -> bool:
    if not is_number(value):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an integer beyond float range
        return False


def is_non_negative_finite(value: Any) -> bool:
    return is_finite(value) and value >= 0


def is_positive_finite(value: Any) -> bool:
    if not is_number(value):
        return False
    try:
        return math.isfinite(value) and value > 0
    except OverflowError:  # an integer beyond float range
        return False


def shown(value: Any, limit: int = 60) -> str:
    """A value as it may appear in a message: its repr (control characters escaped), shortened."""
    return shortened(repr(value), limit)


def shortened(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."
