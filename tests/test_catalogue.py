"""The catalogue of checks in ``conformance/README.md`` is the test modules' docstrings, fresh."""

from __future__ import annotations

from pathlib import Path

import pytest

from conformance import _catalogue


def test_the_readme_catalogue_is_fresh() -> None:
    readme = _catalogue.README.read_text()
    assert readme == _catalogue.refreshed(readme), (
        "conformance/README.md's catalogue is stale: run python -m conformance._catalogue"
    )


def test_the_catalogue_is_made_from_every_test_modules_docstring(tmp_path: Path) -> None:
    (tmp_path / "test_b.py").write_text('"""Checks ``b``.\n\nIn two paragraphs."""\n')
    (tmp_path / "test_a.py").write_text('"""Checks a."""\n')
    (tmp_path / "_helper.py").write_text('"""Not a test module."""\n')
    readme = f"intro\n{_catalogue.BEGIN}\nold text\n{_catalogue.END}\noutro\n"
    assert _catalogue.refreshed(readme, tmp_path) == (
        f"intro\n{_catalogue.BEGIN}\n\n### `test_a.py`\n\nChecks a.\n\n"
        f"### `test_b.py`\n\nChecks `b`.\n\nIn two paragraphs.\n\n{_catalogue.END}\noutro\n"
    )


def test_a_test_module_without_a_docstring_is_refused(tmp_path: Path) -> None:
    (tmp_path / "test_silent.py").write_text("def test_x(): pass\n")
    with pytest.raises(ValueError, match=r"test_silent\.py has no docstring"):
        _catalogue.catalogue(tmp_path)
