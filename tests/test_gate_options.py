"""The gate's command line names each option it hands to pytest as pytest's plugins name it,
so that one parameter has one name from ``python -m ci.gate`` to the plugin that reads it."""

from __future__ import annotations

import re
import subprocess
import sys

from ci.gate import cli
from ci.gate.target import SUITE_ROOT

# The gate's own options: they choose what the gate runs and where it writes, not pytest.
GATE_ONLY = {"-h", "--help", "--out", "--tier", "--jobs", "--changed-against"}


def _pytest_options() -> set[str]:
    """The options of pytest with the suite's conftest and every plugin the gate loads."""
    command = [sys.executable, "-m", "pytest", "conformance", "--help", "-p", "harness.plugin"]
    command += ["-p", "ci.gate.recorder", "-p", "ci.gate.shard"]
    shown = subprocess.run(
        command, cwd=SUITE_ROOT, capture_output=True, text=True, timeout=120, check=True
    )
    return set(re.findall(r"(?m)^\s+(--[a-z][\w-]*)", shown.stdout))


def test_every_option_of_the_gate_is_its_plugins_option_of_the_same_name() -> None:
    gate = {name for action in cli._parser()._actions for name in action.option_strings}
    assert gate - GATE_ONLY, "the gate forwards no option: this test reads the wrong parser"
    assert sorted(gate - GATE_ONLY - _pytest_options()) == []


def test_the_gate_hands_each_option_on_under_its_own_name(tmp_path) -> None:
    given = {
        "--world-backend": "gloo",
        "--world-device": "cpu",
        "--world-sizes": "1,2",
        "--manifest": str(tmp_path / "fork.toml"),
        "--world-deadlines": str(tmp_path / "durations.json"),
        "--gate-shard": "1/2",
        "--gate-shard-durations": str(tmp_path / "means.json"),
    }
    flags = ["--world-require-devices", "--manifest-lift-skips"]
    argv = [part for name, value in given.items() for part in (name, value)] + flags
    command = cli.pytest_command(cli._parser().parse_args(argv), tmp_path)
    handed = dict(arg.partition("=")[::2] for arg in command if arg.startswith("--"))
    assert {name: handed.get(name) for name in given} == given
    assert set(flags) <= set(handed)
