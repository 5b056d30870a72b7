"""Worlds of rank processes for SPMD tests, and the pytest plugin that drives them.

Test authors use the ``@pytest.mark.world(*sizes)`` marker and the ``world``
fixture (a :class:`WorldContext` on every rank). The classes below let other
tools (benchmarks, the gate) run bodies in worlds without pytest's collection, their ranks
spawned or forked from templates (:class:`ForkServers`).
``harness.devices`` names the device types and backends the torch build has,
``harness.outcomes`` the words for how a test ended, and ``harness.memory`` measures an
operation's peak memory on a rank.
"""

from __future__ import annotations

from harness._context import WorldContext
from harness._forkserver import ForkServers
from harness._messages import TestRequest
from harness._outcome import WorldOutcome
from harness._pool import WorldPool
from harness._preload import import_preloads
from harness._spec import WorldSettings, WorldSpec
from harness._torchrun import launched_by_torchrun
from harness._world import World, WorldStartError

__all__ = [
    "ForkServers",
    "TestRequest",
    "World",
    "WorldContext",
    "WorldOutcome",
    "WorldPool",
    "WorldSettings",
    "WorldSpec",
    "WorldStartError",
    "import_preloads",
    "launched_by_torchrun",
]
