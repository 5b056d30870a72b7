"""A save cut short as a preemption or the OOM killer cuts it: the process that writes (a
rank, or the checkpointer process that writes for it) is killed with SIGKILL at a chosen
phase of a DCP save, at the same point on every run.

``killed_writer`` is the build's ``FileSystemWriter`` with the kill at its phase: as its
``write_data`` begins (the plans are made and exchanged), after ``AT_BYTE`` bytes of its
data file, once its data is written (before ``.metadata``, which waits for every rank's), or
after ``AT_BYTE`` bytes of ``.metadata`` (rank 0 writes it).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from conformance.stores._faults import StreamKill, kill_this_process, with_fault
from conformance.training import CuedStagingWriter, Unheld

Phase = Literal["planned", "mid_data", "data_written", "mid_metadata"]
PHASES: tuple[Phase, ...] = ("planned", "mid_data", "data_written", "mid_metadata")
AT_BYTE = 1000  # bytes a file takes before the kill falls in the middle of it

PHASE_WORDS: dict[Phase, str] = {
    "planned": "after planning, before it wrote any data",
    "mid_data": f"after {AT_BYTE} bytes of its data file",
    "data_written": "after its data was written, before .metadata",
    "mid_metadata": f"after {AT_BYTE} bytes of .metadata",
}


@dataclass(frozen=True)
class SaveKill:
    """A kill at ``phase`` of a save; ``spared_pid`` is a process it must never take (the
    trainer, where a checkpointer process writes and is the one to die)."""

    phase: Phase
    spared_pid: int | None = None

    @staticmethod
    def victim(phase: Phase, size: int) -> int:
        """The rank whose writer is killed: rank 0, which writes ``.metadata``, for that
        phase; the last rank for the others."""
        return 0 if phase == "mid_metadata" else size - 1

    @property
    def words(self) -> str:
        return PHASE_WORDS[self.phase]

    def in_stream(self) -> StreamKill | None:
        """The kill that falls in a file's bytes, for the phases in the middle of one."""
        if self.phase == "mid_data":
            return StreamKill("data", AT_BYTE, self.spared_pid)
        if self.phase == "mid_metadata":
            return StreamKill("metadata", AT_BYTE, self.spared_pid)
        return None


@dataclass(frozen=True)
class _KilledAsItsWriteBegins:
    """The cue of a writer killed at ``planned``: its process dies as ``write_data`` begins."""

    kill: SaveKill

    def before_write(self, checkpoint: Path) -> None:
        if self.kill.phase == "planned":
            kill_this_process(self.kill.spared_pid, f"the start of the write of {checkpoint}")

    def handed_over(self, checkpoint: Path) -> None:
        pass


class _KilledWriter(CuedStagingWriter):
    """The build's ``FileSystemWriter``, its process killed at ``kill``'s phase; everything
    else, staging included (every kind of tensor, in every release), is the writer's own.
    Picklable, for a checkpointer process."""

    def __init__(self, path: Path, kill: SaveKill) -> None:
        super().__init__(path, _KilledAsItsWriteBegins(kill))
        with_fault(self._writer, kill.in_stream())
        self._kill = kill

    def write_data(self, plan: Any, planner: Any) -> Any:
        written = super().write_data(plan, planner)
        if self._kill.phase == "data_written":
            written.wait()
            kill_this_process(self._kill.spared_pid, "the end of write_data")
        return written


def killed_writer(path: Path, kill: SaveKill | None) -> Any:
    """A ``FileSystemWriter`` of ``path`` that stages what it saves, its process killed as
    ``kill`` says (None: never)."""
    if kill is None:
        return CuedStagingWriter(path, Unheld())
    return _KilledWriter(path, kill)
