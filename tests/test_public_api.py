"""The public surface stays as documented: users import from the packages, not their internals."""

from __future__ import annotations

import harness
import reference_impl


def test_harness_public_names() -> None:
    assert sorted(harness.__all__) == [
        "TestRequest",
        "World",
        "WorldContext",
        "WorldOutcome",
        "WorldPool",
        "WorldSettings",
        "WorldSpec",
        "WorldStartError",
        "launched_by_torchrun",
    ]
    for name in harness.__all__:
        assert getattr(harness, name).__doc__, f"harness.{name} has no docstring"


def test_reference_impl_is_documented() -> None:
    assert reference_impl.__doc__
