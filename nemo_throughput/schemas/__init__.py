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
    missing: dict[str, list[str]] = {}  # the fields missing at each path, said in one line
    problems = []
    for error in sorted(_summary_validator().iter_errors(summary), key=lambda e: [str(p) for p in e.absolute_path]):
        where = field_path(error.absolute_path)
        if error.validator == "required":
            missing.setdefault(where, []).append(_missing_name(error.message))
        else:
            problems.append(f"{where}: {_shortened(error.message)}")
    problems = [f"{where}: missing {', '.join(names)}" for where, names in missing.items()] + problems
    if len(problems) > MAX_PROBLEMS:
        problems[MAX_PROBLEMS:] = [f"... and {len(problems) - MAX_PROBLEMS} more"]
    return problems


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
