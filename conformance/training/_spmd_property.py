"""Property tests run SPMD: rank 0's hypothesis search drives, every rank checks each example.

Hypothesis may draw different examples on different ranks even when
derandomized: it mixes in "interesting constants" read from the modules a
process has imported, and ranks import lazily along different code paths.
Different draws mean mismatched collectives, so a hang instead of a failure.
Hence only rank 0 searches; it broadcasts each example, every rank checks it,
and the ranks agree on its outcome, so a failure on one rank fails (and
shrinks) the search. A last message carries the search's verdict to the other
ranks, which then fail with their own error on the final (shrunk) example.

Those constants also make the leader's draws depend on which tests ran before
in the same process; loading every module of the suite first makes a test
draw the same examples whether it runs alone or after others.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

EXAMPLES = 25
LEADER = 0
SUITE_PACKAGES = ("conformance", "harness", "reference_impl")


@dataclass(frozen=True)
class _Example:
    spec: Any


@dataclass(frozen=True)
class _Verdict:
    failure: str | None  # the leader's error, or None where the search passed


def spmd_property(
    device: torch.device,
    strategy: st.SearchStrategy[Any],
    check: Callable[[Any], None],
    examples: int = EXAMPLES,
) -> None:
    """Search for an example of ``strategy`` that fails ``check`` on any rank.

    ``device`` is where the outcome is agreed (the world's device: CPU for gloo,
    this rank's GPU for NCCL).
    """
    if dist.get_rank() == LEADER:
        _load_every_suite_module()
        _lead(device, strategy, check, examples)
    else:
        _follow(device, check)


def _lead(
    device: torch.device,
    strategy: st.SearchStrategy[Any],
    check: Callable[[Any], None],
    examples: int,
) -> None:
    @settings(
        max_examples=examples,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def agreed(spec: Any) -> None:
        _send(_Example(spec))
        _check_and_agree(device, check, spec)

    try:
        agreed()
    except BaseException as exc:
        _send(_Verdict(failure=f"{type(exc).__name__}: {exc}"))
        raise
    _send(_Verdict(failure=None))


def _load_every_suite_module() -> None:
    """Import every module of the suite but tests and conftests (hypothesis skips those)."""
    for package_name in SUITE_PACKAGES:
        package = importlib.import_module(package_name)
        for module in pkgutil.walk_packages(package.__path__, f"{package_name}."):
            leaf = module.name.rsplit(".", 1)[-1]
            if not (leaf.startswith("test_") or leaf == "conftest"):
                importlib.import_module(module.name)


def _follow(device: torch.device, check: Callable[[Any], None]) -> None:
    last_error: BaseException | None = None
    while isinstance(message := _receive(), _Example):
        try:
            _check_and_agree(device, check, message.spec)
        except Exception as exc:
            exc.add_note(f"example: {message.spec!r}")
            last_error = exc
    if message.failure is None:
        return
    if last_error is not None:
        raise last_error
    raise AssertionError(f"the search failed on rank {LEADER}: {message.failure}")


def _check_and_agree(device: torch.device, check: Callable[[Any], None], spec: Any) -> None:
    """Run ``check`` on this rank; raise if it failed here or on any other rank."""
    error: Exception | None = None
    try:
        check(spec)
    except Exception as exc:
        error = exc
    failures = torch.tensor([0 if error is None else 1], device=device)
    dist.all_reduce(failures)
    if error is not None:
        raise error
    if failures.item():
        raise AssertionError("this example failed on another rank")


def _send(message: _Example | _Verdict) -> None:
    dist.broadcast_object_list([message], src=LEADER)


def _receive() -> _Example | _Verdict:
    box: list[Any] = [None]
    dist.broadcast_object_list(box, src=LEADER)
    return box[0]
