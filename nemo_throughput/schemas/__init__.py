"""The machine-readable schemas of what the package writes, shipped with it: one file each, the
single source of their fields (the docs page is generated from it)."""

from __future__ import annotations

import functools
import json
from importlib import resources
from typing import Any

SUMMARY_SCHEMA_ID = "nemo-throughput/summary/v1"  # a summary's "schema" value, and the schema file's $id
SUMMARY_SCHEMA_FILE = "summary-v1.json"
MAX_PROBLEMS = 5  # problems listed for one file; the rest are counted


@functools.lru_cache(maxsize=1)
def load_summary_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a v1 summary, from the package's data."""
    return json.loads(resources.files(__name__).joinpath(SUMMARY_SCHEMA_FILE).read_text(encoding="utf-8"))


@functools.lru_cache(maxsize=1)
def _summary_validator() -> Any:
    import jsonschema  # only where a summary is checked: --help and the training loop do without it

    return jsonschema.Draft202012Validator(load_summary_schema())


def validate_summary(summary: Any) -> list[str]:
    """What is wrong with ``summary`` against the v1 schema, one line per problem naming the field
    path and what was expected (at most MAX_PROBLEMS lines, then how many more); [] when valid."""
    summary, kept = _steps_by_shape(summary)
    missing: dict[str, list[str]] = {}  # the fields missing at each path, said in one line
    problems = []
    for error in sorted(_summary_validator().iter_errors(summary), key=lambda e: [str(p) for p in e.absolute_path]):
        where = field_path(_original_path(error.absolute_path, kept))
        if error.validator == "required":
            missing.setdefault(where, []).append(_missing_name(error.message))
        else:
            problems.append(f"{where}: {_shortened(error.message)}")
    problems = [f"{where}: missing {', '.join(names)}" for where, names in missing.items()] + problems
    if len(problems) > MAX_PROBLEMS:
        problems[MAX_PROBLEMS:] = [f"... and {len(problems) - MAX_PROBLEMS} more"]
    return problems


# An imported run's timing.steps holds every [step, seconds] of its log: a million items in a long run's,
# each validated by jsonschema in some 40 µs. Its items' schema says only what type each value is, so an
# item is valid or not by the JSON types of its values alone: one item of each such shape is validated.
_STEPS = ("timing", "steps")
_TYPE_KEYWORDS = {"type", "prefixItems", "minItems", "maxItems", "description"}


def _steps_by_shape(summary: Any) -> tuple[Any, list[int] | None]:
    """``summary`` with timing.steps cut to the first item of each shape, and the kept items' indices
    (None: not cut, where the items' schema says more than types or the summary has no such list)."""
    timing = summary.get("timing") if isinstance(summary, dict) else None
    steps = timing.get("steps") if isinstance(timing, dict) else None
    if not isinstance(steps, list) or not _types_only(_steps_schema()):
        return summary, None
    first: dict[tuple[Any, ...], int] = {}
    for index, item in enumerate(steps):
        first.setdefault(_shape(item), index)
    kept = sorted(first.values())
    return {**summary, "timing": {**timing, "steps": [steps[i] for i in kept]}}, kept


def _shape(item: Any) -> Any:
    """What a type-only schema of an item can tell of it: its JSON type, and an array's values' types."""
    return tuple(_json_type(value) for value in item) if isinstance(item, list) else _json_type(item)


def _json_type(value: Any) -> Any:
    """The Python type standing for the JSON types ``value`` has (an integral float is an integer too)."""
    return (float, value.is_integer()) if isinstance(value, float) else type(value)


def _steps_schema() -> dict[str, Any]:
    return load_summary_schema()["properties"][_STEPS[0]]["properties"][_STEPS[1]]["items"]


def _types_only(schema: dict[str, Any]) -> bool:
    return set(schema) <= _TYPE_KEYWORDS and all(set(s) <= {"type", "description"} for s in schema["prefixItems"])


def _original_path(path: Any, kept: list[int] | None) -> list[Any]:
    """An error's path in the summary as given: an index into the cut timing.steps mapped back."""
    path = list(path)
    if kept is not None and path[:2] == list(_STEPS) and len(path) > 2:
        path[2] = kept[path[2]]
    return path


def _missing_name(message: str) -> str:
    return message.removesuffix(" is a required property")


def _shortened(message: str, limit: int = 160) -> str:
    """jsonschema's message quotes the whole value: a long one is cut (a line per problem)."""
    return message if len(message) <= limit else message[:limit - 3] + "..."


def field_path(path: Any) -> str:
    """A path in a JSON document as written in the docs: ``timing.step_time_s.mean``,
    ``environment.nodes[0].name``; ``(top level)`` for the document itself."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(top level)"
