"""Running a timing body in a benchmark world and getting its timings back.

A body is a module-level function ``body(world, **params)`` that runs on every rank and
calls ``write_timings`` on rank 0; ``run_timed`` sends it to the world and returns what it
wrote, or skips or fails the calling benchmark with the world's report.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

TIMINGS_FILE = "timings.json"
BODY_TIMEOUT_S = 1800


def write_timings(world: Any, timings: object) -> None:
    """On rank 0: hand ``timings`` (anything JSON holds) back to ``run_timed``."""
    if world.rank == 0:
        (Path(world.tmp_path) / TIMINGS_FILE).write_text(json.dumps(timings))


def run_timed(world: Any, body: Callable[..., None], params: dict[str, Any], tmp_path: Path) -> Any:
    """Run ``body(world, **params)`` on every rank of ``world``; what rank 0 wrote."""
    from harness import TestRequest

    module_path = inspect.getfile(body)
    request = TestRequest.of(
        module_name=f"bench_bodies_{Path(module_path).stem}",
        module_path=module_path,
        qualname=body.__qualname__,
        params=params,
        tmp_path=str(tmp_path),
        timeout_s=BODY_TIMEOUT_S,
    )
    outcome = world.run(request)
    if outcome.verdict == "skipped":
        pytest.skip(outcome.reason)
    if outcome.verdict != "passed":
        pytest.fail(outcome.failure_report(), pytrace=False)
    return json.loads((tmp_path / TIMINGS_FILE).read_text())
