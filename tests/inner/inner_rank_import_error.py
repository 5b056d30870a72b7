"""A test module that imports in the controller but not on ranks: its world test fails with
the rank's import error, as a module that cannot be imported anywhere would."""

import os

import pytest

if os.environ.get("HARNESS_ROLE") == "rank":
    raise RuntimeError("this module cannot be imported on a rank")


@pytest.mark.world(2)
def test_in_a_module_ranks_cannot_import(world):
    pass
