"""Mutants of DCP's file storage (``torch/distributed/checkpoint/filesystem.py``) as it reads
checkpoints that other releases wrote: only the golden sets (``conformance/golden/``) hold
those, so only their checks can see these bugs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ci.mutation.mutants._mutant import FILESYSTEM, mutant_maker

Fn = Callable[..., Any]
GOLDEN = "conformance/checks/test_golden_checkpoints.py"


def _pairs_unversioned_storage_in_reverse(original: Fn) -> Fn:
    def read_metadata(self: Any, *args: Any, **kwargs: Any) -> Any:
        metadata = original(self, *args, **kwargs)
        if getattr(metadata, "version", None) is None:  # written before DCP versioned it
            keys = list(metadata.storage_data)
            stored = [metadata.storage_data[key] for key in keys]
            metadata.storage_data = dict(zip(keys, reversed(stored), strict=True))
        return metadata

    return read_metadata


MUTANTS = [
    mutant_maker(FILESYSTEM, GOLDEN)(
        "unversioned_checkpoints_read_in_reverse",
        "FileSystemReader.read_metadata",
        "reading a checkpoint written before DCP recorded a version in its metadata (torch 2.8 "
        "and older), the reader pairs the saved entries with their stored bytes in reverse order",
        _pairs_unversioned_storage_in_reverse,
    ),
]
