"""Applies the torch version's manifest of known divergences to the conformance suite."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conformance._manifest import (
    APPLIED_MANIFESTS,
    UNUSED_ENTRIES,
    Entry,
    default_manifest,
    parse,
)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("world").addoption(
        "--manifest",
        action="append",
        default=None,
        metavar="PATH",
        help="known-divergence manifest(s) to apply "
        "(default: conformance/manifests/<torch version>.txt)",
    )


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    paths = [Path(p) for p in config.getoption("manifest") or []]
    if not paths and (found := default_manifest(torch.__version__)):
        paths = [found]
    config.stash[APPLIED_MANIFESTS] = paths
    entries = [entry for path in paths for entry in parse(path)]
    used: set[Entry] = set()
    for item in items:
        for entry in entries:
            if entry.matches(item.nodeid):
                item.add_marker(entry.marker())
                used.add(entry)
    config.stash[UNUSED_ENTRIES] = (
        [] if _selects_tests(config) else _unused(entries, used, items, config)
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


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    unused = config.stash.get(UNUSED_ENTRIES, [])
    if unused:
        terminalreporter.section("manifest entries that match no test")
        for entry in unused:
            terminalreporter.line(f"{entry.source}: {entry.pattern}")
