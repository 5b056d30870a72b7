"""Command-line options of the world plugin, validated into one dataclass."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from harness._spec import BACKEND_DEVICE_TYPES

DEFAULT_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class WorldOptions:
    """How this session runs world tests."""

    backend: str = "gloo"
    sizes: tuple[int, ...] | None = None  # None: every size a test asks for
    timeout_s: float = DEFAULT_TIMEOUT_S
    max_worlds: int = 1
    require_devices: bool = False

    def __post_init__(self) -> None:
        if self.backend not in BACKEND_DEVICE_TYPES:
            raise pytest.UsageError(
                f"--backend must be one of {', '.join(BACKEND_DEVICE_TYPES)}, got {self.backend!r}"
            )
        if self.sizes is not None and (not self.sizes or min(self.sizes) < 1):
            raise pytest.UsageError(f"--world-sizes needs positive sizes, got {self.sizes}")
        if self.timeout_s <= 0:
            raise pytest.UsageError(f"--world-timeout must be positive, got {self.timeout_s}")
        if self.max_worlds < 1:
            raise pytest.UsageError(f"--max-worlds must be at least 1, got {self.max_worlds}")

    @classmethod
    def from_config(cls, config: pytest.Config) -> WorldOptions:
        raw_sizes = config.getoption("world_sizes")
        return cls(
            backend=config.getoption("backend"),
            sizes=_parse_sizes(raw_sizes) if raw_sizes else None,
            timeout_s=config.getoption("world_timeout"),
            max_worlds=config.getoption("max_worlds"),
            require_devices=config.getoption("require_devices"),
        )


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
        "--backend",
        default="gloo",
        choices=sorted(BACKEND_DEVICE_TYPES),
        help="process-group backend of the worlds (default: gloo)",
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
        "--max-worlds",
        type=int,
        default=1,
        metavar="N",
        help="how many worlds may be alive at once; the least recently used is closed (default: 1)",
    )
    group.addoption(
        "--require-devices",
        action="store_true",
        help="fail, instead of skip, world tests whose devices this machine lacks",
    )
