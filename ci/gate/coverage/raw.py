"""The rank processes' coverage data files, read into (file, arc) -> executing ids.

Each rank of a recording writes one coverage.py data file (SQLite), its contexts the node ids
of the tests it ran (``harness/coverage.py``). A whole gate's files hold some hundred million
(arc, test) rows, so they are read in chunks into NumPy arrays of (arc, id) pairs, never into
Python objects one row at a time. The tables read are coverage.py's documented data schema
(``file``, ``context``, ``arc``), of schema version ``SCHEMA``.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import numpy.typing as npt

from ci.gate.coverage.map import Arc

SCHEMA = 7
_CHUNK = 1_000_000
_OFFSET = 1 << 20  # line numbers (negative at exits) shifted to be non-negative in a key
Pairs = npt.NDArray[np.int64]
_KEY = f"(file_id << 42) | ((fromno + {_OFFSET}) << 21) | (tono + {_OFFSET})"


def _pairs_of(
    path: Path, torch_root: Path, position: dict[str, int]
) -> tuple[list[tuple[str, Arc]], Pairs]:
    """One data file's arcs, and its unique (arc's index among them * width + id position)
    pairs, width being ``len(position)``. SQLite computes each row's arc as one integer, so
    that a row costs Python two integers, not four."""
    width = max(len(position), 1)
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        (schema,) = db.execute("SELECT version FROM coverage_schema").fetchone()
        if schema != SCHEMA:
            raise ValueError(f"{path}: coverage.py data schema {schema}, not {SCHEMA}")
        files = {
            number: Path(name).relative_to(torch_root).as_posix()
            for number, name in db.execute("SELECT id, path FROM file")
        }
        contexts = dict(db.execute("SELECT id, context FROM context"))
        context_position = np.full(max(contexts, default=0) + 1, -1, dtype=np.int64)
        for number, nodeid in contexts.items():
            context_position[number] = position.get(nodeid, -1)
        distinct = sorted(db.execute(f"SELECT DISTINCT {_KEY}, file_id, fromno, tono FROM arc"))
        keys = np.array([row[0] for row in distinct], dtype=np.int64)
        arcs = [(files[file], (start, end)) for _, file, start, end in distinct]
        found: list[Pairs] = [np.zeros(0, dtype=np.int64)]
        cursor = db.execute(f"SELECT {_KEY}, context_id FROM arc")
        while rows := cursor.fetchmany(_CHUNK):
            table = np.array(rows, dtype=np.int64)
            ids = context_position[table[:, 1]]
            kept = ids >= 0  # '' (between tests) and ids the recording did not run
            local = np.searchsorted(keys, table[kept, 0])
            found.append(np.unique(local * width + ids[kept]))
    return arcs, np.unique(np.concatenate(found))


def _read(job: tuple[Path, Path, dict[str, int]]) -> tuple[list[tuple[str, Arc]], Pairs]:
    return _pairs_of(*job)


def executors(
    data_files: Sequence[Path], torch_root: Path, ids: Sequence[str]
) -> dict[tuple[str, Arc], frozenset[str]]:
    """Every (file, arc) some id of ``ids`` executed in the data files, and those ids. The
    files are read in parallel, one process per core."""
    position = {nodeid: index for index, nodeid in enumerate(ids)}
    width = max(len(ids), 1)
    number: dict[tuple[str, Arc], int] = {}
    pairs: list[Pairs] = [np.zeros(0, dtype=np.int64)]
    jobs = [(path, torch_root, position) for path in data_files]
    workers = max(1, min(os.cpu_count() or 1, len(jobs)))
    with ProcessPoolExecutor(max_workers=workers) as pool:
        for arcs, local in pool.map(_read, jobs):
            numbers = np.array(
                [number.setdefault(arc, len(number)) for arc in arcs], dtype=np.int64
            )
            arc_index, id_position = np.divmod(local, width)
            pairs.append(np.unique(numbers[arc_index] * width + id_position))
    every = np.unique(np.concatenate(pairs))
    arc_numbers, id_positions = np.divmod(every, width)
    starts = np.flatnonzero(np.r_[True, arc_numbers[1:] != arc_numbers[:-1]])
    ends = np.r_[starts[1:], len(every)]
    named = sorted(number, key=number.__getitem__)
    shared: dict[bytes, frozenset[str]] = {}
    result: dict[tuple[str, Arc], frozenset[str]] = {}
    for start, end in zip(starts.tolist(), ends.tolist(), strict=True):
        executing = id_positions[start:end]
        key = executing.tobytes()
        if key not in shared:
            shared[key] = frozenset(ids[index] for index in executing.tolist())
        result[named[int(arc_numbers[start])]] = shared[key]
    return result


def contexts(data_files: Sequence[Path]) -> set[str]:
    """The node ids the data files hold arcs of: the ids a recording traced so far."""
    found: set[str] = set()
    for path in data_files:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
            found.update(context for (context,) in db.execute("SELECT context FROM context"))
    return found - {""}


def imported(directory: Path) -> set[str]:
    """Every torch file the ranks listed as imported (``imports-*.txt``)."""
    return {
        line
        for listing in directory.glob("imports-*.txt")
        for line in listing.read_text().splitlines()
        if line
    }
