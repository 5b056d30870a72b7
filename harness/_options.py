"""Command-line options of the world plugin, validated into one dataclass."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, cast, get_args

import pytest

from harness import _env, devices
from harness._spec import check_ranks_per_device

RankStart = Literal["fork", "spawn"]
DEFAULT_TIMEOUT_S = 300.0
DEFAULT_DEADLINE_FACTOR = 10.0
DEFAULT_DEADLINE_FLOOR_S = 30.0
MAX_HASH_SEED = 2**31  # PYTHONHASHSEED takes up to 2**32 - 1; a rank's is the seed + its rank


@dataclass(frozen=True)
class WorldOptions:
    """How this session runs world tests."""

    backend: str = "gloo"  # resolved: a backend the build has, never "auto"
    device_type: str = "cpu"  # resolved likewise
    sizes: tuple[int, ...] | None = None  # None: every size a test asks for
    timeout_s: float = DEFAULT_TIMEOUT_S
    max_worlds: int = 1
    require_devices: bool = False
    ranks_per_device: int = 1  # more than 1: ranks of a gloo world share each device
    # fork: ranks forked from templates that imported torch and the test modules once;
    # spawn: each rank a fresh interpreter (for a build whose import touches a device).
    rank_start: RankStart = "fork"
    # Recorded durations by test function (``path::name``, the longest of its ids): a test
    # that has one gets factor x duration as its deadline, at least the floor and at most
    # timeout_s, so a hang nobody recorded yet costs little.
    recorded_s: dict[str, float] = field(default_factory=dict)
    deadline_factor: float = DEFAULT_DEADLINE_FACTOR
    deadline_floor_s: float = DEFAULT_DEADLINE_FLOOR_S
    hash_seed: int = _env.DEFAULT_HASH_SEED

    def __post_init__(self) -> None:
        if self.sizes is not None and (not self.sizes or min(self.sizes) < 1):
            raise pytest.UsageError(f"--world-sizes needs positive sizes, got {self.sizes}")
        if self.timeout_s <= 0:
            raise pytest.UsageError(f"--world-timeout must be positive, got {self.timeout_s}")
        if self.max_worlds < 1:
            raise pytest.UsageError(f"--world-max must be at least 1, got {self.max_worlds}")
        try:
            check_ranks_per_device(self.backend, self.ranks_per_device)
        except ValueError as error:
            raise pytest.UsageError(f"--world-ranks-per-device: {error}") from None
        if self.rank_start not in get_args(RankStart):
            raise pytest.UsageError(f"--world-start takes fork or spawn, got {self.rank_start!r}")
        if self.deadline_factor <= 0 or self.deadline_floor_s <= 0:
            raise pytest.UsageError("--world-deadline-factor and -floor must be positive")
        if not 0 <= self.hash_seed < MAX_HASH_SEED:
            raise pytest.UsageError(
                f"--world-hash-seed takes 0 to {MAX_HASH_SEED - 1}, got {self.hash_seed}"
            )

    def deadline_s(self, nodeid: str) -> float:
        """The deadline of a world test without a marker timeout of its own."""
        recorded = self.recorded_s.get(nodeid.split("[", 1)[0])
        if recorded is None:
            return self.timeout_s
        fitted = max(self.deadline_floor_s, self.deadline_factor * recorded)
        return min(self.timeout_s, fitted)

    @classmethod
    def from_config(cls, config: pytest.Config) -> WorldOptions:
        raw_sizes = config.getoption("world_sizes")
        try:
            backend, device_type = devices.resolve(
                config.getoption("world_backend"), config.getoption("world_device")
            )
        except ValueError as error:
            raise pytest.UsageError(f"--world-backend/--world-device: {error}") from None
        return cls(
            backend=backend,
            device_type=device_type,
            sizes=_parse_sizes(raw_sizes) if raw_sizes else None,
            timeout_s=config.getoption("world_timeout"),
            max_worlds=config.getoption("world_max"),
            require_devices=config.getoption("world_require_devices"),
            ranks_per_device=config.getoption("world_ranks_per_device"),
            rank_start=_rank_start(config.getoption("world_start"), device_type),
            recorded_s=_recorded_durations(config.getoption("world_deadlines")),
            deadline_factor=config.getoption("world_deadline_factor"),
            deadline_floor_s=config.getoption("world_deadline_floor"),
            hash_seed=config.getoption("world_hash_seed"),
        )


def _rank_start(asked: str, device_type: str) -> RankStart:
    """``auto``: fork the ranks of CPU worlds; spawn those of accelerator worlds, whose
    builds may touch their device on import, which a forked child could not use."""
    if asked == devices.AUTO:
        return "fork" if device_type == "cpu" else "spawn"
    return cast(RankStart, asked)  # the option's choices; WorldOptions checks it again


def _recorded_durations(path: str | None) -> dict[str, float]:
    """``{path::function: seconds}`` from a JSON file; refused, naming the entry, when
    malformed."""
    if not path:
        return {}
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as error:
        raise pytest.UsageError(f"--world-deadlines {path}: {error}") from None
    if not isinstance(data, dict):
        raise pytest.UsageError(f"--world-deadlines {path}: expected an object of test ids")
    for nodeid, seconds in data.items():
        if not isinstance(seconds, int | float) or seconds < 0:
            raise pytest.UsageError(
                f"--world-deadlines {path}: {nodeid!r} needs a duration in seconds, got {seconds!r}"
            )
    return {str(nodeid): float(seconds) for nodeid, seconds in data.items()}


def _parse_sizes(text: str) -> tuple[int, ...]:
    try:
        return tuple(sorted({int(part) for part in text.split(",") if part.strip()}))
    except ValueError:
        raise pytest.UsageError(
            f"--world-sizes takes comma-separated integers, e.g. 2,4; got {text!r}"
        ) from None


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("world", "SPMD worlds of rank processes")
    group.addoption(
        "--world-backend",
        default=devices.AUTO,
        metavar="NAME",
        help="process-group backend of the worlds: any the torch build has registered, built "
        "in or out of tree (a vendor's, loaded by HARNESS_PRELOAD); auto: the default backend "
        "of the device type (default: auto)",
    )
    group.addoption(
        "--world-device",
        default=devices.AUTO,
        metavar="TYPE",
        help="device type of the worlds' ranks, bound to TYPE:local_rank (cpu, cuda, xpu, a "
        "vendor's); auto: the build's accelerator, else cpu (default: auto)",
    )
    group.addoption(
        "--world-ranks-per-device",
        type=int,
        default=1,
        metavar="N",
        help="bind N ranks to each device, TYPE:local_rank//N, so that one accelerator runs "
        "worlds of several ranks; for backends that allow it (gloo), not nccl (default: 1)",
    )
    group.addoption(
        "--world-start",
        default=devices.AUTO,
        choices=(devices.AUTO, *get_args(RankStart)),
        help="how rank processes start: fork, from a template per rank that imported torch "
        "and the session's test modules once; spawn, each a fresh interpreter (slower: "
        "seconds of imports per rank and world); auto: fork for CPU worlds, spawn for "
        "accelerators (default: auto)",
    )
    group.addoption(
        "--world-sizes",
        default=None,
        metavar="N,M",
        help="run world tests only at these sizes (default: every size a test asks for)",
    )
    group.addoption(
        "--world-timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        metavar="SECONDS",
        help="deadline of one world test; on expiry every rank's stack is dumped "
        f"and the world is replaced (default: {DEFAULT_TIMEOUT_S:g})",
    )
    group.addoption(
        "--world-deadlines",
        default=None,
        metavar="PATH",
        help="JSON {path::test_function: recorded seconds}: their ids get a deadline of "
        "--world-deadline-factor times their recorded duration, at least "
        "--world-deadline-floor and at most --world-timeout",
    )
    group.addoption(
        "--world-deadline-factor",
        type=float,
        default=DEFAULT_DEADLINE_FACTOR,
        metavar="X",
        help=f"(default: {DEFAULT_DEADLINE_FACTOR:g})",
    )
    group.addoption(
        "--world-deadline-floor",
        type=float,
        default=DEFAULT_DEADLINE_FLOOR_S,
        metavar="SECONDS",
        help=f"(default: {DEFAULT_DEADLINE_FLOOR_S:g})",
    )
    group.addoption(
        "--world-max",
        type=int,
        default=1,
        metavar="N",
        help="how many worlds may be alive at once; the least recently used is closed (default: 1)",
    )
    group.addoption(
        "--world-hash-seed",
        type=int,
        default=_env.DEFAULT_HASH_SEED,
        metavar="N",
        help="spawned rank r runs with PYTHONHASHSEED=N+r: ranks order sets of strings "
        "differently, as a launcher's processes do, and alike from run to run; under torchrun "
        f"the launcher's environment decides (default: {_env.DEFAULT_HASH_SEED})",
    )
    group.addoption(
        "--world-require-devices",
        action="store_true",
        help="fail, instead of skip, world tests whose devices this machine lacks",
    )
