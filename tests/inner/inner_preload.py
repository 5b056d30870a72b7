"""Run with HARNESS_PRELOAD=preload_marker (a module the outer test writes)."""

import sys

import pytest


@pytest.mark.world(2)
def test_the_preloaded_module_was_imported_before_joining(world):
    marker = sys.modules.get("preload_marker")
    assert marker is not None
    assert marker.JOINED_AT_IMPORT is False
