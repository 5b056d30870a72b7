"""Spawn mode: the controller starts worlds of rank processes, keeps them across tests, and
runs each world test's body in them; the test's outcome is the world's agreed verdict."""

from __future__ import annotations

import contextlib
import inspect
import re
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from harness import outcomes
from harness._forkserver import ForkServers
from harness._items import (
    ALONE_MARKER,
    Deadline,
    deadline,
    failure_is_expected,
    failure_properties,
    item_size,
)
from harness._messages import TestRequest
from harness._options import WorldOptions
from harness._outcome import WorldOutcome
from harness._pool import WorldPool
from harness._spec import WorldSettings, WorldSpec
from harness._world import WorldStartError


@dataclass(frozen=True)
class WorldTicket:
    """The ``world`` fixture's value in the controller: the body runs in the world."""

    spec: WorldSpec
    tmp_path: Path


class WorldRespawnedWarning(pytest.PytestWarning):
    """A world died between tests (a rank exited after its last result) and was replaced."""


class RunAgainWarning(pytest.PytestWarning):
    """A test missed the deadline fitted to its recorded duration and ran again under
    ``--world-timeout``: this machine is slower, or busier, than the one that recorded it."""


class SpawnMode:
    """World tests run in worlds this controller spawns and reuses."""

    def __init__(self, options: WorldOptions, config: pytest.Config) -> None:
        self.options = options
        settings = WorldSettings(
            sys_path=list(sys.path),
            rootdir=str(config.rootpath),
            inifile=str(config.inipath) if config.inipath else None,
            verbosity=config.get_verbosity(),
            pg_timeout_s=2 * options.timeout_s + 60,
            hash_seed=options.hash_seed,
        )
        self.settings = settings
        self._pool: WorldPool | None = None  # made at the first world test, which knows them all
        self._worlds_tmp: Path | None = None  # parent of world tests' shared tmp_paths

    def sizes(self) -> set[int] | None:
        return set(self.options.sizes) if self.options.sizes else None

    def fixture(self, request: pytest.FixtureRequest, size: int) -> WorldTicket:
        if self._worlds_tmp is None:  # looked up once: a fixture lookup per test costs
            basetemp = request.getfixturevalue("tmp_path_factory").getbasetemp()
            self._worlds_tmp = basetemp / "worlds"
        options = self.options
        spec = WorldSpec(options.backend, size, options.device_type, options.ranks_per_device)
        return WorldTicket(spec=spec, tmp_path=self._worlds_tmp / safe_name(request.node.nodeid))

    def run_body(self, item: pytest.Function) -> bool | None:
        ticket = item.funcargs.get("world")
        if not isinstance(ticket, WorldTicket):
            return None
        reason = ticket.spec.unavailable_reason()
        if reason is not None:
            if self.options.require_devices:
                pytest.fail(f"{reason} (--world-require-devices)", pytrace=False)
            pytest.skip(reason)
        limit = deadline(item, self.options)
        request = _request(item, ticket, limit.seconds)
        alone = item.get_closest_marker(ALONE_MARKER) is not None
        try:
            outcome = self._pool_of(item).run(ticket.spec, request, alone=alone)
            if outcome.cut_at_deadline and limit.fitted and not request.failure_expected:
                outcome = self._run_again_unfitted(item, ticket, request, limit, outcome)
        except WorldStartError as exc:
            pytest.fail(str(exc), pytrace=False)
        _report(item, outcome)
        return True

    def _run_again_unfitted(
        self,
        item: pytest.Function,
        ticket: WorldTicket,
        cut: TestRequest,
        limit: Deadline,
        first: WorldOutcome,
    ) -> WorldOutcome:
        """Run a test cut at a deadline fitted to a recorded duration (and whose failure
        pytest would not report as expected) again, in a world of its own, under the deadline
        it has without recorded durations: its verdict is the test's, so a machine slower than
        the one that recorded them costs time, never a verdict. The first run's cut is noted."""
        unfitted = replace(cut, timeout_s=limit.unfitted_s)
        outcome = self._pool_of(item).run(ticket.spec, unfitted, alone=True)
        lost = first.ranks_lost
        outcome.rerun_because = (
            f"cut at its deadline of {limit.seconds:.0f} s, fitted to its recorded duration "
            f"({'rank' if len(lost) == 1 else 'ranks'} {', '.join(map(str, lost))} still "
            f"running), then run again alone under {limit.unfitted_s:.0f} s"
        )
        return outcome

    @contextlib.contextmanager
    def watch(self, item: pytest.Item) -> Iterator[None]:
        yield  # the world's deadline watches the body

    def agree(
        self, item: pytest.Item, report: pytest.TestReport, call: pytest.CallInfo[None]
    ) -> pytest.TestReport:
        return report  # the report already holds every rank's verdict

    def session_finishing(self) -> None:
        pass

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()

    def _pool_of(self, item: pytest.Function) -> WorldPool:
        """The session's worlds; under ``fork``, their ranks' templates import the modules of
        every world test the session runs."""
        if self._pool is None:
            templates = None
            if self.options.rank_start == "fork":
                assert self._worlds_tmp is not None
                templates = ForkServers(
                    self._worlds_tmp.parent / "templates",
                    self.settings,
                    modules=_world_test_modules(item.session.items),
                )
            self._pool = WorldPool(self.settings, self.options.max_worlds, templates)
        return self._pool


