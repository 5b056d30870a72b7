"""Where a rank's test module was imported, and what a rank reads of its start, written for
tests/test_rank_start.py; one module fails to import on ranks alone."""

import json
import os
from pathlib import Path

import pytest

IMPORTED_BY = os.getpid()  # the process that executed this module


def _record(world, name):
    record = {
        "pid": os.getpid(),
        "imported_by": IMPORTED_BY,
        "hash_seed": os.environ.get("PYTHONHASHSEED"),
        "omp_threads": os.environ.get("OMP_NUM_THREADS"),
        "session": os.getsid(0),
    }
    folder = Path(os.environ["INNER_WORKDIR"]) / "starts"
    folder.mkdir(exist_ok=True)
    (folder / f"{name}-r{world.rank}.json").write_text(json.dumps(record))


@pytest.mark.world(2)
def test_first_world(world):
    _record(world, "first")


@pytest.mark.world_alone
@pytest.mark.world(2)
def test_second_world(world):
    _record(world, "second")
