"""Which ids execute what: a coverage map as element sets per id, and a greedy cover of them.

An element is a block of the map (arcs that exactly the same ids executed), weighed by its
arcs: covering every element a group of ids executes is executing every arc they execute.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass

from ci.gate.coverage.map import CoverageMap


@dataclass(frozen=True)
class Executed:
    """Each id's elements, and each element's weight (its arcs)."""

    elements: Mapping[str, frozenset[int]]
    weights: tuple[int, ...]

    @classmethod
    def of(cls, coverage: CoverageMap) -> Executed:
        by_position: dict[int, list[int]] = {}
        for number, block in enumerate(coverage.blocks):
            for position in block.ids:
                by_position.setdefault(position, []).append(number)
        return cls(
            elements={
                coverage.ids[position]: frozenset(numbers)
                for position, numbers in by_position.items()
            },
            weights=tuple(len(block.arcs) for block in coverage.blocks),
        )

    def of_ids(self, ids: Iterable[str]) -> set[int]:
        found: set[int] = set()
        for nodeid in ids:
            found |= self.elements.get(nodeid, frozenset())
        return found

    def weight(self, elements: Iterable[int]) -> int:
        return sum(self.weights[element] for element in elements)


def cover(
    members: Collection[str],
    executed: Executed,
    chosen: Collection[str],
    cost: Callable[[str], float],
) -> list[str]:
    """Ids of ``members``, added to those of them already ``chosen``, that together execute
    every element some member executes: greedily, the most arcs newly executed per second
    first. Returns the added ids, in the order they were picked."""
    needed = executed.of_ids(members) - executed.of_ids(set(chosen) & set(members))
    gain = {
        nodeid: executed.weight(executed.elements.get(nodeid, frozenset()) & needed)
        for nodeid in members
    }
    heap = [
        (-gain[nodeid] / cost(nodeid), nodeid) for nodeid in sorted(members) if gain[nodeid] > 0
    ]
    heapq.heapify(heap)
    added: list[str] = []
    while needed and heap:
        _, nodeid = heapq.heappop(heap)
        new = executed.elements[nodeid] & needed
        if not new:
            continue
        rate = -executed.weight(new) / cost(nodeid)
        if heap and rate > heap[0][0]:  # stale: another id now adds more per second
            heapq.heappush(heap, (rate, nodeid))
            continue
        added.append(nodeid)
        needed -= new
    return added
