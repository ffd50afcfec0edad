"""The documentation site: it builds with no warning, its reference pages hold what the code
defines, every command of its getting-started page works, and the README stays short."""

import json
import re
import shutil
import subprocess
import sys
from dataclasses import fields
from html.parser import HTMLParser
from pathlib import Path

import pytest

from nemo_throughput.cli import build_parser
from nemo_throughput.config import ThroughputConfig
from nemo_throughput.schemas import load_summary_schema

ROOT = Path(__file__).parent.parent
DOCS = ROOT / "docs"


class _Text(HTMLParser):
    def __init__(self):
        super().__init__()
        self.parts = []

    def handle_data(self, data):
        self.parts.append(data)


def page_text(html: Path) -> str:
    parser = _Text()
    parser.feed(html.read_text())
    return " ".join(" ".join(parser.parts).split())


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("docs-html")
    build = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", DOCS, out],
                           capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, f"the docs build warned or failed:\n{build.stderr}"
    return out


def test_the_docs_build_with_warnings_as_errors(site):
    assert (site / "index.html").exists()
    built = {path.relative_to(site).with_suffix("").as_posix() for path in site.rglob("*.html")}
    sources = {path.relative_to(DOCS).with_suffix("").as_posix() for path in DOCS.rglob("*.md")
               if "_build" not in path.parts}
    assert sources <= built


def test_the_settings_page_lists_every_setting_with_its_default_and_meaning(site):
    text = page_text(site / "configuration.html")
    for field in fields(ThroughputConfig):
        assert re.search(rf"\b{field.name} ", text), field.name
    assert "log_every_n_steps int 10 Steps between cross-rank exchanges" in text
    assert "flops_formula str megatron" in text


def summary_fields(spec, defs, path=""):
    if "$ref" in spec:
        spec = defs[spec["$ref"].rsplit("/", 1)[-1]]
    for name, child in spec.get("properties", {}).items():
        yield f"{path}.{name}" if path else name
        yield from summary_fields(child, defs, f"{path}.{name}" if path else name)


def test_the_schema_page_describes_every_summary_field(site):
    schema = load_summary_schema()
    text = page_text(site / "reference" / "summary-schema.html")
    described = list(summary_fields(schema, schema["$defs"]))
    assert len(described) > 100
    for field in described:
        assert f" {field} " in f" {text} ", field
    assert "timing.step_time_s.mean number yes mean step time, seconds" in text


def test_the_cli_page_shows_every_subcommand_and_option(site):
    text = page_text(site / "reference" / "cli.html")
    subcommands = build_parser()._subparsers._group_actions[0].choices
    assert {"demo", "launch", "report", "import", "bench", "probe"} <= set(subcommands)
    for name, parser in subcommands.items():
        assert name in text
        for action in parser._actions:
            for option in action.option_strings:
                assert option in text or option in ("-h", "--help"), f"{name} {option}"


def console_commands(page: Path) -> list[str]:
    """The `$ ` lines of a page's ```console blocks, continuation lines joined."""
    commands, block = [], False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            block = line.strip() == "```console"
        elif block and line.startswith("$ "):
            commands.append(line[2:])
        elif block and commands and commands[-1].endswith("\\"):
            commands[-1] = commands[-1][:-1] + line
    return commands


@pytest.mark.slow
def test_every_command_of_the_getting_started_page_works():
    commands = console_commands(DOCS / "getting-started.md")
    assert any(command.startswith(".ci/setup") for command in commands)
    runs = ROOT / "nemo_throughput_runs"
    before = set(runs.iterdir()) if runs.exists() else set()
    try:
        for command in commands:
            result = subprocess.run(["bash", "-c", command], cwd=ROOT, capture_output=True, text=True, timeout=300)
            assert result.returncode == 0, f"$ {command}\n{result.stdout}\n{result.stderr}"
        made = set(runs.iterdir()) - before
        (summary,) = [path for run in made for path in run.rglob("summary.json")]
        assert json.loads(summary.read_text())["status"] == "completed"
    finally:
        for run in (set(runs.iterdir()) - before) if runs.exists() else ():
            shutil.rmtree(run)


def test_the_readme_is_short_and_keeps_the_two_set_up_commands():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    assert ".ci/setup && .venv/bin/nemo-throughput demo" in readme
    assert re.search(r"^\.ci/test\b", readme, re.M)


def test_the_arithmetic_page_lists_every_gpu_with_its_peaks_and_source(site):
    from nemo_throughput.hardware import ACCELERATORS

    text = page_text(site / "arithmetic.html")
    for accelerator in ACCELERATORS:
        assert accelerator.name in text and " ".join(accelerator.source.split()) in text, accelerator.name
    assert "B300 \\bB300\\b 13500 4500 2250 2250 1100 75" in text
