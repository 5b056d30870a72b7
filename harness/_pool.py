"""The worlds alive in a session: reuse by spec, at most ``max_alive`` at once.

Tests are ordered by world spec, so a small ``max_alive`` (1 on a 2-core
machine) costs one start per spec. The least recently used world is closed
to make room; a world that a test left broken is killed and respawned
lazily by the next test that needs it.
"""

from __future__ import annotations

from collections import OrderedDict

from harness._forkserver import ForkServers
from harness._messages import TestRequest
from harness._outcome import WorldOutcome, describe_exit
from harness._spec import WorldSettings, WorldSpec
from harness._world import World


class WorldPool:
    """Hands out live worlds and runs tests in them."""

    def __init__(
        self, settings: WorldSettings, max_alive: int = 1, templates: ForkServers | None = None
    ) -> None:
        if max_alive < 1:
            raise ValueError(f"max_alive must be at least 1, got {max_alive}")
        self.settings = settings
        self.max_alive = max_alive
        self.templates = templates  # None: ranks start as fresh interpreters
        self._worlds: OrderedDict[WorldSpec, World] = OrderedDict()
        self.spawned = 0

    def run(self, spec: WorldSpec, request: TestRequest, alone: bool = False) -> WorldOutcome:
        """Run ``request`` in a world of ``spec``; recycle the world if the test broke it.
        ``alone``: in a world started for this test and closed after it."""
        if alone:
            self._close(spec)
        notes: list[str] = []
        world = self._acquire(spec, notes)
        outcome = world.run(request)
        outcome.notes += notes
        if not outcome.world_is_reusable:
            self._discard(spec)
        elif alone:
            self._close(spec)
        return outcome

    def _acquire(self, spec: WorldSpec, notes: list[str]) -> World:
        world = self._worlds.get(spec)
        if world is not None:
            exited = world.exited_ranks()
            if not exited:
                self._worlds.move_to_end(spec)
                return world
            notes.append(
                "the world was respawned: between tests "
                + ", ".join(f"rank {r} {describe_exit(s)}" for r, s in sorted(exited.items()))
            )
            self._discard(spec)
        while len(self._worlds) >= self.max_alive:
            _, oldest = self._worlds.popitem(last=False)
            oldest.close()
        world = World(spec, self.settings, self.templates)
        self.spawned += 1
        self._worlds[spec] = world
        return world

    def _close(self, spec: WorldSpec) -> None:
        world = self._worlds.pop(spec, None)
        if world is not None:
            world.close()

    def _discard(self, spec: WorldSpec) -> None:
        world = self._worlds.pop(spec, None)
        if world is not None:
            world.kill()

    def alive(self) -> list[WorldSpec]:
        """Specs of the worlds alive now, least recently used first."""
        return list(self._worlds)

    def close(self) -> None:
        """Close every world, then the templates (at the end of the session)."""
        while self._worlds:
            _, world = self._worlds.popitem(last=False)
            world.close()
        if self.templates is not None:
            self.templates.close()
