"""``conformance/CATALOGUE.md`` is the test modules' docstrings, fresh."""

from __future__ import annotations

from pathlib import Path

import pytest

from conformance import _catalogue


def test_the_catalogue_file_is_fresh() -> None:
    assert _catalogue.CATALOGUE.read_text() == _catalogue.catalogue(), (
        "conformance/CATALOGUE.md is stale: run python -m conformance._catalogue"
    )


def test_the_catalogue_is_made_from_every_test_modules_docstring(tmp_path: Path) -> None:
    (tmp_path / "test_b.py").write_text('"""Checks ``b``.\n\nIn two paragraphs."""\n')
    (tmp_path / "test_a.py").write_text('"""Checks a."""\n')
    (tmp_path / "_helper.py").write_text('"""Not a test module."""\n')
    assert _catalogue.catalogue(tmp_path) == (
        f"{_catalogue.HEADER}\n## `test_a.py`\n\nChecks a.\n\n"
        "## `test_b.py`\n\nChecks `b`.\n\nIn two paragraphs.\n"
    )


def test_a_test_module_without_a_docstring_is_refused(tmp_path: Path) -> None:
    (tmp_path / "test_silent.py").write_text("def test_x(): pass\n")
    with pytest.raises(ValueError, match=r"test_silent\.py has no docstring"):
        _catalogue.catalogue(tmp_path)
