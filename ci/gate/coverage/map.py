"""A coverage map: which gate ids executed which lines and branches of torch's measured files.

Coverage records arcs (a jump from one line to the next, entries and exits included), so an
arc stands for a line and for a branch taken. Arcs that exactly the same ids executed form a
block: the map stores each block once, with its file, its arcs and its ids, which keeps a
whole gate's map small. Stored as xz-compressed JSON; id sets as runs of consecutive indices
into the sorted ids, since the ids of one test function sit side by side.
"""

from __future__ import annotations

import json
import lzma
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

FORMAT = 1
Arc = tuple[int, int]  # coverage.py's arc: from line to line, negative at entries and exits


@dataclass(frozen=True)
class Block:
    """Arcs of one file that exactly the same ids executed."""

    file: str  # relative to the torch package: distributed/checkpoint/planner.py
    arcs: tuple[Arc, ...]
    ids: frozenset[int]  # indices into ``CoverageMap.ids``


@dataclass(frozen=True)
class CoverageMap:
    """One recording of the whole gate under one torch release."""

    torch: str  # torch.__version__ of the recording
    world_sizes: str
    ids: tuple[str, ...]  # every id the recording ran, sorted; some executed no measured arc
    blocks: tuple[Block, ...]
    imported: frozenset[str]  # every torch file a rank imported, relative to the package
    digests: Mapping[str, str] = field(default_factory=dict)  # check module path -> sha256

    @cached_property
    def files(self) -> frozenset[str]:
        """The measured files some id executed."""
        return frozenset(block.file for block in self.blocks)

    def ids_executing(self, file: str) -> set[str]:
        """The ids that executed any arc of ``file``."""
        positions: set[int] = set()
        for block in self.blocks:
            if block.file == file:
                positions |= block.ids
        return {self.ids[position] for position in positions}

    def executors(self) -> dict[tuple[str, Arc], frozenset[str]]:
        """Each (file, arc) and the ids that executed it."""
        named = {
            block.ids: frozenset(self.ids[position] for position in block.ids)
            for block in self.blocks
        }
        return {(block.file, arc): named[block.ids] for block in self.blocks for arc in block.arcs}


def build(
    torch: str,
    world_sizes: str,
    ran: Iterable[str],
    executors: Mapping[tuple[str, Arc], frozenset[str]],
    imported: Iterable[str],
    digests: Mapping[str, str],
) -> CoverageMap:
    """The map of the ids that ran, from each (file, arc) and the ids that executed it."""
    ids = tuple(sorted(set(ran).union(*executors.values())))
    position = {nodeid: index for index, nodeid in enumerate(ids)}
    numbered: dict[frozenset[str], frozenset[int]] = {}
    grouped: dict[tuple[str, frozenset[int]], list[Arc]] = {}
    for (file, arc), executing in executors.items():
        if executing:
            if executing not in numbered:
                numbered[executing] = frozenset(position[nodeid] for nodeid in executing)
            grouped.setdefault((file, numbered[executing]), []).append(arc)
    blocks = tuple(
        Block(file=file, arcs=tuple(sorted(arcs)), ids=positions)
        for (file, positions), arcs in sorted(
            grouped.items(), key=lambda item: (item[0][0], min(item[1]))
        )
    )
    return CoverageMap(
        torch=torch,
        world_sizes=world_sizes,
        ids=ids,
        blocks=blocks,
        imported=frozenset(imported),
        digests=dict(sorted(digests.items())),
    )


def runs(positions: Iterable[int]) -> list[int]:
    """Sorted indices as flat (start, length) pairs: [3, 4, 5, 9] -> [3, 3, 9, 1]."""
    flat: list[int] = []
    for index in sorted(positions):
        if flat and flat[-2] + flat[-1] == index:
            flat[-1] += 1
        else:
            flat += [index, 1]
    return flat


def from_runs(flat: list[int]) -> frozenset[int]:
    return frozenset(
        index
        for start, length in zip(flat[::2], flat[1::2], strict=True)
        for index in range(start, start + length)
    )


def save(coverage: CoverageMap, path: Path) -> None:
    files = sorted(coverage.files)
    number = {file: index for index, file in enumerate(files)}
    document = {
        "format": FORMAT,
        "torch": coverage.torch,
        "world_sizes": coverage.world_sizes,
        "ids": list(coverage.ids),
        "files": files,
        "blocks": [
            [number[block.file], [line for arc in block.arcs for line in arc], runs(block.ids)]
            for block in coverage.blocks
        ],
        "imported": sorted(coverage.imported),
        "digests": dict(coverage.digests),
    }
    text = json.dumps(document, separators=(",", ":"))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(lzma.compress(text.encode(), preset=9))


def load(path: Path) -> CoverageMap:
    document = json.loads(lzma.decompress(path.read_bytes()))
    if document.get("format") != FORMAT:
        raise ValueError(f"{path}: coverage map format {document.get('format')}, not {FORMAT}")
    files = document["files"]
    return CoverageMap(
        torch=document["torch"],
        world_sizes=document["world_sizes"],
        ids=tuple(document["ids"]),
        blocks=tuple(
            Block(
                file=files[file],
                arcs=tuple(zip(lines[::2], lines[1::2], strict=True)),
                ids=from_runs(ids),
            )
            for file, lines, ids in document["blocks"]
        ),
        imported=frozenset(document["imported"]),
        digests=document["digests"],
    )
