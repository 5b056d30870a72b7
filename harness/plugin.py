"""The pytest plugin: the ``world`` marker and fixture, in spawn and torchrun mode.

This module only wires pytest's hooks to the harness: worlds live in
``_pool``/``_world``, rank-side execution in ``_rank``, verdicts in
``_outcome`` and torchrun agreement in ``_torchrun``.
"""

from __future__ import annotations

import inspect
import os
import re
import sys
import warnings
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from harness import _env, outcomes
from harness import _messages as msg
from harness._options import RENAMED_OPTIONS, WorldOptions, add_options
from harness._outcome import WorldOutcome, describe_exception
from harness._pool import WorldPool
from harness._preload import PRELOAD, import_preloads
from harness._spec import WorldSpec
from harness._torchrun import HangWatchdog, TorchrunWorld, launched_by_torchrun
from harness._world import TestRequest, WorldSettings, WorldStartError

__all__ = [
    "ALONE_MARKER",
    "FAILING_RANKS",
    "FIRST_FAILURE",
    "MARKER",
    "NOT_APPLICABLE",
    "RENAMED_OPTIONS",
    "WorldOptions",
    "world_options",
]

MARKER = "world"
# Runs a world test in a world started for it and closed after it, under a deadline of at
# most ``timeout`` seconds: for tests that may hang or crash (a lifted skip of the manifest).
ALONE_MARKER = "world_alone"
# Names of the user properties (junit XML <property> elements) a failed world test carries.
FAILING_RANKS = "failing_ranks"  # e.g. "1,3"
FIRST_FAILURE = "first_failure"  # the lowest failing rank and its exception in a few lines
# (node id, world size) of each id the marker's ``applies`` left out: cells that do not exist
# at that world size.
NOT_APPLICABLE = pytest.StashKey[list[tuple[str, int]]]()
# Under torchrun, how long past a test's deadline ranks wait for each other's results.
HANG_REPORT_GRACE_S = 30.0


@dataclass
class _Session:
    """The plugin's state for one pytest session (controller or torchrun rank)."""

    options: WorldOptions
    pool: WorldPool | None = None  # spawn mode
    torchrun: TorchrunWorld | None = None  # torchrun mode
    worlds_tmp: Path | None = None  # spawn mode: parent of world tests' shared tmp_paths


@dataclass(frozen=True)
class WorldTicket:
    """The ``world`` fixture's value in the controller: the body runs elsewhere."""

    spec: WorldSpec
    tmp_path: Path


_SESSION = pytest.StashKey[_Session]()


def world_options(config: pytest.Config) -> WorldOptions:
    """The session's world options, backend and device type resolved: what other plugins
    (the gate's recorder) read instead of resolving the raw options a second time."""
    return config.stash[_SESSION].options


def _in_rank_process() -> bool:
    return os.environ.get(_env.ROLE) == _env.RANK_ROLE


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(*sizes, timeout=None, applies=None): run the test body on every rank of a "
        "world of each size; applies(size, **params) -> bool leaves out the combinations that "
        "do not exist at a size",
    )
    config.addinivalue_line(
        "markers",
        f"{ALONE_MARKER}(timeout=None): run this world test in a world started for it and "
        "closed after it, its deadline at most timeout seconds",
    )
    if _in_rank_process():
        return
    # Spawned ranks import them at start-up; here they may register the backend named.
    try:
        import_preloads()
    except ImportError as error:
        raise pytest.UsageError(f"{PRELOAD}: {error}") from None
    options = WorldOptions.from_config(config)
    session = _Session(options)
    if launched_by_torchrun():
        session.torchrun = TorchrunWorld(options.backend, options.device_type)
        if session.torchrun.is_reporter:
            session.torchrun.report_when_stopped()
        else:
            # Rank 0 alone prints and writes the junit XML.
            config.option.xmlpath = None
            config.pluginmanager.set_blocked("terminalreporter")
    else:
        settings = WorldSettings(
            sys_path=list(sys.path),
            rootdir=str(config.rootpath),
            inifile=str(config.inipath) if config.inipath else None,
            verbosity=config.get_verbosity(),
            pg_timeout_s=2 * options.timeout_s + 60,
            hash_seed=options.hash_seed,
        )
        session.pool = WorldPool(settings, max_alive=options.max_worlds)
    config.stash[_SESSION] = session


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    state = session.config.stash.get(_SESSION, None)
    if state and state.torchrun:
        state.torchrun.reports_begun = True  # a SIGTERM from now on must not cut them


def pytest_unconfigure(config: pytest.Config) -> None:
    state = config.stash.get(_SESSION, None)
    if state and state.pool:
        state.pool.close()
    if state and state.torchrun:
        # No rank may exit before rank 0 has written its reports: torchrun
        # stops every rank as soon as one of them exits with an error.
        state.torchrun.finish()


# ----- collection -------------------------------------------------------------


