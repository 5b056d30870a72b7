"""Shards of a gate run: ``python -m ci.gate --gate-shard K/N`` runs the K-th of N parts.

Every runner collects the same ids and splits them alike, so the N parts hold every id once.
Ids go in groups, a module's tests at one world size together (a runner then sets up that
world once for them, not once per shard), and the groups are dealt, dearest first, to the
part with the least recorded time so far (each id weighs its test function's mean duration
at its world size, ``ci/gate/mean-durations.json``). A group that outweighs a part's share
of the whole (a module of a few long tests) is cut into runs of its ids within that share,
so no part waits on one module. ``python -m
ci.gate.merge`` joins the N reports into one. Loaded by ``ci.gate`` as ``-p ci.gate.shard``.

Jobs side by side on one host (``ci.gate.jobs``) do not split their ids ahead: each runs the
groups it claims (``--gate-claims DIR``, a directory they share), in one order, the largest
world first and within it the dearest group first; a job that finishes a group claims the
next one no job has claimed. A group that outweighs a job's share (``--gate-claim-jobs N``
jobs share the ids) is cut into runs within that share, as for shards, so one job does not
run a module of a few long tests while the others idle. Recorded weights only order the
groups, so the jobs end within one small group of each other however the host's contention
differs from the recording.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from ci.gate.durations import weight_key
from ci.gate.node_ids import module_of, world_size_of
from ci.gate.tier import UNKNOWN_DURATION_S

Group = tuple[str, int]  # a module's tests at one world size
Claim = tuple[str, int, int]  # a run of a group's ids that one job claims: the group, a piece
CLAIMS = pytest.StashKey["Claims"]()


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


def _groups(ids: list[str]) -> dict[Group, list[str]]:
    """``ids`` by module and world size, each group's ids in their order."""
    groups: dict[Group, list[str]] = {}
    for nodeid in ids:
        groups.setdefault((module_of(nodeid), world_size_of(nodeid)), []).append(nodeid)
    return groups


def _weight(members: list[str], durations: dict[str, float]) -> float:
    return sum(durations.get(weight_key(nodeid), UNKNOWN_DURATION_S) for nodeid in members)


def _pieces(members: list[str], durations: dict[str, float], share: float) -> list[list[str]]:
    """``members`` whole where they weigh ``share`` or less; else cut, in their order, into
    runs that each weigh at most ``share`` (an id heavier than it alone in its run)."""
    if _weight(members, durations) <= share:
        return [members]
    pieces: list[list[str]] = [[]]
    load = 0.0
    for nodeid in members:
        weight = _weight([nodeid], durations)
        if pieces[-1] and load + weight > share:
            pieces.append([])
            load = 0.0
        pieces[-1].append(nodeid)
        load += weight
    return pieces


def split(ids: list[str], durations: dict[str, float], count: int) -> list[list[str]]:
    """``ids`` in ``count`` parts of near-equal recorded time, each group of a module at one
    world size in one part unless it outweighs a part's share; ids keep their order within a
    part."""
    loads = [0.0] * count
    owner: dict[str, int] = {}
    share = _weight(ids, durations) / count
    pieces = [
        piece for members in _groups(ids).values() for piece in _pieces(members, durations, share)
    ]
    by_weight = sorted(pieces, key=lambda piece: (-_weight(piece, durations), piece[0]))
    for members in by_weight:
        part = min(range(count), key=lambda index: (loads[index], index))
        loads[part] += _weight(members, durations)
        owner.update(dict.fromkeys(members, part))
    return [[nodeid for nodeid in ids if owner[nodeid] == part] for part in range(count)]


def claim_order(
    ids: list[str], durations: dict[str, float], jobs: int = 1
) -> list[tuple[Claim, list[str]]]:
    """The runs of ``ids`` in the order ``jobs`` jobs claim them: each group whole, or cut
    into pieces within a job's share where it outweighs it; the largest world first (a job
    then starts each world size once or twice), within it the dearest run first (the last
    ones claimed are the cheapest, so the jobs end close together)."""
    share = _weight(ids, durations) / jobs
    runs = [
        ((module, size, piece), members)
        for (module, size), group in _groups(ids).items()
        for piece, members in enumerate(_pieces(group, durations, share))
    ]
    return sorted(runs, key=lambda run: (-run[0][1], -_weight(run[1], durations), run[0]))


