"""The package's layers, read from its source (ast): which module imports which.

- the base layer (errors, text, values, window, student_t) imports nothing else of the package;
- importers/ reads logs into summaries and never needs the report (report/ reads summaries);
- no circle among the package's modules at import time (what a module imports at its top);
- library modules never import the command modules (`*/command.py`, `*_command.py`, cli.py):
  argparse and terminal output stay out of the callback's and the library's import chains.

Also: every refusal of the package is a NemoThroughputError and still the built-in error it was.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "nemo_throughput"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def is_command(module: str) -> bool:
    last = module.rsplit(".", 1)[-1]
    return last in ("command", "cli") or last.endswith("_command")


def _resolve(name: str) -> str | None:
    """The package module that `import name` runs, or None when it is not one of ours."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _targets(node: ast.Import | ast.ImportFrom, module: str) -> set[str]:
    """Modules of the package that an import statement loads."""
    if isinstance(node, ast.Import):
        return {target for alias in node.names if (target := _resolve(alias.name))}
    base = node.module or ""
    if node.level:  # relative: from the module's package
        package = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
        package = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1])
        base = f"{package}.{base}" if base else package
    # `from package import submodule` loads the submodule; `from module import name` the module
    return {target for alias in node.names if (target := _resolve(f"{base}.{alias.name}") or _resolve(base))}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(nodes: list[ast.stmt], module: str, top_level_only: bool) -> set[str]:
    """What these statements import; top_level_only: only what runs when the module is imported
    (not inside functions, not under `if TYPE_CHECKING`)."""
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found |= _targets(node, module)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and top_level_only:
            continue
        elif isinstance(node, ast.If) and top_level_only and _is_type_checking(node):
            found |= _imports(node.orelse, module, top_level_only)
        else:
            found |= _imports([child for child in ast.iter_child_nodes(node) if isinstance(child, ast.stmt)],
                              module, top_level_only)
    return found - {module}


def imports_of(module: str, top_level_only: bool = False) -> set[str]:
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"), filename=str(MODULES[module]))
    return _imports(tree.body, module, top_level_only)


def stdlib_imports_of(module: str) -> set[str]:
    """Top names of what `module` imports from outside the package (argparse, json...), anywhere in it."""
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.add(node.module.split(".")[0])
    return names - {"nemo_throughput"}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan), as sorted lists."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def test_the_reader_of_imports_sees_every_kind_of_import():
    """The checks below are only as good as this reader: from a package, relative, lazy, type-only."""
    source = """
from nemo_throughput.importers import megatron
from . import nemo
from ..flops import ModelSpec
import nemo_throughput.text
if TYPE_CHECKING:
    from nemo_throughput.summary import RunFacts
def later():
    from nemo_throughput.hardware import peak_tflops
"""
    nodes = ast.parse(source).body
    everything = {"nemo_throughput.importers.megatron", "nemo_throughput.importers.nemo", "nemo_throughput.flops",
                  "nemo_throughput.text", "nemo_throughput.summary", "nemo_throughput.hardware"}
    assert _imports(nodes, "nemo_throughput.importers.logs", top_level_only=False) == everything
    assert _imports(nodes, "nemo_throughput.importers.logs", top_level_only=True) == everything - {
        "nemo_throughput.summary", "nemo_throughput.hardware"}
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_the_base_layer_imports_only_itself():
    """errors, text and window sit under everything: they import no other module of the package."""
    base = {"nemo_throughput.errors", "nemo_throughput.text", "nemo_throughput.values", "nemo_throughput.window",
            "nemo_throughput.student_t"}
    assert {module: sorted(imports_of(module) - base) for module in base} == dict.fromkeys(base, [])


def test_importers_never_import_the_report():
    offenders = {module: sorted(target for target in imports_of(module) if target.startswith("nemo_throughput.report"))
                 for module in MODULES if module.startswith("nemo_throughput.importers")}
    assert {module: targets for module, targets in offenders.items() if targets} == {}


def test_no_import_circle_among_the_package_modules():
    graph = {module: imports_of(module, top_level_only=True) for module in MODULES}
    assert circles(graph) == []


def test_no_import_circle_even_through_imports_inside_functions():
    """A deferred import only hides a circle from Python: the modules still need each other."""
    graph = {module: imports_of(module) for module in MODULES}
    assert circles(graph) == []


def test_the_package_docstring_names_every_module():
    """The package docstring is the map of the layers: a module it leaves out is in no layer."""
    import nemo_throughput

    unnamed = sorted(module for module, path in MODULES.items() if path.name != "__init__.py"
                     and not re.search(rf"\b{path.stem}\b", nemo_throughput.__doc__))
    assert unnamed == []


def test_library_modules_never_import_the_command_modules():
    offenders = {module: sorted(target for target in imports_of(module) if is_command(target))
                 for module in MODULES if not is_command(module)}
    assert {module: targets for module, targets in offenders.items() if targets} == {}


def test_the_callback_does_not_load_argparse_code():
    """What the callback may import when a Trainer is made (at the top or later): no command module,
    no module that builds argument parsers."""
    seen, todo = set(), ["nemo_throughput.adapters.lightning"]
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo += imports_of(module)
    assert sorted(module for module in seen if is_command(module) or "argparse" in stdlib_imports_of(module)) == []


def test_every_refusal_is_a_nemo_throughput_error_and_still_what_it_was():
    import nemo_throughput
    from nemo_throughput.errors import NemoThroughputError
    from nemo_throughput.launch import LaunchError
    from nemo_throughput.outputs import OutputPathError
    from nemo_throughput.report.runs import IncompleteRun, ReportError
    from nemo_throughput.summary import OutputDirError

    assert nemo_throughput.NemoThroughputError is NemoThroughputError
    for error, builtin in ((ReportError, ValueError), (IncompleteRun, ValueError), (LaunchError, ValueError),
                           (OutputPathError, ValueError), (OutputDirError, OSError)):
        assert issubclass(error, NemoThroughputError) and issubclass(error, builtin), error
    assert issubclass(IncompleteRun, ReportError)
    directory_error = OutputDirError(13, "cannot write")
    assert directory_error.errno == 13 and str(directory_error) == "[Errno 13] cannot write"
    with pytest.raises(NemoThroughputError, match="use A:B"):
        from nemo_throughput.window import Window

        Window.parse("35-45")
