"""Torchrun mode: the same world tests, launched by torchrun, agreed through the store."""

from __future__ import annotations

import sys

import pytest

from tests._inner import InnerRun, run_inner

pytestmark = pytest.mark.slow


def torchrun(nproc: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
    ]


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> InnerRun:
    return run_inner("inner_torchrun.py", tmp_path_factory.mktemp("tr2"), launcher=torchrun(2))


@pytest.fixture(scope="module")
def four(tmp_path_factory: pytest.TempPathFactory) -> InnerRun:
    return run_inner(
        "inner_torchrun.py", tmp_path_factory.mktemp("tr4"), "-k", "not hangs", launcher=torchrun(4)
    )


def test_only_tests_of_the_launched_size_run(two: InnerRun, four: InnerRun) -> None:
    assert "test_allreduce[w2]" in two.cases
    assert "test_allreduce[w4]" not in two.cases
    assert "test_allreduce[w4]" in four.cases
    assert "test_allreduce[w2]" not in four.cases
    assert four.outcome("test_allreduce[w4]") == "passed"


@pytest.mark.parametrize("name", ["test_plain", "test_allreduce[w2]", "test_shared_tmp_path[w2]"])
def test_passing_tests_pass(two: InnerRun, name: str) -> None:
    assert two.outcome(name) == "passed"


def test_failure_on_one_rank_fails_everywhere_and_names_the_rank(four: InnerRun) -> None:
    message = four.message("test_fails_on_last_rank[w4]")
    assert four.outcome("test_fails_on_last_rank[w4]") == "failed"
    assert "rank 3 failed, ranks 0, 1, 2 passed" in message
    assert "assert 3 != (4 - 1)" in message
    assert "output of rank 3" in message


def test_skip_counts_only_when_all_ranks_skip(four: InnerRun) -> None:
    assert four.outcome("test_skips_on_last_rank[w4]") == "failed"
    assert "rank 3 skipped" in four.message("test_skips_on_last_rank[w4]")
    assert four.outcome("test_skips_everywhere[w4]") == "skipped"


def test_xfail_applies_to_the_agreed_failure(four: InnerRun) -> None:
    assert four.outcome("test_xfail_on_rank_zero[w4]") == "skipped"  # junit's xfail


def test_rank_zero_alone_reports(four: InnerRun) -> None:
    assert four.output.count("test session starts") == 1


def test_hang_is_cut_with_stacks_and_the_reports_are_written(two: InnerRun) -> None:
    name = "test_hangs_on_rank_one[w2]"
    assert two.outcome(name) == "failed"
    assert "rank 1 hung" in two.message(name)
    assert "did not finish within the 3 s deadline" in two.message(name)
    assert "in test_hangs_on_rank_one" in two.message(name)
    assert len(two.cases) == 8  # every test before the hang, and the hang itself
    assert two.returncode != 0
