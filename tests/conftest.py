"""The project's own tests: pytester drives inner sessions of the world plugin.

Bare ``pytest`` runs the tests that take well under a second each, for a contributor's quick
loop; those marked ``slow`` (each over a second on a 2-core machine: they start worlds,
inner pytest sessions or the gate's tools as subprocesses) run with ``--slow``, as
``tox -e unit`` and ``.ci/run`` do. ``pytest --slow --durations=0`` shows which to mark.
"""

import pytest

# pytester's in-process runs forget modules first imported during the run,
# and torch cannot be imported twice into one process: import it here once.
import torch  # noqa: F401

from tests._gate_suite import GateRun, gate_run

pytest_plugins = ["pytester"]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--slow",
        action="store_true",
        help="also run the tests marked slow (worlds, inner sessions, the gate's tools): "
        "tox -e unit and .ci/run do",
    )


def pytest_report_header(config: pytest.Config) -> str | None:
    if config.getoption("slow"):
        return None
    return "tests marked slow are left out: --slow runs them (tox -e unit does)"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("slow"):
        return
    slow = [item for item in items if item.get_closest_marker("slow") is not None]
    if slow:
        items[:] = [item for item in items if item.get_closest_marker("slow") is None]
        config.hook.pytest_deselected(items=slow)


@pytest.fixture
def pytester(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """Inner sessions load the world plugin, as the repository's own configuration does."""
    monkeypatch.setenv("PYTEST_ADDOPTS", "-p harness.plugin")
    return pytester


@pytest.fixture(scope="session")
def conformance_ids() -> list[str]:
    """Every test id the conformance suite collects, at every world size its tests ask for."""
    from tests._inner import collect_conformance

    return collect_conformance()


@pytest.fixture(scope="session")
def inner_gate_run(tmp_path_factory: pytest.TempPathFactory) -> GateRun:
    """One gate run of the inner gate suite: the gate's tests read it, the shards' tests
    compare their runs with it (a run costs some 20 s of worlds and reports)."""
    return gate_run(tmp_path_factory.mktemp("gate"))
