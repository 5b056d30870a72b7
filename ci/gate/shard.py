"""Shards of a gate run: ``python -m ci.gate --shard K/N`` runs the K-th of N parts.

Every runner collects the same ids and splits them alike, so the N parts hold every id once.
Ids go in groups, a module's tests at one world size together (a runner then sets up that
world once for them, not once per shard), and the groups are dealt, dearest first, to the
part with the least recorded time so far (each id weighs its test function's mean duration
at its world size, ``ci/gate/mean-durations.json``). ``python -m
ci.gate.merge`` joins the N reports into one. Loaded by ``ci.gate`` as ``-p ci.gate.shard``;
``--gate-shard`` given twice splits the first choice's part again (a runner's shard into the
jobs that run it side by side, ``ci.gate.jobs``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ci.gate.durations import weight_key
from ci.gate.tier import UNKNOWN_DURATION_S, module_of, world_size_of


def parse_shard(text: str) -> tuple[int, int]:
    """``K/N`` -> (K, N), K counted from 1."""
    index, _, count = text.partition("/")
    try:
        k, n = int(index), int(count)
    except ValueError:
        raise ValueError(f"a shard is K/N, e.g. 2/4, not {text!r}") from None
    if not 1 <= k <= n:
        raise ValueError(f"shard {text}: K must be 1 to N")
    return k, n


def split(ids: list[str], durations: dict[str, float], count: int) -> list[list[str]]:
    """``ids`` in ``count`` parts of near-equal recorded time, each group of a module at one
    world size in one part; ids keep their order within a part."""
    groups: dict[tuple[str, int], list[str]] = {}
    for nodeid in ids:
        groups.setdefault((module_of(nodeid), world_size_of(nodeid)), []).append(nodeid)

    def weight(members: list[str]) -> float:
        return sum(durations.get(weight_key(i), UNKNOWN_DURATION_S) for i in members)

    loads = [0.0] * count
    owner: dict[str, int] = {}
    by_weight = sorted(groups.items(), key=lambda group: (-weight(group[1]), group[0]))
    for _, members in by_weight:
        part = min(range(count), key=lambda index: (loads[index], index))
        loads[part] += weight(members)
        owner.update(dict.fromkeys(members, part))
    return [[nodeid for nodeid in ids if owner[nodeid] == part] for part in range(count)]


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("gate")
    group.addoption(
        "--gate-shard",
        action="append",
        metavar="K/N",
        help="run the K-th of N parts of the ids; repeated, of the part the one before chose",
    )
    group.addoption(
        "--gate-shard-durations", metavar="PATH", help="the recorded durations that weigh ids"
    )


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    chosen = config.getoption("gate_shard")
    if not chosen:
        return
    recorded = config.getoption("gate_shard_durations")
    durations = json.loads(Path(recorded).read_text()) if recorded else {}
    kept = [item.nodeid for item in items]
    for shard in chosen:
        k, n = parse_shard(shard)
        kept = split(kept, durations, n)[k - 1]
    chosen_ids = set(kept)
    dropped = [item for item in items if item.nodeid not in chosen_ids]
    items[:] = [item for item in items if item.nodeid in chosen_ids]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
