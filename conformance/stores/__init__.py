"""Where checkpoints are written: stores besides a local folder, through fsspec (in memory,
the local disk by URL, S3 served by a real server on loopback); a local store that fails at a
chosen byte; a writer killed at a chosen phase of its save."""

from __future__ import annotations

from conformance.stores._faults import (
    FileKind,
    StreamFault,
    failing_writer,
    with_fault,
    with_read_fault,
)
from conformance.stores._kills import PHASES, Phase, SaveKill, killed_writer
from conformance.stores._stores import STORES, OpenStore, Store, StoreName

__all__ = [
    "PHASES",
    "STORES",
    "FileKind",
    "OpenStore",
    "Phase",
    "SaveKill",
    "Store",
    "StoreName",
    "StreamFault",
    "failing_writer",
    "killed_writer",
    "with_fault",
    "with_read_fault",
]
