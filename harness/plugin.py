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
from harness._collection import marked_sizes, select_and_order
from harness._context import WorldContext
from harness._items import ALONE_MARKER, MARKER
from harness._options import WorldOptions, add_options
from harness._preload import PRELOAD, import_preloads
from harness._spawn_mode import SpawnMode, WorldTicket
from harness._torchrun import launched_by_torchrun
from harness._torchrun_mode import TorchrunMode
from harness.session import MODE, NOT_APPLICABLE, launch_mode


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
    config.stash[MODE] = mode_of(options, config)


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    mode = launch_mode(session.config)
    if mode is not None:
        mode.session_finishing()


def pytest_unconfigure(config: pytest.Config) -> None:
    mode = launch_mode(config)
    if mode is not None:
        mode.close()


# ----- collection -------------------------------------------------------------


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    marker = metafunc.definition.get_closest_marker(MARKER)
    if marker is None:
        return
    if "world" not in metafunc.fixturenames:
        raise pytest.UsageError(
            f"{metafunc.definition.nodeid}: a test marked world must take the `world` argument"
        )
    sizes = marked_sizes(marker)
    metafunc.parametrize("world", sizes, indirect=True, ids=[f"w{s}" for s in sizes])


@pytest.hookimpl(trylast=True)  # after -k and -m: count only what they kept
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    mode = launch_mode(config)
    if mode is None:
        return
    select_and_order(config, items, mode.sizes())


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
    return request.config.stash[MODE].fixture(request, size)


# ----- running ----------------------------------------------------------------


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    mode = launch_mode(pyfuncitem.config)
    return None if mode is None else mode.run_body(pyfuncitem)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    mode = launch_mode(item.config)
    if mode is None:
        return (yield)
    with mode.watch(item):
        return (yield)


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    mode = launch_mode(item.config)
    return report if mode is None else mode.agree(item, report, call)
