"""How rank processes start: forked from a template per rank that imported the session's test
modules once (``--world-start fork``, the default on CPU), or each a fresh interpreter
(``spawn``); both give a rank the same environment, hash seed and session of its own."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests._inner import INNER_DIR, InnerRun, run_inner

pytestmark = pytest.mark.slow

STARTS = ("fork", "spawn")


@pytest.fixture(scope="module", params=STARTS)
def started(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> InnerRun:
    workdir = tmp_path_factory.mktemp(request.param)
    failing = workdir / "inner_rank_import_error.py"
    shutil.copy(INNER_DIR / failing.name, failing)
    return run_inner("inner_rank_start.py", workdir, str(failing), "--world-start", request.param)


def records(run: InnerRun, name: str) -> list[dict[str, object]]:
    folder = run.workdir / "starts"
    return [json.loads((folder / f"{name}-r{rank}.json").read_text()) for rank in (0, 1)]


def start_of(run: InnerRun) -> str:
    return run.workdir.name.rstrip("0123456789")


def test_each_world_has_processes_of_its_own(started: InnerRun) -> None:
    assert started.outcome("test_first_world[w2]") == "passed", started.message(
        "test_first_world[w2]"
    )
    assert started.outcome("test_second_world[w2]") == "passed"
    first, second = records(started, "first"), records(started, "second")
    pids = [record["pid"] for record in first + second]
    assert len(set(pids)) == 4
    assert all(record["session"] == record["pid"] for record in first + second)


def test_forked_ranks_find_their_test_module_imported_by_their_rank_template(
    started: InnerRun,
) -> None:
    first, second = records(started, "first"), records(started, "second")
    if start_of(started) == "spawn":
        assert all(record["imported_by"] == record["pid"] for record in first + second)
        return
    # One template per rank index imported the module once, before either world started.
    templates = [record["imported_by"] for record in first]
    assert len(set(templates)) == 2
    assert [record["imported_by"] for record in second] == templates
    assert all(record["imported_by"] != record["pid"] for record in first + second)


def test_ranks_have_the_hash_seed_and_threads_of_their_rank(started: InnerRun) -> None:
    for name in ("first", "second"):
        got = [(record["hash_seed"], record["omp_threads"]) for record in records(started, name)]
        assert got == [("1", "1"), ("2", "1")]


def test_a_module_that_ranks_cannot_import_fails_its_tests_with_the_ranks_error(
    started: InnerRun,
) -> None:
    name = "test_in_a_module_ranks_cannot_import[w2]"
    assert started.outcome(name) == "failed"
    assert "ranks 0, 1 failed" in started.message(name)
    assert "RuntimeError: this module cannot be imported on a rank" in started.message(name)


@pytest.mark.parametrize("start", STARTS)
def test_a_module_that_ends_ranks_on_import_fails_its_own_tests_alone(
    start: str, tmp_path: Path
) -> None:
    later = tmp_path / "inner_rank_after_exit.py"
    shutil.copy(INNER_DIR / later.name, later)
    run = run_inner("inner_rank_exit_at_import.py", tmp_path, str(later), "--world-start", start)
    ending = "test_in_a_module_that_ends_ranks[w2]"
    assert run.outcome(ending) == "failed"
    assert "exited with code 3" in run.message(ending)
    after = "test_after_a_module_that_ends_ranks[w2]"
    assert run.outcome(after) == "passed", run.message(after)
    if start == "fork":
        assert "template of rank 0 was started again without the test modules" in run.output