def _world_sizes(marker: pytest.Mark) -> tuple[int, ...]:
    sizes = tuple(marker.args)
    if not sizes or not all(isinstance(s, int) and s >= 1 for s in sizes):
        raise pytest.UsageError(f"@pytest.mark.world needs positive integer sizes, got {sizes}")
    return sizes


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    marker = metafunc.definition.get_closest_marker(MARKER)
    if marker is None:
        return
    if "world" not in metafunc.fixturenames:
        raise pytest.UsageError(
            f"{metafunc.definition.nodeid}: a test marked world must take the `world` argument"
        )
    sizes = _world_sizes(marker)
    metafunc.parametrize("world", sizes, indirect=True, ids=[f"w{s}" for s in sizes])


def _item_size(item: pytest.Item) -> int | None:
    callspec = getattr(item, "callspec", None)
    if callspec is None or item.get_closest_marker(MARKER) is None:
        return None
    size: int = callspec.params["world"]
    return size


def _applies(item: pytest.Item) -> bool:
    """Whether the world marker's ``applies`` (if any) keeps this size and these parameters."""
    marker = item.get_closest_marker(MARKER)
    applies = marker.kwargs.get("applies") if marker else None
    if applies is None:
        return True
    params = dict(item.callspec.params)  # type: ignore[attr-defined]
    return bool(applies(params.pop("world"), **params))


