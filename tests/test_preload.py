"""``HARNESS_PRELOAD``: every rank imports the named modules before it joins its world (the
controller too, where they may register a backend), and a module that cannot be imported is a
usage error naming it, before any test runs."""

from __future__ import annotations

import pytest

from harness._preload import PRELOAD
from tests._inner import run_inner, start_session

pytestmark = pytest.mark.slow

MARKER = "import torch.distributed\nJOINED_AT_IMPORT = torch.distributed.is_initialized()\n"


def test_every_rank_imports_the_preloaded_modules_first(tmp_path, monkeypatch):
    (tmp_path / "preload_marker.py").write_text(MARKER)
    monkeypatch.setenv(PRELOAD, "preload_marker")
    run = run_inner("inner_preload.py", tmp_path / "run", pythonpath=tmp_path)
    assert run.outcome("test_the_preloaded_module_was_imported_before_joining[w2]") == "passed"


def test_a_module_that_cannot_be_imported_is_a_usage_error(tmp_path, monkeypatch):
    monkeypatch.setenv(PRELOAD, "no_such_preload_module")
    completed = start_session(tmp_path)
    assert completed.returncode == pytest.ExitCode.USAGE_ERROR, completed.stdout
    assert "HARNESS_PRELOAD: No module named 'no_such_preload_module'" in completed.stderr