class Claims:
    """The groups this job runs: a group is claimed when its first test is due, by creating
    its file in the directory the jobs share; the job that creates it runs the group.

    ``teardown_to`` maps each test that ends a run, where the next test in order may share
    collectors that this job's next test does not, to the test its teardown is handed
    instead (``run_ends``)."""

    def __init__(
        self,
        directory: Path,
        claim_of: dict[str, Claim],
        teardown_to: dict[str, pytest.Item] | None = None,
    ) -> None:
        self.directory = directory
        self.claim_of = claim_of
        self.teardown_to = teardown_to or {}
        self.decided: dict[Claim, bool] = {}

    def ours(self, nodeid: str) -> bool:
        claim = self.claim_of[nodeid]
        if claim not in self.decided:
            self.decided[claim] = self._claim(claim)
        return self.decided[claim]

    def _claim(self, claim: Claim) -> bool:
        module, size, piece = claim
        try:
            (self.directory / f"{module}[w{size}]#{piece}").touch(exist_ok=False)
        except FileExistsError:
            return False
        return True


def run_ends(items: list[pytest.Item], claim_of: dict[str, Claim]) -> dict[str, pytest.Item]:
    """For each test that ends a run of ``items`` (in claim order), where needed, the later
    test to hand its teardown instead of the next one in order.

    pytest tears a test down to the collectors it shares with the next test (its module, a
    class), and sets the following test up on what is left. A job skips the runs other jobs
    claimed, so the test it runs after a run's end may not be the next one in order: a run
    of module M's ids, then one of M's that another job claimed, then module N's, would leave
    M set up under N's first test. The teardown is handed the first later test that shares
    with the ending test no more than every later test shares with each other, so what it
    keeps suits whichever test the job runs next."""
    chains: list[Sequence[object]] = [item.listchain() for item in items]
    shared_after = [0] * len(items)  # how many collectors every test after the i-th shares
    common = chains[-1] if chains else []
    for index in range(len(items) - 2, -1, -1):
        common = common[: _shared(common, chains[index + 1])]
        shared_after[index] = len(common)
    ends: dict[str, pytest.Item] = {}
    for index, item in enumerate(items[:-1]):
        if claim_of[item.nodeid] == claim_of[items[index + 1].nodeid]:
            continue
        if _shared(chains[index], chains[index + 1]) <= shared_after[index]:
            continue
        ends[item.nodeid] = next(
            items[later]
            for later in range(index + 2, len(items))
            if _shared(chains[index], chains[later]) <= shared_after[index]
        )
    return ends


def _shared(first: Sequence[object], second: Sequence[object]) -> int:
    """How many collectors two chains share from the session down."""
    count = 0
    for a, b in zip(first, second, strict=False):
        if a is not b:
            break
        count += 1
    return count


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("gate")
    group.addoption("--gate-shard", metavar="K/N", help="run the K-th of N parts of the ids")
    group.addoption(
        "--gate-shard-durations", metavar="PATH", help="the recorded durations that weigh ids"
    )
    group.addoption(
        "--gate-claims",
        metavar="DIR",
        help="run only the groups of ids this job claims first in DIR, which jobs side by "
        "side share",
    )
    group.addoption(
        "--gate-claim-jobs",
        type=int,
        default=1,
        metavar="N",
        help="how many jobs share --gate-claims: a group of ids heavier than 1/N of their "
        "recorded time is cut into runs that jobs claim apart",
    )


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    shard = config.getoption("gate_shard")
    claims = config.getoption("gate_claims")
    if not (shard or claims):
        return
    recorded = config.getoption("gate_shard_durations")
    durations = json.loads(Path(recorded).read_text()) if recorded else {}
    kept = [item.nodeid for item in items]
    if shard:
        k, n = parse_shard(shard)
        kept = split(kept, durations, n)[k - 1]
        chosen_ids = set(kept)
        dropped = [item for item in items if item.nodeid not in chosen_ids]
        items[:] = [item for item in items if item.nodeid in chosen_ids]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
    if claims:
        order = claim_order(kept, durations, config.getoption("gate_claim_jobs"))
        position = {nodeid: index for index, (_, members) in enumerate(order) for nodeid in members}
        items.sort(key=lambda item: position[item.nodeid])
        claim_of = {nodeid: claim for claim, members in order for nodeid in members}
        config.stash[CLAIMS] = Claims(Path(claims), claim_of, run_ends(items, claim_of))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
    """A test of a run another job claimed is left to it: no phase runs, nothing is
    reported here. A test that ends a run is torn down as ``run_ends`` says."""
    claims = item.config.stash.get(CLAIMS, None)
    if claims is None:
        return None
    if not claims.ours(item.nodeid):
        return True
    teardown_to = claims.teardown_to.get(item.nodeid, nextitem)
    if teardown_to is nextitem:
        return None
    item.ihook.pytest_runtest_protocol(item=item, nextitem=teardown_to)
    return True
