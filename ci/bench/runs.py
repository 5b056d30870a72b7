"""Runs of the state-dict benchmarks: a pytest process under one build, its timings back; or
two builds' runs in lockstep.

A run is the unit of independent measurement: rounds inside one process share its luck
(memory layout, the moments of the machine it met), so comparisons and noise measurements
are made of many runs, and a comparison's runs come in pairs that share their moments.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from ci.bench.lockstep import run_in_lockstep
from ci.gate.target import SUITE_ROOT

# The builds' own operations; the oracle's speed says nothing about a build.
STATE_DICT_OPS = "ci/bench/benchmarks/test_state_dict_ops.py"
Timings = dict[str, list[float]]  # each benchmark's rounds, in seconds
Peaks = dict[str, int]  # each benchmark's peak memory on its largest rank, in bytes


@dataclass(frozen=True)
class Build:
    """One side of a comparison: an interpreter, the environment variables it runs with, and
    a command it runs under (e.g. ``setarch -R``)."""

    label: str
    python: str
    env: dict[str, str] = field(default_factory=dict)
    wrapper: tuple[str, ...] = ()


def env_pairs(pairs: list[str]) -> dict[str, str]:
    """``KEY=VALUE`` arguments as a mapping; SystemExit naming a malformed one."""
    found = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"expected KEY=VALUE, got {pair!r}")
        found[key] = value
    return found


def _raw_path(out: Path, name: str) -> Path:
    raw = out / "raw" / f"{name}.json"
    raw.parent.mkdir(parents=True, exist_ok=True)
    return raw


def _command(build: Build, raw: Path, pytest_args: list[str]) -> list[str]:
    command = [*build.wrapper, build.python, "-m", "pytest", STATE_DICT_OPS, "-q"]
    command += ["-p", "no:cacheprovider", f"--benchmark-json={raw}", "--benchmark-save-data"]
    return [*command, *pytest_args]


def _checked(
    build: Build, name: str, raw: Path, completed: subprocess.CompletedProcess[str]
) -> Path:
    if completed.returncode != 0 or not raw.exists():
        output = (completed.stdout + completed.stderr)[-4000:]
        raise SystemExit(f"{build.label} run {name} failed ({completed.returncode}):\n{output}")
    return raw


def run_benchmarks(build: Build, name: str, out: Path, pytest_args: list[str]) -> Path:
    """One pytest-benchmark run of the state-dict operations under ``build``, its JSON
    written to ``out/raw/<name>.json``; SystemExit with the run's output when it fails."""
    raw = _raw_path(out, name)
    completed = subprocess.run(
        _command(build, raw, pytest_args),
        cwd=SUITE_ROOT,
        env={**os.environ, **build.env},
        capture_output=True,
        text=True,
        check=False,
    )
    return _checked(build, name, raw, completed)


def run_pair(
    builds: tuple[Build, Build], names: tuple[str, str], out: Path, pytest_args: list[str]
) -> tuple[Path, Path]:
    """Runs of both builds in lockstep (``ci.bench.lockstep``), the first build taking the
    first turn; their JSONs, as ``run_benchmarks`` writes them."""
    raws = (_raw_path(out, names[0]), _raw_path(out, names[1]))
    completed = run_in_lockstep(
        (_command(builds[0], raws[0], pytest_args), _command(builds[1], raws[1], pytest_args)),
        ({**os.environ, **builds[0].env}, {**os.environ, **builds[1].env}),
        out / "lockstep",
        SUITE_ROOT,
    )
    return (
        _checked(builds[0], names[0], raws[0], completed[0]),
        _checked(builds[1], names[1], raws[1], completed[1]),
    )


def read_timings(path: Path) -> tuple[Timings, str]:
    """Each benchmark's rounds from a run's JSON, and the torch version(s) it ran."""
    data = json.loads(path.read_text())
    timings = {b["param"]: list(b["stats"]["data"]) for b in data["benchmarks"]}
    versions = {b["extra_info"]["torch"] for b in data["benchmarks"]}
    return timings, ", ".join(sorted(versions))


def read_peaks(path: Path) -> Peaks:
    """Each benchmark's peak memory from a run's JSON: the host's as ``NAME host``, and the
    device's as ``NAME device`` where the world ran on an accelerator. A benchmark without a
    host figure (no probe on this machine) has none."""
    data = json.loads(path.read_text())
    peaks = {}
    for benchmark in data["benchmarks"]:
        info = benchmark["extra_info"]
        for where in ("host", "device"):
            if info.get(f"peak_{where}_bytes") is not None:
                peaks[f"{benchmark['param']} {where}"] = int(info[f"peak_{where}_bytes"])
    return peaks
