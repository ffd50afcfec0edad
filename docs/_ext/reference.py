"""Reference tables generated from the code, so that the docs cannot drift from it.

``{nemo-throughput-settings}``: every field of ``ThroughputConfig`` with its type, default and the
docstring written under the field. ``{nemo-throughput-schema}``: every field of the shipped summary
JSON Schema with its type and description, one table per section. ``{nemo-throughput-peaks}``: the
GPU table's dense peaks per dtype, with each row's source."""

from __future__ import annotations

import ast
import inspect
import re
from dataclasses import MISSING, fields
from typing import Any

from docutils import nodes
from sphinx.util.docutils import SphinxDirective

from nemo_throughput.config import ThroughputConfig
from nemo_throughput.hardware import ACCELERATORS, DTYPES
from nemo_throughput.progress import LOGGED_METRICS
from nemo_throughput.schemas import load_summary_schema


def _inline(text: str) -> list[nodes.Node]:
    """Plain text with `code` spans as literal nodes (no reST parsing: the text is the code's own)."""
    parts = re.split(r"``?([^`]+)``?", text)
    return [nodes.literal(part, part) if i % 2 else nodes.Text(part) for i, part in enumerate(parts) if part]


def _table(header: list[str], rows: list[list[str]], widths: list[int]) -> nodes.table:
    table = nodes.table(classes=["longtable"])
    group = nodes.tgroup(cols=len(header))
    table += group
    group += [nodes.colspec(colwidth=width) for width in widths]
    head, body = nodes.thead(), nodes.tbody()
    group += [head, body]
    for cells, part in [(header, head)] + [(row, body) for row in rows]:
        row_node = nodes.row()
        for i, cell in enumerate(cells):
            content = nodes.literal(cell, cell) if (i == 0 and part is body) else _inline(cell)
            row_node += nodes.entry("", nodes.paragraph("", "", *([content] if isinstance(content, nodes.Node)
                                                                    else content)))
        part += row_node
    return table


def field_docs(cls: type) -> dict[str, str]:
    """The docstring written under each field of a dataclass (the string literal after it)."""
    docs: dict[str, str] = {}
    body = ast.parse(inspect.getsource(cls)).body[0].body
    for node, following in zip(body, body[1:], strict=False):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(following, ast.Expr)
                and isinstance(following.value, ast.Constant) and isinstance(following.value.value, str)):
            docs[node.target.id] = inspect.cleandoc(following.value.value).replace("\n", " ")
    return docs


class SettingsTable(SphinxDirective):
    """Every setting of ThroughputConfig: name, type, default, meaning."""

    def run(self) -> list[nodes.Node]:
        docs = field_docs(ThroughputConfig)
        rows = []
        for field in fields(ThroughputConfig):
            if field.name not in docs:
                raise self.error(f"ThroughputConfig.{field.name} has no docstring under it")
            default = "" if field.default is MISSING else _yaml(field.default)
            rows.append([field.name, str(field.type), f"`{default}`", docs[field.name]])
        return [_table(["setting", "type", "default", "meaning"], rows, [18, 14, 10, 58])]


def _yaml(value: Any) -> str:
    """A default as it is written in a Hydra override or YAML file."""
    if value is None:
        return "null"
    return str(value).lower() if isinstance(value, bool) else str(value)


def _type_of(spec: dict[str, Any], defs: dict[str, Any]) -> str:
    if "$ref" in spec:
        spec = {**defs[spec["$ref"].rsplit("/", 1)[-1]], **{k: v for k, v in spec.items() if k != "$ref"}}
    if "const" in spec:
        return f"`{spec['const']}`"
    if "enum" in spec:
        return " | ".join(f"`{value}`" for value in spec["enum"])
    kind = spec.get("type", "any")
    return " | ".join(kind) if isinstance(kind, list) else kind


def _resolved(spec: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    if "$ref" not in spec:
        return spec
    return {**defs[spec["$ref"].rsplit("/", 1)[-1]], **{k: v for k, v in spec.items() if k != "$ref"}}


def schema_rows(spec: dict[str, Any], defs: dict[str, Any], path: str, required: bool) -> list[list[str]]:
    """One row per field under ``path``, depth first; array items under ``path[]``."""
    spec = _resolved(spec, defs)
    rows = [[path, _type_of(spec, defs), "yes" if required else "", spec.get("description", "")]] if path else []
    needed = set(spec.get("required", []))
    for name, child in spec.get("properties", {}).items():
        rows += schema_rows(child, defs, f"{path}.{name}" if path else name, name in needed)
    items = spec.get("items")
    if isinstance(items, dict) and (_resolved(items, defs).get("properties")):
        rows += schema_rows(items, defs, f"{path}[]", False)[1:] if path else []
    return rows


class SchemaTables(SphinxDirective):
    """The summary schema, one table per top-level field group."""

    def run(self) -> list[nodes.Node]:
        schema = load_summary_schema()
        defs = schema.get("$defs", {})
        needed = set(schema["required"])
        sections: list[nodes.Node] = []
        loose = []
        for name, spec in schema["properties"].items():
            rows = schema_rows(spec, defs, name, name in needed)
            if len(rows) == 1:
                loose += rows
                continue
            sections += [nodes.rubric("", "", nodes.literal(name, name)), nodes.paragraph("", "", *_inline(rows[0][3])),
                         _table(SCHEMA_COLUMNS, rows[1:], SCHEMA_WIDTHS)]
        return [nodes.paragraph("", "", *_inline(schema["description"])), nodes.rubric("", "top-level fields"),
                _table(SCHEMA_COLUMNS, loose, SCHEMA_WIDTHS), *sections]


SCHEMA_COLUMNS, SCHEMA_WIDTHS = ["field", "type", "required", "meaning"], [30, 16, 8, 46]


class PeaksTable(SphinxDirective):
    """The GPU table: part, the pattern matched on the driver's name, dense TFLOPS per dtype, source."""

    def run(self) -> list[nodes.Node]:
        rows = [[accelerator.name, f"`{accelerator.pattern}`",
                 *(f"{accelerator.peak_tflops[dtype]:g}" if dtype in accelerator.peak_tflops else "–"
                   for dtype in DTYPES), accelerator.source] for accelerator in ACCELERATORS]
        return [_table(["part", "driver name (regex)", *DTYPES, "source"], rows,
                       [12, 14, *(6 for _ in DTYPES), 38])]


class LoggedMetricsTable(SphinxDirective):
    """The keys the loggers get (progress.LOGGED_METRICS): key, unit, meaning."""

    def run(self) -> list[nodes.Node]:
        rows = [[f"`throughput/{m.key}`", m.unit, m.meaning] for m in LOGGED_METRICS]
        return [_table(["key", "unit", "meaning"], rows, [30, 12, 58])]


def setup(app: Any) -> dict[str, Any]:
    app.add_directive("nemo-throughput-logged-metrics", LoggedMetricsTable)
    app.add_directive("nemo-throughput-peaks", PeaksTable)
    app.add_directive("nemo-throughput-settings", SettingsTable)
    app.add_directive("nemo-throughput-schema", SchemaTables)
    return {"parallel_read_safe": True, "version": "1"}
