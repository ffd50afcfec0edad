"""Sphinx configuration of the nemo-throughput documentation (Sphinx + MyST Markdown).

Build: ``.venv/bin/python -m sphinx -W -b html docs docs/_build/html`` (tests/test_docs.py builds it
with warnings as errors). The settings, CLI and summary-schema pages are generated from the code."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent / "_ext"))

project = "nemo-throughput"
author = "nemo-throughput developers"
copyright = "2026, nemo-throughput developers"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinxarg.ext",
    "reference",  # docs/_ext/reference.py: the settings and summary-schema tables, from the code
]

source_suffix = {".md": "markdown"}
exclude_patterns = ["_build"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 4  # `page.md#section-title` links, as GitHub spells them

autodoc_member_order = "bysource"
autodoc_typehints = "description"

html_theme = "nvidia_sphinx_theme"
html_title = "nemo-throughput"
html_show_sourcelink = False
smartquotes = False  # `--submit` stays two hyphens