def _leave_out_what_does_not_apply(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Drop the ids whose cell does not exist at their world size: not collected, and
    counted apart (``NOT_APPLICABLE``), never reported as skips."""
    left_out = [item for item in items if _item_size(item) is not None and not _applies(item)]
    config.stash[NOT_APPLICABLE] = [(item.nodeid, _item_size(item) or 0) for item in left_out]
    if left_out:
        dropped = set(map(id, left_out))
        items[:] = [item for item in items if id(item) not in dropped]
        config.hook.pytest_deselected(items=left_out)


@pytest.hookimpl(trylast=True)  # after -k and -m: count only what they kept
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    state = config.stash.get(_SESSION, None)
    if state is None:
        return
    wanted: set[int] | None = set(state.options.sizes) if state.options.sizes else None
    if state.torchrun is not None:
        wanted = {state.torchrun.spec.size}
    keep: list[pytest.Item] = []
    drop: list[pytest.Item] = []
    for item in items:
        size = _item_size(item)
        (drop if size is not None and wanted is not None and size not in wanted else keep).append(
            item
        )
    if drop:
        config.hook.pytest_deselected(items=drop)
    _leave_out_what_does_not_apply(config, keep)
    # Plain tests first, then world tests grouped by size: one spawn per world.
    keep.sort(key=lambda item: _item_size(item) or 0)
    items[:] = keep


def pytest_report_collectionfinish(config: pytest.Config) -> str | None:
    left_out = config.stash.get(NOT_APPLICABLE, [])
    if not left_out:
        return None
    return f"{len(left_out)} world test ids not applicable at their world size (not collected)"


# ----- the fixture ------------------------------------------------------------


@pytest.fixture
def world(request: pytest.FixtureRequest) -> Any:
    """The rank's ``WorldContext`` inside a test marked ``@pytest.mark.world(...)``."""
    if not hasattr(request, "param"):
        pytest.fail("the `world` fixture needs @pytest.mark.world(sizes...) on the test")
    state = request.config.stash[_SESSION]
    size: int = request.param
    if state.torchrun is not None:
        return state.torchrun.context(_safe_name(request.node.nodeid))
    if state.worlds_tmp is None:  # looked up once: a fixture lookup per test costs
        state.worlds_tmp = request.getfixturevalue("tmp_path_factory").getbasetemp() / "worlds"
    spec = WorldSpec(state.options.backend, size, state.options.device_type)
    return WorldTicket(spec=spec, tmp_path=state.worlds_tmp / _safe_name(request.node.nodeid))


def _safe_name(nodeid: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", nodeid)[-120:]


# ----- running ----------------------------------------------------------------


def _deadline(item: pytest.Item, options: WorldOptions) -> float:
    """The marker's ``timeout``, else a deadline fitted to the test's recorded duration, else
    ``--world-timeout``; at most the ``world_alone`` marker's timeout."""
    marker = item.get_closest_marker(MARKER)
    timeout = marker.kwargs.get("timeout") if marker else None
    deadline = float(timeout) if timeout is not None else options.deadline_s(item.nodeid)
    alone = item.get_closest_marker(ALONE_MARKER)
    cap = alone.kwargs.get("timeout") if alone else None
    return deadline if cap is None else min(deadline, float(cap))


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
    return TestRequest(
        module_name=item.module.__name__,
        module_path=str(item.module.__file__),
        qualname=qualname,
        params=_body_params(item),
        tmp_path=str(ticket.tmp_path),
        timeout_s=timeout_s,
    )


class WorldRespawnedWarning(pytest.PytestWarning):
    """A world died between tests (a rank exited after its last result) and was replaced."""


def _report(item: pytest.Item, outcome: WorldOutcome) -> None:
    """Turn the world's outcome into this item's pytest outcome."""
    for note in outcome.notes:
        warnings.warn(WorldRespawnedWarning(note), stacklevel=1)
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
        item.user_properties.extend(_failure_properties(outcome))
        pytest.fail(outcome.failure_report(), pytrace=False)


def _failure_properties(outcome: WorldOutcome) -> list[tuple[str, str]]:
    ranks = ",".join(map(str, outcome.failing_ranks))
    return [(FAILING_RANKS, ranks), (FIRST_FAILURE, outcome.first_failure)]


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    state = pyfuncitem.config.stash.get(_SESSION, None)
    ticket = pyfuncitem.funcargs.get("world")
    if state is None or state.pool is None or not isinstance(ticket, WorldTicket):
        return None
    reason = ticket.spec.unavailable_reason()
    if reason is not None:
        if state.options.require_devices:
            pytest.fail(f"{reason} (--world-require-devices)", pytrace=False)
        pytest.skip(reason)
    request = _request(pyfuncitem, ticket, _deadline(pyfuncitem, state.options))
    try:
        alone = pyfuncitem.get_closest_marker(ALONE_MARKER) is not None
        outcome = state.pool.run(ticket.spec, request, alone=alone)
    except WorldStartError as exc:
        pytest.fail(str(exc), pytrace=False)
    _report(pyfuncitem, outcome)
    return True


# ----- torchrun mode ----------------------------------------------------------


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    state = item.config.stash.get(_SESSION, None)
    if state is None or state.torchrun is None or _item_size(item) is None:
        return (yield)
    torchrun = state.torchrun

    def on_hang(stacks: str) -> None:
        timeout = _deadline(item, state.options)
        result = msg.RankResult(
            rank=torchrun.rank,
            status=outcomes.HUNG,
            longrepr=f"did not finish within the {timeout:g} s deadline; stacks:\n{stacks}",
        )
        if not torchrun.is_reporter:
            torchrun.publish(result)
            torchrun.finish()  # exiting sooner would let torchrun stop rank 0 mid-report
            return
        outcome = torchrun.agree(result, timeout_s=HANG_REPORT_GRACE_S)
        report = pytest.TestReport(
            nodeid=item.nodeid,
            location=item.location,
            keywords=dict.fromkeys(item.keywords, 1),
            outcome="failed",
            longrepr=outcome.failure_report(),
            when="call",
        )
        item.ihook.pytest_runtest_logreport(report=report)
        item.session.shouldfail = "a world test hung under torchrun"
        item.config.hook.pytest_sessionfinish(session=item.session, exitstatus=1)
        torchrun.finish()  # the other ranks may exit now

    with HangWatchdog(_deadline(item, state.options), on_hang):
        return (yield)


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    state = item.config.stash.get(_SESSION, None)
    if state is None or state.torchrun is None or call.when != "call" or _item_size(item) is None:
        return report
    local = _local_result(state.torchrun.rank, report, call)
    # Wait past the deadline, so that a hung rank's watchdog can publish its stacks.
    wait_s = _deadline(item, state.options) + HANG_REPORT_GRACE_S
    outcome = state.torchrun.agree(local, timeout_s=wait_s)
    lost = outcome.ranks_lost
    if lost:
        # The launched world cannot be replaced: stop here, on every rank, and report.
        item.session.shouldstop = (
            f"rank(s) {', '.join(map(str, lost))} crashed or hung under torchrun"
        )
    verdict = outcome.verdict
    if verdict == outcomes.FAILED:
        report.outcome, report.longrepr = "failed", outcome.failure_report()
        report.user_properties.extend(_failure_properties(outcome))
    elif verdict == outcomes.SKIPPED and report.outcome != "skipped":
        report.outcome, report.longrepr = "skipped", (str(item.path), 0, outcome.reason)
    return report


def _local_result(
    rank: int, report: pytest.TestReport, call: pytest.CallInfo[None]
) -> msg.RankResult:
    if hasattr(report, "wasxfail"):
        return msg.RankResult(rank=rank, status=outcomes.XFAILED, longrepr=report.wasxfail)
    if report.skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        return msg.RankResult(rank=rank, status=outcomes.SKIPPED, longrepr=reason)
    if report.passed:
        return msg.RankResult(rank=rank, status=outcomes.PASSED)
    text = str(report.longrepr or "")
    for name, content in report.sections:
        text += f"\n{'-' * 10} {name} {'-' * 10}\n{content}"
    summary = describe_exception(call.excinfo.value) if call.excinfo else ""
    return msg.RankResult(rank=rank, status=outcomes.FAILED, longrepr=text, headline=summary)
