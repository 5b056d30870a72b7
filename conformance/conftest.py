"""Applies the known divergences of the torch release under test to the conformance suite:
upstream's (conformance/manifests/upstream.toml) and a fork's own (``--manifest``)."""

from __future__ import annotations

import pytest

from conformance.cells import PARALLELISMS
from conformance.divergences.session import lifted_markers, marker, resolution


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("conformance", "known divergences of the torch build under test")
    group.addoption(
        "--manifest",
        action="append",
        default=None,
        metavar="PATH",
        help="a fork's own known-divergence manifest(s) (TOML, see conformance/divergences), "
        "applied besides upstream's (conformance/manifests/upstream.toml), by release",
    )
    group.addoption(
        "--manifest-lift-skips",
        action="store_true",
        help="run only the tests of skip records, skip lifted, each in a world of its own "
        "under a short deadline: one that passes (XPASS) shows the divergence fixed",
    )


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    known = resolution(config).known
    lifting = config.getoption("manifest_lift_skips")
    lifted: list[pytest.Item] = []
    for item in items:
        _skip_where_the_oracle_does_not_model_the_cell(item)
        for holding in known:
            if not holding.matches(item.nodeid):
                continue
            if lifting and holding.skip is not None:
                for mark in lifted_markers(holding):
                    item.add_marker(mark)
                lifted.append(item)
            else:
                item.add_marker(marker(holding))
    if lifting:
        _keep_only(lifted, items, config)


def _keep_only(kept: list[pytest.Item], items: list[pytest.Item], config: pytest.Config) -> None:
    chosen = set(map(id, kept))
    dropped = [item for item in items if id(item) not in chosen]
    items[:] = [item for item in items if id(item) in chosen]
    if dropped:
        config.hook.pytest_deselected(items=dropped)


def _skip_where_the_oracle_does_not_model_the_cell(item: pytest.Item) -> None:
    """A test that compares with the oracle (its name says so) skips cells the oracle does
    not model, naming them; ground truth and the contract checks still judge those cells."""
    callspec = getattr(item, "callspec", None)
    if callspec is None or "oracle" not in item.name:
        return
    cells = [v for v in callspec.params.values() if isinstance(v, str) and v in PARALLELISMS]
    unmodelled = [cell for cell in cells if not PARALLELISMS[cell].oracle_models]
    if unmodelled:
        item.add_marker(
            pytest.mark.skip(reason=f"the oracle does not model {', '.join(unmodelled)} yet")
        )


def pytest_report_header(config: pytest.Config) -> str:
    return f"known divergences: {resolution(config).describe()}"


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    found = resolution(config)
    if found.inferred:
        terminalreporter.section("known divergences inferred for an unrecorded release")
        terminalreporter.line(found.describe())
        for known in found.inferred:
            terminalreporter.line(f"{known.source} ({known.releases})")
