"""Applies the torch version's manifest of known divergences to the conformance suite."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conformance._manifest import (
    APPLIED_MANIFESTS,
    RESOLUTION,
    SUITE_ROOT,
    UNUSED_ENTRIES,
    UPSTREAM_MANIFEST,
    Entry,
    Resolution,
    parse,
    resolve,
)
from conformance._parallelisms import PARALLELISMS


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("world").addoption(
        "--manifest",
        action="append",
        default=None,
        metavar="PATH",
        help="a fork's own known-divergence manifest(s), applied besides upstream's "
        "(conformance/manifests/upstream.txt, by the torch release under test)",
    )


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    entries = _resolution(config).entries
    used: set[Entry] = set()
    for item in items:
        _skip_where_the_oracle_does_not_model_the_cell(item)
        for entry in entries:
            if entry.matches(item.nodeid):
                item.add_marker(entry.marker())
                used.add(entry)
    config.stash[UNUSED_ENTRIES] = (
        [] if _selects_tests(config) else _unused(entries, used, items, config)
    )


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


def _selects_tests(config: pytest.Config) -> bool:
    """A run of chosen test ids (``path::name``, ``-k``, ``-m``) cannot judge the manifest."""
    chosen = any("::" in arg for arg in config.args)
    return chosen or bool(config.option.keyword) or bool(config.option.markexpr)


def _unused(
    entries: list[Entry], used: set[Entry], items: list[pytest.Item], config: pytest.Config
) -> list[Entry]:
    collected_paths = {item.nodeid.split("::", 1)[0] for item in items}
    return [
        entry
        for entry in entries
        if entry not in used and entry.is_judged_by(collected_paths, config.rootpath)
    ]


def _resolution(config: pytest.Config) -> Resolution:
    """Upstream's manifest and a fork's, resolved for the torch under test: once a session."""
    if RESOLUTION not in config.stash:
        forks = [Path(p) for p in config.getoption("manifest") or []]
        config.stash[APPLIED_MANIFESTS] = [UPSTREAM_MANIFEST, *forks]
        manifests = [parse(UPSTREAM_MANIFEST, root=SUITE_ROOT), *map(parse, forks)]
        config.stash[RESOLUTION] = resolve(manifests, torch.__version__)
    return config.stash[RESOLUTION]


def pytest_report_header(config: pytest.Config) -> str:
    return release_line(_resolution(config))


def release_line(resolution: Resolution) -> str:
    """One line on how the build's release resolved against the recorded releases."""
    if resolution.recorded:
        return f"known divergences: torch release {resolution.release} (recorded)"
    if resolution.predates_the_suite:
        return (
            f"known divergences: torch release {resolution.release} predates the oldest "
            f"recorded release ({resolution.oldest_recorded}), the oldest this suite serves: "
            "failures may be the suite's own"
        )
    return (
        f"known divergences: torch release {resolution.release} is not recorded (newest "
        f"recorded: {resolution.newest_recorded}); {len(resolution.inferred)} entries "
        "inferred from their release ranges"
    )


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    resolution = config.stash.get(RESOLUTION, None)
    if resolution is not None and not resolution.recorded:
        terminalreporter.section("known divergences inferred for an unrecorded release")
        terminalreporter.line(release_line(resolution))
        for entry in resolution.inferred:
            terminalreporter.line(f"{entry.source}: {entry.pattern} ({entry.releases})")
    unused = config.stash.get(UNUSED_ENTRIES, [])
    if unused:
        terminalreporter.section("manifest entries that match no test")
        for entry in unused:
            terminalreporter.line(f"{entry.source}: {entry.pattern}")
