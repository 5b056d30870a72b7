"""Per-test overhead of the world harness against upstream's ways of running SPMD tests.

The same trivial body (an all_reduce and an assert) runs as K tests through:
  plain        no world at all: an empty pytest test in a module that imports
               torch, the floor that pytest itself costs every kind;
  harness      this project's persistent worlds (one spawn per world size);
  spawn        a fresh spawn + init_process_group per test, as
               torch.testing._internal.common_distributed.MultiProcessTestCase does;
  continuous   torch's MultiProcContinuousTest (processes kept per class), where importable.
Each kind runs as one pytest session; a test's cost is the wall time of its
whole pytest protocol (setup, call, teardown, reporting), timed by a small
conftest. The first test of a session, which pays for the world's start, is
left out; the median of the rest is the per-test cost. Two bodies are timed:
an empty one (pure overhead) and an all_reduce (a trivial SPMD test).
Sessions alternate between kinds and repeat; the median over repeats is
reported, with each kind's cost above the plain test and the ratios of both.

    python -m ci.bench.harness_overhead [--sizes 2,4] [--repeats 3]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass
from pathlib import Path

BODIES = {
    "empty": "pass",
    "all_reduce": "t = torch.ones(1); dist.all_reduce(t); assert t.item() == WORLD_SIZE",
}

# The floor: pytest's per-item work with torch imported (its loggers cost pytest's
# log capture something on every test); no world, so the body is always empty.
PLAIN_TEST = """
import pytest, torch

@pytest.mark.parametrize("i", range({count}))
def test_trivial(i):
    pass
"""

HARNESS_TEST = """
import pytest, torch, torch.distributed as dist

@pytest.mark.world({size})
@pytest.mark.parametrize("i", range({count}))
def test_trivial(world, i):
    {body}
"""

SPAWN_TEST = """
import torch, torch.distributed as dist
from torch.testing._internal.common_distributed import MultiProcessTestCase

class TestTrivial(MultiProcessTestCase):
    @property
    def world_size(self):
        return {size}

    def setUp(self):
        super().setUp()
        self._spawn_processes()

{methods}
"""

SPAWN_METHOD = """
    def test_trivial_{i}(self):
        dist.init_process_group("gloo", init_method=f"file://{{self.file_name}}",
                                rank=self.rank, world_size=self.world_size)
        {body}
        dist.destroy_process_group()
"""

CONTINUOUS_TEST = """
import torch, torch.distributed as dist
from torch.testing._internal.common_distributed import MultiProcContinuousTest

class TestTrivial(MultiProcContinuousTest):
    world_size = {size}

    @classmethod
    def backend_str(cls):
        return "gloo"

    @classmethod
    def device_type(cls):
        return "cpu"

{methods}
"""

CONTINUOUS_METHOD = """
    def test_trivial_{i}(self):
        {body}
"""

# Times every test's whole pytest protocol (setup, call, teardown, reporting).
TIMING_CONFTEST = """
import json, os, time
import pytest

_durations = []

@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    start = time.perf_counter()
    try:
        return (yield)
    finally:
        _durations.append(time.perf_counter() - start)

def pytest_sessionfinish(session):
    with open(os.environ["BENCH_DURATIONS"], "w") as f:
        json.dump(_durations, f)
