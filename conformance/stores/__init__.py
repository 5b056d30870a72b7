"""Where checkpoints are written: stores besides a local folder, through fsspec (in memory,
the local disk by URL, S3 served by a real server on loopback), and a local store that fails
at a chosen byte."""

from __future__ import annotations

from conformance.stores._faults import FileKind, StreamFault, failing_writer
from conformance.stores._stores import STORES, OpenStore, Store, StoreName

__all__ = ["STORES", "FileKind", "OpenStore", "Store", "StoreName", "StreamFault", "failing_writer"]
