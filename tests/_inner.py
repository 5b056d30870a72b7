"""Run an inner pytest session in a subprocess and read back what it reported."""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

INNER_DIR = Path(__file__).parent / "inner"


@dataclass(frozen=True)
class Case:
    """One test case as the junit XML recorded it."""

    outcome: str  # passed, failed, skipped, error
    message: str


@dataclass(frozen=True)
class InnerRun:
    returncode: int
    output: str
    cases: dict[str, Case]  # by test name, e.g. "test_hang[w2]"
    workdir: Path

    def outcome(self, name: str) -> str:
        assert name in self.cases, f"{name} missing from junit; have {sorted(self.cases)}"
        return self.cases[name].outcome

    def message(self, name: str) -> str:
        return self.cases[name].message


def read_junit(path: Path) -> dict[str, Case]:
    cases = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = "skipped" if child.tag == "skipped" else child.tag
                if child.tag == "failure":
                    outcome = "failed"
                message = (child.get("message") or "") + "\n" + (child.text or "")
        cases[case.get("name", "")] = Case(outcome, message)
    return cases


def run_inner(
    test_file: str,
    workdir: Path,
    *args: str,
    launcher: list[str] | None = None,
    timeout: float = 900,
    pythonpath: Path | None = None,
) -> InnerRun:
    """Run ``tests/inner/<test_file>`` with pytest (or under ``launcher``) in ``workdir``.

    ``pythonpath`` is prepended to the session's import path (e.g. to import ``conformance``).
    """
    workdir.mkdir(parents=True, exist_ok=True)
    target = workdir / test_file
    target.write_text((INNER_DIR / test_file).read_text())
    junit = workdir / "junit.xml"
    command = [
        *(launcher or [sys.executable]),
        "-m",
        "pytest",
        str(target),
        "-p",
        "no:cacheprovider",
        "-p",
        "harness.plugin",
    ]
    env = dict(os.environ, INNER_WORKDIR=str(workdir))
    env.pop("PYTEST_ADDOPTS", None)
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(pythonpath), env.get("PYTHONPATH")]))
    completed = subprocess.run(
        [*command, f"--junitxml={junit}", "-rA", *args],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    output = completed.stdout + completed.stderr
    assert junit.exists(), f"inner run wrote no junit XML:\n{output}"
    return InnerRun(completed.returncode, output, read_junit(junit), workdir)


def start_session(
    workdir: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """A pytest session over one trivial test in ``workdir``, with ``args``: for what the
    harness refuses at start-up, before any test runs."""
    (workdir / "test_nothing.py").write_text("def test_nothing():\n    pass\n")
    return subprocess.run(
        [sys.executable, "-m", "pytest", *args, "-p", "no:cacheprovider", "-p", "harness.plugin"],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def collect_conformance(*args: str) -> list[str]:
    """The test ids ``pytest conformance --collect-only`` lists with ``args`` (every world size
    its tests ask for unless ``args`` choose), no API hidden from the suite."""
    from ci.gate.target import SUITE_ROOT

    env = {**os.environ, "GATE_TEST_MISSING_APIS": ""}
    completed = subprocess.run(
        [sys.executable, "-m", "pytest", "conformance", "--collect-only", "-q", *args],
        cwd=SUITE_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        check=False,
    )
    assert completed.returncode == 0, completed.stdout[-4000:] + completed.stderr[-4000:]
    return [line for line in completed.stdout.splitlines() if "::" in line]