def _world_test_modules(items: list[pytest.Item]) -> tuple[tuple[str, str], ...]:
    """(name, path) of each module that holds a world test, in the session's order."""
    found: dict[str, str] = {}
    for item in items:
        if isinstance(item, pytest.Function) and item_size(item) is not None:
            found.setdefault(item.module.__name__, str(item.module.__file__))
    return tuple(found.items())


def safe_name(nodeid: str) -> str:
    """A directory name for a test id."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", nodeid)[-120:]


def _body_params(item: pytest.Function) -> dict[str, Any]:
    """The parametrize arguments the body takes; other fixtures cannot cross to ranks."""
    params = item.callspec.params
    names = [n for n in inspect.signature(item.obj).parameters if n not in ("self", "world")]
    foreign = [n for n in names if n not in params]
    if foreign:
        pytest.fail(
            f"world test bodies run on the ranks and receive only `world` and parametrize "
            f"arguments; {item.name} also asks for fixture(s): {', '.join(foreign)}",
            pytrace=False,
        )
    return {n: params[n] for n in names}


def _request(item: pytest.Function, ticket: WorldTicket, timeout_s: float) -> TestRequest:
    qualname = (
        item.originalname if item.cls is None else f"{item.cls.__qualname__}.{item.originalname}"
    )
    return TestRequest.of(
        nodeid=item.nodeid,
        module_name=item.module.__name__,
        module_path=str(item.module.__file__),
        qualname=qualname,
        params=_body_params(item),
        tmp_path=str(ticket.tmp_path),
        timeout_s=timeout_s,
        failure_expected=failure_is_expected(item),
    )


def _report(item: pytest.Item, outcome: WorldOutcome) -> None:
    """Turn the world's outcome into this item's pytest outcome."""
    for note in outcome.notes:
        warnings.warn(WorldRespawnedWarning(note), stacklevel=1)
    if outcome.rerun_because:
        warnings.warn(RunAgainWarning(outcome.rerun_because), stacklevel=1)
    for rank, streams in sorted(outcome.captures.items()):
        for stream, text in streams.items():
            if text:
                item.add_report_section("call", f"{stream} (rank {rank})", text)
    verdict = outcome.verdict
    if verdict == outcomes.SKIPPED:
        # Reported at the test's location, as a skip raised in the body would be.
        raise pytest.skip.Exception(outcome.reason, _use_item_location=True)
    if verdict == outcomes.XFAILED:
        pytest.xfail(outcome.reason)
    if verdict != outcomes.PASSED:
        item.user_properties.extend(failure_properties(outcome))
        pytest.fail(outcome.failure_report(), pytrace=False)
