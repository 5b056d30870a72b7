"""``conformance/CATALOGUE.md``, the catalogue of check modules, generated from the test
modules' docstrings, so that what a module checks is written once, beside its tests.

    python -m conformance._catalogue    # rewrite CATALOGUE.md

``tests/test_catalogue.py`` fails when the file differs from what this makes.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

SUITE_DIR = Path(__file__).resolve().parent
CATALOGUE = SUITE_DIR / "CATALOGUE.md"
CHECKS_DIR = SUITE_DIR / "checks"
HEADER = (
    "# Catalogue of checks\n\n"
    "<!-- made by `python -m conformance._catalogue` from the test modules' docstrings; "
    "edit those, not this -->\n\n"
    "What each check module of the suite judges, in file-name order. "
    "[README.md](README.md) says how the suite is built.\n"
)


def _markdown(docstring: str) -> str:
    """A docstring as Markdown: reStructuredText's double backticks become single ones."""
    return re.sub(r"``([^`]+)``", r"`\1`", docstring)


def catalogue(checks_dir: Path = CHECKS_DIR) -> str:
    """The file's text: a header, then one section per test module, its docstring."""
    sections = [HEADER]
    for module in sorted(checks_dir.glob("test_*.py")):
        docstring = ast.get_docstring(ast.parse(module.read_text()))
        if not docstring:
            raise ValueError(f"{module.name} has no docstring: say what it checks")
        sections.append(f"## `{module.name}`\n\n{_markdown(docstring)}\n")
    return "\n".join(sections)


def main() -> int:
    CATALOGUE.write_text(catalogue())
    print(f"wrote {CATALOGUE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
