"""How long a failed rank's peers may still finish: pytest keeps only that a test it
reports as expected to fail failed, so its peers are cut sooner than others'."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import TestRequest, WorldPool, WorldSpec
from harness._world import EXPECTED_FAILURE_GRACE_S, FAILED_GRACE_S
from tests.test_pool import BODIES, settings

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    ("failure_expected", "grace_s"),
    [(False, FAILED_GRACE_S), (True, EXPECTED_FAILURE_GRACE_S)],
    ids=["unexpected", "expected"],
)
def test_peers_of_a_failed_rank_are_cut_after_the_grace_of_its_kind(
    tmp_path: Path, failure_expected: bool, grace_s: float
) -> None:
    pool = WorldPool(settings(), max_alive=1)
    request = TestRequest.of(
        module_name="inner_pool_bodies",
        module_path=str(BODIES),
        qualname="test_last_rank_fails_the_others_wait",
        params={},
        tmp_path=str(tmp_path),
        timeout_s=60,
        failure_expected=failure_expected,
    )
    try:
        outcome = pool.run(WorldSpec("gloo", 2, "cpu"), request)
    finally:
        pool.close()
    report = outcome.failure_report()
    assert outcome.verdict == "failed", report
    assert "ValueError: injected failure on rank 1" in report
    assert f"rank 0 still running {grace_s:g} s after rank 1 failed" in report
