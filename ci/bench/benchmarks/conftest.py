"""The benchmarks' world and options: one persistent world times every case."""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ci.bench.cases import (
    DEFAULT_PARALLELISMS,
    DEFAULT_SIZES_MIB,
    cases,
    known_parallelisms,
)
from ci.bench.oracle_cases import DEFAULT_SIZES_MIB as ORACLE_SIZES_MIB
from ci.bench.oracle_cases import OracleCase, summary_line
from ci.bench.oracle_cases import cases as oracle_cases


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("state-dict benchmarks")
    group.addoption("--bench-world-size", type=int, default=2, help="ranks (default 2)")
    group.addoption(
        "--bench-rounds", type=int, default=8, help="timed rounds per case, at least (default 8)"
    )
    group.addoption(
        "--bench-seconds",
        type=float,
        default=0.2,
        help="a case's rounds go on until they add up to this, up to 64, in a comparison until "
        "both runs' do (default 0.2; 0: exactly --bench-rounds)",
    )
    group.addoption(
        "--bench-parallelisms",
        default=",".join(DEFAULT_PARALLELISMS),
        help="cells of the model operations, comma-separated, or 'all' that run at the "
        "world size (default %(default)s)",
    )
    group.addoption(
        "--bench-sizes-mib",
        default=",".join(map(str, DEFAULT_SIZES_MIB)),
        help="state sizes, comma-separated (default %(default)s)",
    )
    group.addoption(
        "--oracle-sizes-mib",
        default=",".join(map(str, ORACLE_SIZES_MIB)),
        help="state sizes of the oracle-speed cases, comma-separated (default %(default)s)",
    )


_CELLS = pytest.StashKey[tuple[str, ...]]()
_ORACLE_TIMINGS = pytest.StashKey[dict[OracleCase, dict[str, list[float]]]]()


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_CELLS] = _parallelisms(config)  # a bad name is a usage error, up front
    config.stash[_ORACLE_TIMINGS] = {}
    json_path = config.getoption("benchmark_json", None)
    if json_path is not None:  # pytest-benchmark writes it without making its folder
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "case" in metafunc.fixturenames:
        config = metafunc.config
        sizes = _sizes(config.getoption("bench_sizes_mib"))
        found = cases(sizes, config.stash[_CELLS])
        metafunc.parametrize("case", found, ids=[case.name for case in found])
    if "oracle_case" in metafunc.fixturenames:
        sizes = _sizes(metafunc.config.getoption("oracle_sizes_mib"))
        pairs = [(case, impl) for case in oracle_cases(sizes) for impl in case.implementations]
        metafunc.parametrize(
            ("oracle_case", "implementation"),
            pairs,
            ids=[f"{case.name}-{impl}" for case, impl in pairs],
        )


def _sizes(option: str) -> tuple[int, ...]:
    return tuple(int(size) for size in option.split(","))


def _parallelisms(config: pytest.Config) -> tuple[str, ...]:
    known = known_parallelisms(config.getoption("bench_world_size"))
    wanted = config.getoption("bench_parallelisms")
    if wanted == "all":
        return known
    names = tuple(wanted.split(","))
    unknown = [name for name in names if name not in known]
    if unknown:
        raise pytest.UsageError(
            f"--bench-parallelisms: {unknown} do not run at this world size; known: {known}"
        )
    return names


@pytest.fixture(scope="session")
def bench_world(request: pytest.FixtureRequest) -> Iterator[Any]:
    from harness import World, WorldSettings, WorldSpec

    config = request.config
    settings = WorldSettings(
        sys_path=list(sys.path), rootdir=str(config.rootpath), inifile=None, pg_timeout_s=600
    )
    spec = WorldSpec.resolve(
        config.getoption("world_backend"),
        config.getoption("bench_world_size"),
        config.getoption("world_device"),
    )
    reason = spec.unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    world = World(spec, settings)
    try:
        yield world
    finally:
        world.close()


@pytest.fixture(scope="session")
def bench_workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="state-dict-bench-") as path:
        yield Path(path)


@pytest.fixture(scope="session")
def oracle_timings(request: pytest.FixtureRequest) -> dict[OracleCase, dict[str, list[float]]]:
    """Each oracle-speed case's timings per implementation, measured once for all of them."""
    return request.config.stash[_ORACLE_TIMINGS]


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    measured = config.stash.get(_ORACLE_TIMINGS, {})
    if not measured:
        return
    world_size = config.getoption("bench_world_size")
    terminalreporter.section("oracle speed: medians, oracle / torch, throughput vs plain copy_")
    for case, timings in measured.items():
        terminalreporter.write_line(summary_line(case, world_size, timings))