"""


@dataclass(frozen=True)
class Kind:
    """One way of running K trivial SPMD tests, and the K values to measure it at."""

    name: str
    template: str  # the module, with {size} and {methods} or {count} and {body}
    method: str | None  # one test method's template, for unittest-style kinds
    world_size: str  # how a body names the world size
    count: int

    def __post_init__(self) -> None:
        if self.count < 3:
            raise ValueError(f"{self.name}: needs at least 3 tests, the first is left out")

    def source(self, size: int, body: str) -> str:
        """The test module: ``count`` tests running ``body`` in worlds of ``size``."""
        body = body.replace("WORLD_SIZE", self.world_size)
        if self.method is None:
            return self.template.format(size=size, count=self.count, body=body)
        methods = "".join(self.method.format(i=i, body=body) for i in range(self.count))
        return self.template.format(size=size, methods=methods)


KINDS = [
    Kind("plain", PLAIN_TEST, None, "", 60),
    Kind("harness", HARNESS_TEST, None, "world.size", 60),
    Kind("spawn", SPAWN_TEST, SPAWN_METHOD, "self.world_size", 4),
    Kind("continuous", CONTINUOUS_TEST, CONTINUOUS_METHOD, "self.world_size", 60),
]


def continuous_available() -> bool:
    """MultiProcContinuousTest exists in this torch and its imports (expecttest) resolve."""
    if importlib.util.find_spec("expecttest") is None:
        return False
    from torch.testing._internal import common_distributed

    return hasattr(common_distributed, "MultiProcContinuousTest")


def test_durations(kind: Kind, size: int, body: str, workdir: Path) -> list[float]:
    """Per-test durations of one pytest session of ``kind``, in run order."""
    (workdir / "conftest.py").write_text(TIMING_CONFTEST)
    path = workdir / f"test_{kind.name}_{size}.py"
    path.write_text(textwrap.dedent(kind.source(size, body)))
    durations = workdir / "durations.json"
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-p",
        "harness.plugin",
    ]
    command.append(str(path))
    env = dict(os.environ, BENCH_DURATIONS=str(durations))
    done = subprocess.run(command, cwd=workdir, env=env, capture_output=True, text=True)
    if done.returncode != 0 or f"{kind.count} passed" not in done.stdout:
        raise RuntimeError(f"{kind.name} at size {size} failed:\n{done.stdout}\n{done.stderr}")
    values: list[float] = json.loads(durations.read_text())
    return values


def per_test_seconds(
    kinds: list[Kind], size: int, body: str, repeats: int, workdir: Path
) -> dict[str, float]:
    """Median per-test duration after the first test; kinds interleave within each repeat."""
    medians: dict[str, list[float]] = {k.name: [] for k in kinds}
    for _ in range(repeats):
        for kind in kinds:
            durations = test_durations(kind, size, body, workdir)
            medians[kind.name].append(statistics.median(durations[1:]))
    return {name: statistics.median(values) for name, values in medians.items()}


def report(size: int, body: str, costs: dict[str, float]) -> list[str]:
    """Each kind's cost per test and above the plain test; ratios of both to the harness."""
    floor = costs["plain"]
    lines = [f"world size {size}, body {body}:"]
    for name, seconds in costs.items():
        above = "" if name == "plain" else f"  ({(seconds - floor) * 1000:.1f} ms above plain)"
        lines.append(f"  {name:<11} {seconds * 1000:9.1f} ms per test{above}")
    harness = costs["harness"]
    for name in ("spawn", "continuous"):
        if name in costs:
            whole = f"{costs[name] / harness:7.1f}x per test"
            net = (
                f"{(costs[name] - floor) / (harness - floor):7.1f}x above plain"
                if harness > floor
                else "harness within the plain test's noise"
            )
            lines.append(f"  {name} / harness = {whole}, {net}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="2,4", help="world sizes (default 2,4)")
    parser.add_argument("--repeats", type=int, default=3, help="repetitions per kind (median)")
    args = parser.parse_args(argv)
    kinds = [k for k in KINDS if k.name != "continuous" or continuous_available()]
    if len(kinds) < len(KINDS):
        print("MultiProcContinuousTest not importable here (needs expecttest): not measured")
    with tempfile.TemporaryDirectory() as tmp:
        for size in (int(s) for s in args.sizes.split(",")):
            for body_name, body in BODIES.items():
                costs = per_test_seconds(kinds, size, body, args.repeats, Path(tmp))
                print("\n".join(report(size, body_name, costs)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
