"""The pytest plugin: the ``world`` marker and fixture, in spawn and torchrun mode.

Only pytest's hooks live here; each hands the work to the session's launch mode
(``_spawn_mode``: worlds this controller spawns; ``_torchrun_mode``: the world torchrun
launched), behind the interface of ``_launch``. Load it with ``-p harness.plugin``.
"""

from __future__ import annotations

import os
from collections.abc import Generator

import pytest

from harness import _env
from harness._context import WorldContext
from harness._items import (
    ALONE_MARKER,
    FAILING_RANKS,
    FIRST_FAILURE,
    MARKER,
    item_size,
)
from harness._launch import LaunchMode
from harness._options import WorldOptions, add_options
from harness._preload import PRELOAD, import_preloads
from harness._spawn_mode import SpawnMode, WorldTicket
from harness._torchrun import launched_by_torchrun
from harness._torchrun_mode import TorchrunMode

__all__ = [
    "ALONE_MARKER",
    "FAILING_RANKS",
    "FIRST_FAILURE",
    "MARKER",
    "NOT_APPLICABLE",
    "WorldOptions",
    "world_options",
]

# (node id, world size) of each id the marker's ``applies`` left out: cells that do not exist
# at that world size.
NOT_APPLICABLE = pytest.StashKey[list[tuple[str, int]]]()
_MODE = pytest.StashKey[LaunchMode]()


def world_options(config: pytest.Config) -> WorldOptions:
    """The session's world options, backend and device type resolved: what other plugins
    (the gate's recorder) read instead of resolving the raw options a second time."""
    return config.stash[_MODE].options


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
    mode_of = TorchrunMode if launched_by_torchrun() else SpawnMode
    config.stash[_MODE] = mode_of(options, config)


def _mode(config: pytest.Config) -> LaunchMode | None:
    return config.stash.get(_MODE, None)


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    mode = _mode(session.config)
    if mode is not None:
        mode.session_finishing()


def pytest_unconfigure(config: pytest.Config) -> None:
    mode = _mode(config)
    if mode is not None:
        mode.close()


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
    left_out = [item for item in items if item_size(item) is not None and not _applies(item)]
    config.stash[NOT_APPLICABLE] = [(item.nodeid, item_size(item) or 0) for item in left_out]
    if left_out:
        dropped = set(map(id, left_out))
        items[:] = [item for item in items if id(item) not in dropped]
        config.hook.pytest_deselected(items=left_out)


@pytest.hookimpl(trylast=True)  # after -k and -m: count only what they kept
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    mode = _mode(config)
    if mode is None:
        return
    wanted = mode.sizes()
    keep: list[pytest.Item] = []
    drop: list[pytest.Item] = []
    for item in items:
        size = item_size(item)
        (drop if size is not None and wanted is not None and size not in wanted else keep).append(
            item
        )
    if drop:
        config.hook.pytest_deselected(items=drop)
    _leave_out_what_does_not_apply(config, keep)
    # Plain tests first, then world tests grouped by size: one spawn per world.
    keep.sort(key=lambda item: item_size(item) or 0)
    items[:] = keep


def pytest_report_collectionfinish(config: pytest.Config) -> str | None:
    left_out = config.stash.get(NOT_APPLICABLE, [])
    if not left_out:
        return None
    return f"{len(left_out)} world test ids not applicable at their world size (not collected)"


# ----- the fixture ------------------------------------------------------------


@pytest.fixture
def world(request: pytest.FixtureRequest) -> WorldContext | WorldTicket:
    """The rank's ``WorldContext`` inside a test marked ``@pytest.mark.world(...)`` (in a
    spawning controller, the ticket of the world that runs the body)."""
    if not hasattr(request, "param"):
        pytest.fail("the `world` fixture needs @pytest.mark.world(sizes...) on the test")
    size: int = request.param
    return request.config.stash[_MODE].fixture(request, size)


# ----- running ----------------------------------------------------------------


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    mode = _mode(pyfuncitem.config)
    return None if mode is None else mode.run_body(pyfuncitem)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    mode = _mode(item.config)
    if mode is None:
        return (yield)
    with mode.watch(item):
        return (yield)


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    mode = _mode(item.config)
    return report if mode is None else mode.agree(item, report, call)
