"""Applies the torch version's manifest of known divergences to the conformance suite."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conformance._manifest import Entry, default_manifest, parse

_UNUSED = pytest.StashKey[list[Entry]]()


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
    entries = [entry for path in paths for entry in parse(path)]
    used: set[Entry] = set()
    for item in items:
        for entry in entries:
            if entry.matches(item.nodeid):
                item.add_marker(
                    pytest.mark.xfail(reason=f"{entry.reason} ({entry.link})", strict=True)
                )
                used.add(entry)
    config.stash[_UNUSED] = [e for e in entries if e not in used]


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    unused = config.stash.get(_UNUSED, [])
    if unused:
        terminalreporter.section("manifest entries that match no test")
        for entry in unused:
            terminalreporter.line(f"{entry.source}: {entry.pattern}")
