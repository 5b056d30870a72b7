"""``HARNESS_PRELOAD``: every rank imports the named modules before it joins its world,
and a module that cannot be imported fails the world's start-up, naming it."""

from __future__ import annotations

from harness._preload import PRELOAD
from tests._inner import run_inner

MARKER = "import torch.distributed\nJOINED_AT_IMPORT = torch.distributed.is_initialized()\n"


def test_every_rank_imports_the_preloaded_modules_first(tmp_path, monkeypatch):
    (tmp_path / "preload_marker.py").write_text(MARKER)
    monkeypatch.setenv(PRELOAD, "preload_marker")
    run = run_inner("inner_preload.py", tmp_path / "run", pythonpath=tmp_path)
    assert run.outcome("test_the_preloaded_module_was_imported_before_joining[w2]") == "passed"


def test_a_module_that_cannot_be_imported_fails_the_start_up(tmp_path, monkeypatch):
    monkeypatch.setenv(PRELOAD, "no_such_preload_module")
    run = run_inner("inner_preload.py", tmp_path / "run")
    name = "test_the_preloaded_module_was_imported_before_joining[w2]"
    assert run.outcome(name) in ("failed", "error")
    assert "no_such_preload_module" in run.message(name) + run.output
    assert run.returncode != 0
