"""What a rank holds of the machine, read from ``/proc``: its memory and that of the processes
it started, the shared memory they map or keep open, pinned host memory, open file
descriptors, threads and child processes.

A save that leaks leaves one of these higher after it than before; a run that saves hundreds
of times shows the leak as a line that climbs (``Resources`` at each save). Everything is read
for the rank's process and its descendants (a process checkpointer and what it starts), so a
leak moved into a helper process is still seen.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class Resources:
    """One reading; sizes in bytes, the rest counts."""

    rss: int  # resident memory of the rank and its descendants
    shared: int  # /dev/shm files and memfds they map or keep open, each file once
    pinned: int  # pinned host memory the accelerator's allocator holds (0 without one)
    fds: int  # open file descriptors of the rank and its descendants
    threads: int  # threads of the rank and its descendants
    children: int  # the rank's descendant processes

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


KINDS: tuple[str, ...] = tuple(Resources.__dataclass_fields__)


def descendants(pid: int) -> list[int]:
    """The live processes below ``pid``, children first."""
    found: list[int] = []
    for task in _listed(Path(f"/proc/{pid}/task")):
        try:
            children = (Path(f"/proc/{pid}/task/{task}/children")).read_text().split()
        except OSError:  # the task or the process ended while it was read
            continue
        for child in map(int, children):
            found += [child, *descendants(child)]
    return found


def read_resources() -> Resources:
    """This process's and its descendants' resources now."""
    pids = [os.getpid(), *descendants(os.getpid())]
    shared: dict[tuple[int, int], int] = {}
    rss = fds = threads = 0
    for pid in pids:
        status = _status(pid)
        rss += status.get("VmRSS", 0) * 1024
        threads += status.get("Threads", 0)
        open_fds = _listed(Path(f"/proc/{pid}/fd"))
        fds += len(open_fds)
        shared.update(_shared_files(pid, open_fds))
    return Resources(
        rss=rss,
        shared=sum(shared.values()),
        pinned=_pinned_bytes(),
        fds=fds,
        threads=threads,
        children=len(pids) - 1,
    )


def _listed(folder: Path) -> list[str]:
    try:
        return os.listdir(folder)
    except OSError:  # the process ended while it was read
        return []


def _status(pid: int) -> dict[str, int]:
    """The numeric fields of ``/proc/<pid>/status`` (kB for sizes)."""
    fields: dict[str, int] = {}
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return fields
    for line in lines:
        name, _, value = line.partition(":")
        words = value.split()
        if words and words[0].isdigit():
            fields[name] = int(words[0])
    return fields


def _is_shared_memory(target: str) -> bool:
    return target.startswith(("/dev/shm/", "/memfd:"))


def _shared_files(pid: int, open_fds: list[str]) -> dict[tuple[int, int], int]:
    """The shared-memory files ``pid`` maps or holds open, by (device, inode): their sizes."""
    files: dict[tuple[int, int], int] = {}
    for fd in open_fds:
        path = Path(f"/proc/{pid}/fd/{fd}")
        try:
            if _is_shared_memory(os.readlink(path)):
                stat = path.stat()
                files[(stat.st_dev, stat.st_ino)] = stat.st_size
        except OSError:
            continue
    try:
        maps = Path(f"/proc/{pid}/maps").read_text().splitlines()
    except OSError:
        return files
    for line in maps:
        fields = line.split(maxsplit=5)
        if len(fields) < 6 or not _is_shared_memory(fields[5]):
            continue
        start, end = (int(bound, 16) for bound in fields[0].split("-"))
        major, minor = (int(part, 16) for part in fields[3].split(":"))
        key = (os.makedev(major, minor), int(fields[4]))
        files[key] = max(files.get(key, 0), end - start)
    return files


def _pinned_bytes() -> int:
    """Pinned host memory the accelerator's caching host allocator holds now."""
    stats_of = getattr(torch.cuda.memory, "host_memory_stats", None)
    if stats_of is None or not torch.cuda.is_available():
        return 0
    stats = stats_of()
    return int(stats.get("allocated_bytes.current", stats.get("reserved_bytes.current", 0)))
