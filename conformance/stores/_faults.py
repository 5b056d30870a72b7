"""A store that fails as disks fail: an ``OSError`` with a chosen ``errno`` once a file has
taken a chosen number of bytes, on one rank.

``failing_writer`` is the build's ``FileSystemWriter`` whose file system (``writer.fs``, the
layer every stream of its ``write_data`` and ``finish`` is opened through) writes the first
``at_byte`` bytes of the chosen kind of file, then raises: what a full disk (``ENOSPC``) or a
failing one (``EIO``) does to ``write``. Nothing sleeps or races: the fault falls at that
byte, every run.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from conformance._upstream import dcp

FileKind = Literal["data", "metadata"]


@dataclass(frozen=True)
class StreamFault:
    """Fail the writes of ``kind`` files past ``at_byte`` with ``errno``."""

    errno: int
    kind: FileKind
    at_byte: int

    def applies_to(self, path: Path) -> bool:
        """Whether a file at ``path`` is of this fault's kind: DCP's data files end in
        ``.distcp``; its metadata is written as ``.metadata.tmp``, then renamed."""
        if self.kind == "data":
            return path.name.endswith(".distcp")
        return path.name.startswith(".metadata")

    @property
    def cause(self) -> str:
        """The words of the error, as the system gives them: what a refusal must name."""
        return os.strerror(self.errno)


class _FailingStream:
    """A writable stream that takes ``fault.at_byte`` bytes, then raises ``fault``'s error;
    everything but ``write`` is the stream's own."""

    def __init__(self, stream: Any, fault: StreamFault, path: Path) -> None:
        self._stream, self._fault, self._path = stream, fault, path
        self._written = 0

    def write(self, data: Any) -> int:
        room = self._fault.at_byte - self._written
        size = memoryview(data).nbytes
        if size <= room:
            self._written += size
            return int(self._stream.write(data))
        self._stream.write(memoryview(data).cast("B")[:room])
        self._written = self._fault.at_byte
        raise OSError(self._fault.errno, self._fault.cause, str(self._path))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class _FailingFileSystem:
    """DCP's local file system with ``fault`` in the streams it opens for writing."""

    def __init__(self, fs: Any, fault: StreamFault) -> None:
        self._fs, self._fault = fs, fault

    @contextmanager
    def create_stream(self, path: Any, mode: str) -> Iterator[Any]:
        with self._fs.create_stream(path, mode) as stream:
            if "w" in mode and self._fault.applies_to(Path(path)):
                yield _FailingStream(stream, self._fault, Path(path))
            else:
                yield stream

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fs, name)


def failing_writer(path: Path, fault: StreamFault | None, **options: Any) -> Any:
    """The build's ``FileSystemWriter`` of ``path`` (``options``: its own), its writes failing
    as ``fault`` says (None: a writer as any other)."""
    writer = dcp.FileSystemWriter(str(path), **options)
    if fault is not None:
        writer.fs = _FailingFileSystem(writer.fs, fault)
    return writer
