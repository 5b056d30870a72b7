"""A store that fails as disks fail, or whose writer dies as a preempted job dies, at a chosen
byte of a chosen kind of file, on one rank.

``failing_writer`` is the build's ``FileSystemWriter`` whose file system (``writer.fs``, the
layer every stream of its ``write_data`` and ``finish`` is opened through) writes the first
``at_byte`` bytes of the chosen kind of file, then strikes: ``StreamFault`` raises an
``OSError`` with a chosen ``errno`` (what a full disk, ``ENOSPC``, or a failing one, ``EIO``,
does to ``write``); ``StreamKill`` kills the writing process with SIGKILL. Nothing sleeps or
races: the fault falls at that byte, every run. ``with_fault`` strikes another writer's file
system so (an ``FsspecWriter``'s), ``with_read_fault`` a reader's reads.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from conformance._upstream import dcp

FileKind = Literal["data", "metadata"]


def is_of_kind(path: Path, kind: FileKind) -> bool:
    """Whether DCP's file at ``path`` is of ``kind``: its data files end in ``.distcp``; its
    metadata is written as ``.metadata`` (through ``.metadata.tmp``, then a rename, where a
    release does so)."""
    if kind == "data":
        return path.name.endswith(".distcp")
    return path.name.startswith(".metadata")


class ByteFault(Protocol):
    """What falls on a file of ``kind`` once it has taken ``at_byte`` bytes."""

    kind: FileKind
    at_byte: int

    def strike(self, path: Path) -> None: ...


@dataclass(frozen=True)
class StreamFault:
    """Fail the writes of ``kind`` files past ``at_byte`` with ``errno``."""

    errno: int
    kind: FileKind
    at_byte: int

    @property
    def cause(self) -> str:
        """The words of the error, as the system gives them: what a refusal must name."""
        return os.strerror(self.errno)

    def strike(self, path: Path) -> None:
        raise OSError(self.errno, self.cause, str(path))


@dataclass(frozen=True)
class StreamKill:
    """Kill the writing process (SIGKILL) once a ``kind`` file has taken ``at_byte`` bytes,
    the bytes before on their way to the disk, as a preemption finds them. ``spared_pid``:
    a process this must never kill (a trainer, where its checkpointer process is the one to
    die); there it raises instead."""

    kind: FileKind
    at_byte: int
    spared_pid: int | None = None

    def strike(self, path: Path) -> None:
        kill_this_process(self.spared_pid, f"a write of {path}")


def kill_this_process(spared_pid: int | None, where: str) -> None:
    """SIGKILL to this process, unless it is ``spared_pid``."""
    if os.getpid() == spared_pid:
        raise RuntimeError(f"{where}: the kill meant for another process fell in the trainer")
    os.kill(os.getpid(), signal.SIGKILL)


class _FailingStream:
    """A writable stream that takes ``fault.at_byte`` bytes, then strikes; everything but
    ``write`` is the stream's own."""

    def __init__(self, stream: Any, fault: ByteFault, path: Path) -> None:
        self._stream, self._fault, self._path = stream, fault, path
        self._written = 0

    def write(self, data: Any) -> int:
        room = self._fault.at_byte - self._written
        size = memoryview(data).nbytes
        if size <= room:
            self._written += size
            return int(self._stream.write(data))
        self._stream.write(memoryview(data).cast("B")[:room])
        self._stream.flush()
        self._written = self._fault.at_byte
        self._fault.strike(self._path)
        raise AssertionError(f"{self._fault} did not strike at {self._path}")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class _ReadsFail:
    """A readable stream whose reads strike ``fault`` at once; everything else is its own."""

    def __init__(self, stream: Any, fault: ByteFault, path: Path) -> None:
        self._stream, self._fault, self._path = stream, fault, path

    def read(self, *_: Any) -> bytes:
        self._fault.strike(self._path)
        raise AssertionError(f"{self._fault} did not strike at {self._path}")

    readinto = read

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class _FailingFileSystem:
    """DCP's file system (a writer's, or a reader's where ``reading``) with ``fault`` in the
    streams of ``fault.kind`` it opens for writing (or reading). Picklable, for a writer a
    checkpointer process runs."""

    def __init__(self, fs: Any, fault: ByteFault, reading: bool = False) -> None:
        self._fs, self._fault, self._reading = fs, fault, reading

    @contextmanager
    def create_stream(self, path: Any, mode: str) -> Iterator[Any]:
        with self._fs.create_stream(path, mode) as stream:
            struck = ("r" if self._reading else "w") in mode
            if not struck or not is_of_kind(Path(path), self._fault.kind):
                yield stream
            elif self._reading:
                yield _ReadsFail(stream, self._fault, Path(path))
            else:
                yield _FailingStream(stream, self._fault, Path(path))

    def __getattr__(self, name: str) -> Any:
        # This object's own fields, missing while it is unpickled, must not recurse.
        if name.startswith("__") or name in ("_fs", "_fault", "_reading"):
            raise AttributeError(name)
        return getattr(self._fs, name)


def with_fault(writer: Any, fault: ByteFault | None) -> Any:
    """``writer`` (a ``FileSystemWriter``), its writes struck as ``fault`` says (None: left
    as it is)."""
    if fault is not None:
        writer.fs = _FailingFileSystem(writer.fs, fault)
    return writer


def with_read_fault(reader: Any, fault: StreamFault) -> Any:
    """``reader`` (a ``FileSystemReader`` or ``FsspecReader``), every read of its
    ``fault.kind`` files failing with ``fault``'s error."""
    reader.fs = _FailingFileSystem(reader.fs, fault, reading=True)
    return reader


def failing_writer(path: Path, fault: StreamFault | None, **options: Any) -> Any:
    """The build's ``FileSystemWriter`` of ``path`` (``options``: its own), its writes failing
    as ``fault`` says (None: a writer as any other)."""
    return with_fault(dcp.FileSystemWriter(str(path), **options), fault)
