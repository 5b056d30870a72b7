"""conformance's SPMD property search: one search, the same examples and verdict everywhere."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests._inner import InnerRun, run_inner

pytestmark = pytest.mark.slow

SUITE_ROOT = Path(__file__).parent.parent


@pytest.fixture(scope="module")
def searches(tmp_path_factory: pytest.TempPathFactory) -> InnerRun:
    return run_inner(
        "inner_spmd_property.py", tmp_path_factory.mktemp("spmd"), pythonpath=SUITE_ROOT
    )


def test_every_rank_checks_the_same_examples(searches: InnerRun) -> None:
    name = "test_every_rank_checks_the_same_examples[w2]"
    assert searches.outcome(name) == "passed", searches.message(name)


def test_a_failure_on_one_rank_fails_and_shrinks_on_every_rank(searches: InnerRun) -> None:
    name = "test_a_failure_on_one_rank_fails_every_rank[w2]"
    assert searches.outcome(name) == "failed"
    message = searches.message(name)
    assert "ranks 0, 1 failed" in message
    # rank 0's search shrank to the smallest failing example and says where it failed
    assert "this example failed on another rank" in message
    assert "spec=3," in message
    # rank 1 fails with its own error on that example
    assert "AssertionError: rank 1 rejects 3" in message
    assert "example: 3" in message
