"""The catalogue of checks in ``conformance/README.md``, generated from the test modules'
docstrings, so that what a module checks is written once, beside its tests.

    python -m conformance._catalogue    # rewrite the catalogue section of the README

``tests/test_catalogue.py`` fails when the README's catalogue differs from what this makes.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

from conformance._readme_section import with_section

SUITE_DIR = Path(__file__).resolve().parent
README = SUITE_DIR / "README.md"
BEGIN = (
    "<!-- catalogue: made by `python -m conformance._catalogue` from the test modules' "
    "docstrings; edit those, not this -->"
)
END = "<!-- end of catalogue -->"


def _markdown(docstring: str) -> str:
    """A docstring as Markdown: reStructuredText's double backticks become single ones."""
    return re.sub(r"``([^`]+)``", r"`\1`", docstring)


def catalogue(suite_dir: Path = SUITE_DIR) -> str:
    """One section per test module, in file-name order: its docstring."""
    sections = []
    for module in sorted(suite_dir.glob("test_*.py")):
        docstring = ast.get_docstring(ast.parse(module.read_text()))
        if not docstring:
            raise ValueError(f"{module.name} has no docstring: say what it checks")
        sections.append(f"### `{module.name}`\n\n{_markdown(docstring)}\n")
    return "\n".join(sections)


def refreshed(readme: str, suite_dir: Path = SUITE_DIR) -> str:
    """``readme`` with the text between ``BEGIN`` and ``END`` made anew."""
    return with_section(readme, BEGIN, END, f"\n{catalogue(suite_dir)}")


def main() -> int:
    README.write_text(refreshed(README.read_text()))
    print(f"wrote the catalogue into {README}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
