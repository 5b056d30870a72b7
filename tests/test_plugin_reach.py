"""The world plugin stays out of other suites: it loads only where asked for, and every option
it adds starts with ``--world-``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ci.gate.target import SUITE_ROOT

# An ML repository's own conftest, with options named as ML suites name them.
OTHER_CONFTEST = """
def pytest_addoption(parser):
    parser.addoption("--device", default="cpu")
    parser.addoption("--backend", default="eager")
"""
OTHER_TEST = """
def test_sees_its_own_options(pytestconfig):
    assert pytestconfig.getoption("device") == "cuda:7"
    assert pytestconfig.getoption("backend") == "inductor"
"""


def _install(into: Path, work: Path) -> None:
    """Install this project's distribution into ``into`` (``pip install --target``), built
    from a copy so that the checkout gets no build folders."""
    source = work / "source"
    for name in ("pyproject.toml", "README.md"):
        source.mkdir(parents=True, exist_ok=True)
        shutil.copy(SUITE_ROOT / name, source / name)
    for package in ("harness", "reference_impl"):
        shutil.copytree(SUITE_ROOT / package, source / package)
    command = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps"]
    command += ["--no-build-isolation", "--target", str(into), str(source)]
    subprocess.run(command, check=True, capture_output=True, timeout=300)


def _other_suite(work: Path, *args: str, site: Path) -> subprocess.CompletedProcess[str]:
    suite = work / "other"
    suite.mkdir(exist_ok=True)
    (suite / "conftest.py").write_text(OTHER_CONFTEST)
    (suite / "test_other.py").write_text(OTHER_TEST)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "PYTHONPATH")}
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args]
    return subprocess.run(
        [*command, "--device=cuda:7", "--backend=inductor"],
        cwd=suite,
        env={**env, "PYTHONPATH": str(site)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.mark.slow
def test_an_installed_package_leaves_another_suites_options_alone(tmp_path: Path) -> None:
    site = tmp_path / "site"
    _install(site, tmp_path)
    assert (site / "harness" / "plugin.py").exists()
    alone = _other_suite(tmp_path, site=site)
    assert alone.returncode == 0, alone.stdout + alone.stderr
    assert "1 passed" in alone.stdout
    # Asked for, the plugin joins that suite without taking its option names.
    joined = _other_suite(tmp_path, "-p", "harness.plugin", "--world-sizes=2", site=site)
    assert joined.returncode == 0, joined.stdout + joined.stderr
    assert "1 passed" in joined.stdout


def test_every_option_of_the_plugin_starts_with_world(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--help")
    group = result.stdout.str().split("SPMD worlds of rank processes:\n", 1)[1].split("\n\n")[0]
    options = [line.split()[0] for line in group.splitlines() if line.startswith("  --")]
    assert len(options) == 12
    assert all(option.startswith("--world-") for option in options), options
