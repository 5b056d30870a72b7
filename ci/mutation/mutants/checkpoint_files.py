"""Mutants of DCP's file storage (``torch/distributed/checkpoint/filesystem.py``) as it reads
checkpoints that other releases wrote, which only the golden sets (``conformance/golden/``)
hold, checkpoints whose files rotted after the save, saves its store fails, and the bytes it
stores of a low-precision tensor; and of its fsspec storage (``_fsspec_filesystem.py``), which
writes to stores besides a local folder."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.futures import Future

from ci.mutation.mutants._mutant import FILESYSTEM, FSSPEC, mutant_maker

Fn = Callable[..., Any]
GOLDEN = "conformance/checks/test_golden_checkpoints.py"
ROTTEN = "conformance/checks/test_rotten_checkpoints.py"
FAULTS = "conformance/checks/test_store_faults.py"
STORES = "conformance/checks/test_object_stores.py"
LOW_PRECISION = "conformance/checks/test_low_precision.py"


def _pairs_unversioned_storage_in_reverse(original: Fn) -> Fn:
    def read_metadata(self: Any, *args: Any, **kwargs: Any) -> Any:
        metadata = original(self, *args, **kwargs)
        if getattr(metadata, "version", None) is None:  # written before DCP versioned it
            keys = list(metadata.storage_data)
            stored = [metadata.storage_data[key] for key in keys]
            metadata.storage_data = dict(zip(keys, reversed(stored), strict=True))
        return metadata

    return read_metadata


def _drops_read_errors(original: Fn) -> Fn:
    def read_data(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return original(self, *args, **kwargs)
        except Exception:  # the bug: the error is dropped, and the load goes on
            done: Future[None] = Future()
            done.set_result(None)
            return done

    return read_data


def _reports_failed_writes_as_done(original: Fn) -> Fn:
    def write_data(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return original(self, *args, **kwargs)
        except Exception:  # the bug: the failed write counts as a write of nothing
            done: Future[list[Any]] = Future()
            done.set_result([])
            return done

    return write_data


def _renames_by_copying(original: Fn) -> Fn:
    def rename(self: Any, path: Any, new_path: Any) -> None:
        self.fs.copy(path, new_path)  # the bug: the source is left where it was

    return rename


def _keeps_a_failed_file(original: Fn) -> Fn:
    @contextmanager
    def create_stream(self: Any, path: Any, mode: str) -> Iterator[Any]:
        with self.fs.open(os.fspath(path), mode) as stream:
            yield stream  # the bug: a stream that fails leaves its part of the file behind

    return create_stream


def _widens_narrow_floats(original: Fn) -> Fn:
    def write_item(transforms: Any, stream: Any, data: Any, *args: Any, **kwargs: Any) -> Any:
        narrow = isinstance(data, torch.Tensor) and data.is_floating_point()
        if narrow and data.element_size() < 4:
            data = data.float()  # the bug: exact values, twice or four times the bytes
        return original(transforms, stream, data, *args, **kwargs)

    return write_item


MUTANTS = [
    mutant_maker(FILESYSTEM, GOLDEN)(
        "unversioned_checkpoints_read_in_reverse",
        "FileSystemReader.read_metadata",
        "reading a checkpoint written before DCP recorded a version in its metadata (torch 2.8 "
        "and older), the reader pairs the saved entries with their stored bytes in reverse order",
        _pairs_unversioned_storage_in_reverse,
    ),
    mutant_maker(FILESYSTEM, ROTTEN)(
        "read_errors_dropped",
        "FileSystemReader.read_data",
        "an error reading a data file (one cut short, or read at another checkpoint's offsets) "
        "is dropped and the load completes, leaving what it did not read as it was",
        _drops_read_errors,
        f"{ROTTEN}::test_a_rotten_checkpoint_never_loads_other_values",
    ),
    mutant_maker(FILESYSTEM, FAULTS)(
        "failed_writes_reported_done",
        "FileSystemWriter.write_data",
        "a rank whose data file fails to write (a full disk) reports its write done with nothing "
        "written, so the save commits a .metadata that claims a whole checkpoint",
        _reports_failed_writes_as_done,
        f"{FAULTS}::test_a_save_the_store_fails_is_refused_everywhere_and_claims_nothing",
    ),
    mutant_maker(FSSPEC, STORES)(
        "fsspec_rename_leaves_the_source",
        "FileSystem.rename",
        "the fsspec store renames by copying, so every checkpoint it writes keeps a "
        ".metadata.tmp beside its .metadata",
        _renames_by_copying,
        f"{STORES}::test_a_checkpoint_in_a_store_holds_and_loads_what_local_disk_does",
    ),
    mutant_maker(FSSPEC, STORES)(
        "fsspec_keeps_the_part_of_a_failed_file",
        "FileSystem.create_stream",
        "the fsspec store leaves the part of a data file written before its stream failed: a "
        "failed save leaves a file cut short among the whole ones",
        _keeps_a_failed_file,
        f"{STORES}::test_a_stream_the_store_fails_is_removed_and_one_read_is_kept",
    ),
    mutant_maker(FILESYSTEM, LOW_PRECISION)(
        "narrow_floats_stored_as_float32",
        "_write_item",
        "DCP's file writer stores each bf16, fp16 or fp8 chunk as float32: loads give the "
        "values back exactly, from files two to four times the size the model's tensors have",
        _widens_narrow_floats,
        f"{LOW_PRECISION}::test_a_low_precision_state_comes_back_in_its_dtype_and_size"
        "[w2-fsdp2-fp8_e4m3-dcp]",
    ),
]
