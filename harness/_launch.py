"""The interface both launch modes give the plugin's hooks (``_spawn_mode``, ``_torchrun_mode``)."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Protocol

import pytest

from harness._context import WorldContext
from harness._options import WorldOptions
from harness._spawn_mode import WorldTicket


class LaunchMode(Protocol):
    """How one pytest session runs its world tests."""

    options: WorldOptions  # backend and device type resolved, once a session

    def sizes(self) -> set[int] | None:
        """The world sizes this session runs (None: every size a test asks for)."""

    def fixture(self, request: pytest.FixtureRequest, size: int) -> WorldContext | WorldTicket:
        """The ``world`` fixture's value for a test at ``size``."""

    def run_body(self, item: pytest.Function) -> bool | None:
        """Run a world test's body elsewhere (True), or leave it to pytest here (None)."""

    def watch(self, item: pytest.Item) -> AbstractContextManager[None]:
        """Wraps the call of a test that runs here: what to do if it outlives its deadline."""

    def agree(
        self, item: pytest.Item, report: pytest.TestReport, call: pytest.CallInfo[None]
    ) -> pytest.TestReport:
        """A phase's report, as every rank agrees it."""

    def session_finishing(self) -> None:
        """The session is about to write its reports."""

    def close(self) -> None:
        """The session is over: close the worlds, or wait for the reporter."""
