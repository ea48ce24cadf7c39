"""Sphinx configuration: the site is README.md (its front page) and the guides in docs/.

Build it, failing on any warning (a broken link, anchor or reference included):

    python -m sphinx -W --keep-going -c docs . build/docs
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))  # markdown_source, the Markdown parser

project = "Sensorium"
# The package's version, read rather than imported: the build needs no install.
INIT = (HERE.parent / "__init__.py").read_text()
release = version = re.findall(r'__version__ = "(.+)"', INIT)[0]
extensions = ["markdown_source"]
root_doc = "README"
# The guides, and the READMEs beside the code that they link to (reached by links,
# not in the navigation).
include_patterns = ["README.md", "docs/*.md", "bench/*.md", "deploy/**.md"]
exclude_patterns = ["build", ".venv"]
nitpicky = True  # every unresolved reference is a warning, so -W fails on it
# Samples elide with "…", which no JSON lexer accepts; Sphinx then highlights them
# leniently, so this warning says nothing about the docs being wrong.
suppress_warnings = ["misc.highlighting_failure"]
html_title = f"Sensorium {version}"
html_show_sourcelink = False
