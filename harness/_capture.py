"""Per-test capture of a rank's stdout and stderr at the file-descriptor level.

Output goes to files, not pipes, so the controller can still read what a
rank printed after that rank hung or died. Capturing at the descriptor level
also catches what C++ code (gloo, NCCL, faulthandler) writes.
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


@contextmanager
def captured_fds(capture_dir: str | Path, rank: int) -> Iterator[None]:
    """Send fds 1 and 2 to this test's capture files; restore them afterwards."""
    Path(capture_dir).mkdir(parents=True, exist_ok=True)
    saved: list[int] = []
    for fd, stream in zip((1, 2), STREAMS, strict=True):
        getattr(sys, stream).flush()
        saved.append(os.dup(fd))
        target = os.open(capture_path(capture_dir, rank, stream), os.O_WRONLY | os.O_CREAT, 0o600)
        os.dup2(target, fd)
        os.close(target)
    try:
        yield
    finally:
        for fd, stream, old in zip((1, 2), STREAMS, saved, strict=True):
            getattr(sys, stream).flush()
            os.dup2(old, fd)
            os.close(old)


def read_capture(capture_dir: str | Path, rank: int, stream: str) -> str:
    """What ``rank`` wrote to ``stream`` during one test; the tail if it is long."""
    path = capture_path(capture_dir, rank, stream)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return ""
    if len(data) > _MAX_SHOWN:
        dropped = len(data) - _MAX_SHOWN
        data = f"[... {dropped} bytes cut ...]\n".encode() + data[-_MAX_SHOWN:]
    return data.decode(errors="replace")
