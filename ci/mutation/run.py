"""One pytest run of part of the suite against one mutant, and what it found.

A mutant's run stops at its first failing test (``-x``) and writes junit
XML; the first failing or erroring test case is the one that killed it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from pathlib import Path

from ci.gate.target import SUITE_ROOT

ACTIVATE = "ci.mutation.mutants.activate"
PRELOAD = "HARNESS_PRELOAD"  # the harness's documented variable: modules every rank imports
MUTANT_ENV = "GATE_MUTANT"


@dataclass(frozen=True)
class RunSettings:
    backend: str = "gloo"
    world_sizes: str = "2,4"
    world_timeout_s: int = 60
    run_timeout_s: int = 1200
    device: str = "auto"


@dataclass(frozen=True)
class RunResult:
    """``failures``: each failing test's node id and message, in the order they ran."""

    returncode: int | None  # None: the run was cut at its time limit
    failures: list[tuple[str, str]]
    seconds: float
    log: Path

    @property
    def failed(self) -> tuple[str, str] | None:
        return self.failures[0] if self.failures else None


def run_tests(
    tests: list[str],
    mutant: str | None,
    settings: RunSettings,
    scratch: Path,
    stop_at_first: bool = True,
) -> RunResult:
    """Run ``tests`` (node ids or paths) with ``mutant`` applied in every rank (None: none)."""
    scratch.mkdir(parents=True, exist_ok=True)
    junit, log = scratch / "junit.xml", scratch / "pytest.log"
    junit.unlink(missing_ok=True)
    command = [
        sys.executable, "-m", "pytest", *dict.fromkeys(tests), "-q",
        *(["-x"] if stop_at_first else []), "-p", "no:warnings", "-p", "no:cacheprovider",
        f"--world-backend={settings.backend}", f"--world-device={settings.device}",
        f"--world-sizes={settings.world_sizes}",
        f"--world-timeout={settings.world_timeout_s}", f"--junitxml={junit}",
    ]  # fmt: skip
    preloads = [name for name in os.environ.get(PRELOAD, "").split(",") if name]  # a vendor's
    env = {**os.environ, PRELOAD: ",".join([*preloads, ACTIVATE]), MUTANT_ENV: mutant or ""}
    start = time.monotonic()
    with log.open("w") as output:
        try:
            done = subprocess.run(
                command, cwd=SUITE_ROOT, env=env, stdout=output, stderr=subprocess.STDOUT,
                timeout=settings.run_timeout_s, check=False,
            )  # fmt: skip
            returncode: int | None = done.returncode
        except subprocess.TimeoutExpired:
            returncode = None
    return RunResult(returncode, failures(junit), time.monotonic() - start, log)


def failures(junit: Path) -> list[tuple[str, str]]:
    """Each test case of ``junit`` that failed or errored: its node id and message."""
    found: list[tuple[str, str]] = []
    if not junit.exists():
        return found
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        problem = case.find("failure")
        if problem is None:
            problem = case.find("error")
        if problem is not None:
            message = (problem.get("message") or problem.text or "").strip().splitlines()
            summary = message[0][:300] if message else ""
            if raised_in_a_mutant(problem.text or ""):
                summary = f"{MUTANT_CRASHED}: {summary}"
            found.append((node_id(case), summary))
    return found


MUTANT_CRASHED = "the mutant's own code raised"
# The last frame of a pytest traceback, where the exception was raised, in a mutant module:
# "ci/mutants/_trees.py:38: TypeError" (the frames above it read "path:line: in function").
_RAISED_IN_MUTANT = re.compile(r"^\S*ci/mutants/\w+\.py:\d+: \w+$", re.MULTILINE)


def raised_in_a_mutant(traceback_text: str) -> bool:
    """True when a failure was raised by a mutant's own code: a broken mutant, not a test
    that saw the bug (tests assert in their own code; torch raises in torch's)."""
    return bool(_RAISED_IN_MUTANT.search(traceback_text))


def node_id(case: ElementTree.Element) -> str:
    """A junit test case as the pytest node id a user reruns (``path.py::name[params]``)."""
    module, _, cls = (case.get("classname") or "").partition(".Test")
    path = module.replace(".", "/") + ".py"
    name = case.get("name") or ""
    return f"{path}::Test{cls}::{name}" if cls else f"{path}::{name}"
