"""Per-test capture of a rank's stdout and stderr at the file-descriptor level.

Output goes to files, not pipes, so the controller can still read what a
rank printed after that rank hung or died. Capturing at the descriptor level
also catches what C++ code (gloo, NCCL, faulthandler) writes. A rank that
finishes its test reads its own capture and sends it with its result, so the
controller opens the files only for ranks that crashed or hung.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

STREAMS = ("stdout", "stderr")
_MAX_SHOWN = 64 * 1024


def capture_path(capture_dir: str | Path, rank: int, stream: str) -> Path:
    """Where ``rank`` writes ``stream`` ("stdout" or "stderr") for one test."""
    return Path(capture_dir) / f"rank{rank}.{stream}"


def stack_dump_path(world_dir: str | Path, rank: int) -> Path:
    """Where ``rank`` writes its Python stacks when the controller asks for them."""
    return Path(world_dir) / f"rank{rank}.stacks"


class FdCapture:
    """A rank's capture files, opened once and emptied before each test."""

    def __init__(self, capture_dir: str | Path, rank: int) -> None:
        Path(capture_dir).mkdir(parents=True, exist_ok=True)
        self._fds = [
            os.open(capture_path(capture_dir, rank, stream), os.O_RDWR | os.O_CREAT, 0o600)
            for stream in STREAMS
        ]

    @contextmanager
    def during_test(self) -> Iterator[None]:
        """Send fds 1 and 2 to the emptied capture files; restore them afterwards."""
        saved: list[int] = []
        for fd, stream, target in zip((1, 2), STREAMS, self._fds, strict=True):
            getattr(sys, stream).flush()
            os.ftruncate(target, 0)
            os.lseek(target, 0, os.SEEK_SET)
            saved.append(os.dup(fd))
            os.dup2(target, fd)
        try:
            yield
        finally:
            for fd, stream, old in zip((1, 2), STREAMS, saved, strict=True):
                getattr(sys, stream).flush()
                os.dup2(old, fd)
                os.close(old)

    def captured(self) -> dict[str, str]:
        """What the last test wrote to each stream; the tail if it is long."""
        return {stream: _tail(fd) for stream, fd in zip(STREAMS, self._fds, strict=True)}


def read_capture(capture_dir: str | Path, rank: int, stream: str) -> str:
    """What ``rank`` wrote to ``stream`` during its last test; the tail if it is long."""
    try:
        fd = os.open(capture_path(capture_dir, rank, stream), os.O_RDONLY)
    except FileNotFoundError:
        return ""
    try:
        return _tail(fd)
    finally:
        os.close(fd)


def _tail(fd: int) -> str:
    """The last ``_MAX_SHOWN`` bytes of the file at ``fd``, saying how much was cut before."""
    size = os.fstat(fd).st_size
    if size == 0:
        return ""
    start = max(0, size - _MAX_SHOWN)
    data = os.pread(fd, size - start, start)
    if start:
        data = f"[... {start} bytes cut ...]\n".encode() + data
    return data.decode(errors="replace")
