"""A test module whose import ends the process on ranks (it imports in the controller)."""

import os

import pytest

if os.environ.get("HARNESS_ROLE") == "rank":
    os._exit(3)


@pytest.mark.world(2)
def test_in_a_module_that_ends_ranks(world):
    pass
