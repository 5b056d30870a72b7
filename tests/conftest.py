"""The project's own tests: pytester drives inner sessions of the world plugin."""

import pytest

# pytester's in-process runs forget modules first imported during the run,
# and torch cannot be imported twice into one process: import it here once.
import torch  # noqa: F401

pytest_plugins = ["pytester"]


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
