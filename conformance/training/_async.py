"""Asynchronous checkpoints as a training loop takes them, and writers that misbehave on cue.

``start_async_save`` calls the build's ``dcp.async_save`` with one of its checkpointers
(``CHECKPOINTERS``: a thread, or a process per rank kept for the rank's life) and one of its
staging choices (``STAGINGS``), and hands back a ``PendingSave`` that knows which promise the
build made: the state may change once the call returns (a ``Future``), or once staging
completes (an ``AsyncSaveResponse``).

``cued_writer`` is the build's ``FileSystemWriter`` with one cue in ``write_data``: hold the
write until the test releases it (so a race with training is decided, never timed), raise on
one rank, or end the checkpointer process on one rank. Cues work through files, so they work
as well inside the process checkpointer, which receives the writer pickled.
"""

from __future__ import annotations

import inspect
import os
import signal
import time
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import pytest
import torch
import torch.distributed as dist

from conformance._upstream import (
    dcp,
    dcp_formats,
    dcp_saver,
    dcp_staging,
    dcp_state_dict_stager,
    with_parameters,
)
from conformance.models.common import train
from conformance.training._trajectory import tree_leaves

Checkpointer = Literal["thread", "process"]
CHECKPOINTERS: tuple[Checkpointer, ...] = ("thread", "process")
HOLD_LIMIT_S = 25.0  # a held write fails after this long without its release
# How long a save may take to reach its write, or to finish: the first save of a process
# checkpointer starts a process per rank (about 13 s for 4 ranks on 2 cores).
FINISH_LIMIT_S: dict[Checkpointer, float] = {"thread": 20.0, "process": 90.0}
_POLL_S = 0.002
# A cell for each kind of tensor staging sees: plain tensors, DTensors on a 1-D mesh (FSDP2,
# uneven, empty at 4 ranks), on a 2-D mesh (FSDP2 + TP), and from FSDP1's sharded state dicts:
# ShardedTensors, and DTensors on a device mesh, made anew at each read.


@dataclass(frozen=True)
class Staging:
    """One staging choice of ``async_save``.

    ``options`` are ``StagingOptions`` fields for a ``DefaultStager``; ``blocking`` makes a
    ``BlockingAsyncStager`` instead; ``writer_stages``: no stager is given and the storage
    writer (a ``FileSystemWriter`` is an ``AsyncStager``) stages, as it always did in releases
    before ``async_stager`` existed; none of these: no stager is given and the build stages
    its own way. ``cached``: the stager keeps its buffers for every save after the first, so
    a caller keeps it across saves. ``needs``: what only an accelerator offers (pinned memory,
    non-blocking copies), or None.
    """

    name: str
    options: dict[str, bool] | None = None
    blocking: bool = False
    writer_stages: bool = False
    cached: bool = False
    needs: str | None = None

    def skip_unless_available(self) -> None:
        """Skip, naming what is missing, where this machine or release cannot stage this way.
        Every rank decides alike, before any collective."""
        if self.needs is not None and not _has_accelerator():
            pytest.skip(f"{self.name}: {self.needs} needs an accelerator; this machine has none")
        if self.options is not None or self.blocking:
            with_parameters(dcp.async_save, "async_stager")
            if self.blocking:
                dcp_staging.BlockingAsyncStager  # noqa: B018 - a skip where the build lacks it
            else:
                dcp_staging.DefaultStager  # noqa: B018
                dcp_staging.StagingOptions  # noqa: B018

    @property
    def pinned(self) -> bool:
        """Whether the staged copy lies in pinned memory."""
        return bool(self.options and self.options["use_pinned_memory"]) or (
            self.cached and (self.blocking or self.writer_stages)
        )

    def pins(self, staged: torch.Tensor) -> bool:
        """Whether this staging promises ``staged`` (a staged tensor) in pinned memory.
        ``DefaultStager`` pins each storage of at least its copier's ``pin_memory_min_bytes``
        (5 bytes: smaller ones gain nothing from pinning); ``_create_cpu_state_dict`` (the
        cached writer's and ``BlockingAsyncStager``'s buffers) pins every tensor but a 0-dim
        one, which it makes anew as ``tensor(0)``."""
        if not self.pinned:
            return False
        if self.options is not None:
            return staged.untyped_storage().nbytes() >= _stager_pin_threshold()
        return staged.dim() > 0

    @property
    def shared(self) -> bool:
        """Whether the staged copy lies in shared memory."""
        return bool(self.options and self.options["use_shared_memory"])

    def make_stager(self) -> Any | None:
        """The ``async_stager`` argument: a new stager, or None where none is given."""
        if self.blocking:
            return dcp_staging.BlockingAsyncStager(cache_staged_state_dict=self.cached)
        if self.options is not None:
            return dcp_staging.DefaultStager(dcp_staging.StagingOptions(**self.options))
        return None


def _stager_pin_threshold() -> int:
    """The fewest bytes of a storage ``DefaultStager``'s copier pins: its
    ``pin_memory_min_bytes`` default, or 0 (every storage) in a release without one."""
    parameters = inspect.signature(dcp_state_dict_stager.StateDictStager).parameters
    threshold = parameters.get("pin_memory_min_bytes")
    return 0 if threshold is None else int(threshold.default)


def _has_accelerator() -> bool:
    api = getattr(torch, "accelerator", None)
    return bool(api is not None and api.is_available())


def _options(**on: bool) -> dict[str, bool]:
    fields = ("use_pinned_memory", "use_shared_memory", "use_async_staging")
    return {name: on.get(name, False) for name in (*fields, "use_non_blocking_copy")}


_PINNED = "pinned memory"
_NON_BLOCKING = "non-blocking copies"
STAGINGS: dict[str, Staging] = {
    staging.name: staging
    for staging in (
        Staging("default"),
        Staging("writer", writer_stages=True),
        Staging("writer_cached", writer_stages=True, cached=True, needs=_PINNED),
        Staging("blocking", blocking=True),
        Staging("blocking_cached", blocking=True, cached=True, needs=_PINNED),
        Staging("stager_off", _options()),
        Staging("stager_pinned", _options(use_pinned_memory=True), needs=_PINNED),
        Staging("stager_shared", _options(use_shared_memory=True)),
        Staging("stager_in_background", _options(use_async_staging=True)),
        Staging("stager_non_blocking", _options(use_non_blocking_copy=True), needs=_NON_BLOCKING),
        Staging(
            "stager_on",
            _options(
                use_pinned_memory=True,
                use_shared_memory=True,
                use_async_staging=True,
                use_non_blocking_copy=True,
            ),
            needs=f"{_PINNED} and {_NON_BLOCKING}",
        ),
        # The stager a caller makes once and keeps, staging in the background into shared
        # memory, pinned memory, or neither.
        Staging(
            "stager_kept",
            _options(use_shared_memory=True, use_async_staging=True),
            cached=True,
        ),
        Staging(
            "stager_kept_pinned",
            _options(use_pinned_memory=True, use_async_staging=True),
            cached=True,
            needs=_PINNED,
        ),
        Staging("stager_kept_plain", _options(use_async_staging=True), cached=True),
    )
}


class Cue(Protocol):
    """What a ``cued_writer`` does as its ``write_data`` to ``checkpoint`` begins, and when
    the writer is handed over (pickled) to a checkpointer process with the staged state."""

    def before_write(self, checkpoint: Path) -> None: ...

    def handed_over(self, checkpoint: Path) -> None: ...


class _Cue:
    """A cue that does nothing when its writer is handed over to a checkpointer process."""

    def handed_over(self, checkpoint: Path) -> None:
        pass


@dataclass(frozen=True)
class Gate:
    """One rank's hold on its write of one checkpoint: ``held`` appears when the write
    waits, ``release`` lets it go. Each rank has its own, so that a rank's write waits for
    that rank's training."""

    checkpoint: Path
    rank: int

    @property
    def release_mark(self) -> Path:
        return self.checkpoint.with_name(f"{self.checkpoint.name}.release.{self.rank}")

    @property
    def held_mark(self) -> Path:
        return self.checkpoint.with_name(f"{self.checkpoint.name}.held.{self.rank}")

    @property
    def handed_mark(self) -> Path:
        return self.checkpoint.with_name(f"{self.checkpoint.name}.handed.{self.rank}")

    def wait_until_held(self, checkpointer: Checkpointer) -> None:
        """Return once the write waits at this gate."""
        what = f"no write of {self.checkpoint.name} reached its gate"
        wait_for(self.held_mark, what, FINISH_LIMIT_S[checkpointer])

    def wait_until_reached(self, checkpointer: Checkpointer) -> None:
        """Return once the save reached its checkpointer: its write waits at this gate (a
        thread), or it is handed over to the checkpointer process, which writes one save at a
        time."""
        if checkpointer == "thread":
            self.wait_until_held(checkpointer)
        else:
            what = f"no request to save {self.checkpoint.name} reached the checkpointer process"
            wait_for(self.handed_mark, what, FINISH_LIMIT_S[checkpointer])

    def release(self) -> None:
        self.release_mark.touch()


@dataclass(frozen=True)
class Hold:
    """Hold each write of ``rank`` at its checkpoint's ``Gate`` until the test releases it;
    mark it when it is handed over to a checkpointer process."""

    rank: int

    def before_write(self, checkpoint: Path) -> None:
        gate = Gate(checkpoint, self.rank)
        gate.held_mark.touch()
        what = f"the test released no held write of {checkpoint.name}"
        wait_for(gate.release_mark, what, HOLD_LIMIT_S)

    def handed_over(self, checkpoint: Path) -> None:
        Gate(checkpoint, self.rank).handed_mark.touch()


@dataclass(frozen=True)
class Unheld(_Cue):
    """Write at once."""

    def before_write(self, checkpoint: Path) -> None:
        pass


def wait_for(path: Path, failure: str, limit_s: float) -> None:
    """Return once ``path`` exists (a mark another thread or process makes); raise
    ``TimeoutError`` saying ``failure`` where it does not within ``limit_s``."""
    deadline = time.monotonic() + limit_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{failure} within {limit_s:g} s")
        time.sleep(_POLL_S)


class InjectedWriteError(OSError):
    """The failure a ``Fail`` cue raises: what a full disk or a lost mount would raise."""


@dataclass(frozen=True)
class Fail(_Cue):
    """Raise in the write of ``rank``, and only there (``writer_rank`` is this writer's)."""

    rank: int
    writer_rank: int

    def before_write(self, checkpoint: Path) -> None:
        if self.writer_rank == self.rank:
            raise InjectedWriteError(f"injected write failure on rank {self.rank}")


@dataclass(frozen=True)
class Die(_Cue):
    """End the checkpointer process of ``rank`` as its write begins (``writer_rank`` is this
    writer's); refused in the trainer's own process, which this must never kill."""

    rank: int
    writer_rank: int
    trainer_pid: int

    def before_write(self, checkpoint: Path) -> None:
        if self.writer_rank != self.rank:
            return
        if os.getpid() == self.trainer_pid:
            raise RuntimeError("a Die cue runs only in a checkpointer process, not the trainer")
        os.kill(os.getpid(), signal.SIGKILL)


# The AsyncStager protocol's members: a writer given as-is stages through them.
_STAGING_MEMBERS = frozenset(
    {
        "stage",
        "synchronize_staging",
        "close",
        "should_synchronize_after_execute",
        "_synchronize_after_execute",
    }
)


class CuedWriter:
    """The build's ``FileSystemWriter`` with ``cue`` at the start of ``write_data``, and not an
    ``AsyncStager``: ``async_save`` then stages its own way, as for a path. Everything else is
    the writer's own. Picklable, for the process checkpointer."""

    def __init__(self, path: Path, cue: Cue, cached: bool = False) -> None:
        options = {"cache_staged_state_dict": True} if cached else {}
        self._writer = dcp.FileSystemWriter(str(path), **options)
        self._cue = cue

    def write_data(self, plan: Any, planner: Any) -> Any:
        self._cue.before_write(Path(str(self._writer.path)))
        return self._writer.write_data(plan, planner)

    def __getstate__(self) -> dict[str, Any]:
        # Pickled by a process checkpointer into the request that carries the staged state,
        # just before the request is sent.
        self._cue.handed_over(Path(str(self._writer.path)))
        return self.__dict__

    def __getattr__(self, name: str) -> Any:
        # Dunders (pickle's probes) and this object's own fields, missing while it is
        # unpickled, must not reach the writer.
        if name.startswith("__") or name in ("_writer", "_cue"):
            raise AttributeError(name)
        if name in _STAGING_MEMBERS and type(self) is CuedWriter:
            raise AttributeError(f"{name}: this writer does not stage")
        return getattr(self._writer, name)


class CuedStagingWriter(CuedWriter):
    """A ``CuedWriter`` that stages, as the ``FileSystemWriter`` it wraps does: ``async_save``
    given no stager stages through it."""

    _synchronize_after_execute = property(lambda self: self._writer._synchronize_after_execute)
    should_synchronize_after_execute = property(
        lambda self: self._writer.should_synchronize_after_execute
    )

    def stage(self, state_dict: Any) -> Any:
        return self._writer.stage(state_dict)

    def synchronize_staging(self) -> None:
        self._writer.synchronize_staging()

    def close(self) -> None:
        self._writer.close()


def cued_writer(path: Path, cue: Cue, staging: Staging) -> CuedWriter:
    """The writer ``staging`` saves through: one that stages where the writer stages."""
    if staging.writer_stages:
        return CuedStagingWriter(path, cue, cached=staging.cached)
    return CuedWriter(path, cue)


class Stagers:
    """The writers and stagers of one staging choice's saves. Where the choice caches its
    buffers, its stager (or its writer, where the writer stages) is made once and kept
    across the saves, as a caller keeps it; everything else is made anew for each save.
    ``close`` releases every stager made."""

    def __init__(self, staging: Staging, cue: Cue) -> None:
        self.staging, self.cue = staging, cue
        self._kept_writer: CuedWriter | None = None
        self._kept_stager: Any | None = None
        self._made: list[Any] = []

    def for_save(self, checkpoint: Path) -> tuple[CuedWriter, Any | None]:
        """The writer and the ``async_stager`` argument of a save to ``checkpoint``."""
        if not self.staging.cached:
            stager = self._made_stager()
            return cued_writer(checkpoint, self.cue, self.staging), stager
        if self.staging.writer_stages:
            if self._kept_writer is None:
                self._kept_writer = cued_writer(checkpoint, self.cue, self.staging)
            return self._kept_writer, None
        if self._kept_stager is None:
            self._kept_stager = self._made_stager()
        return cued_writer(checkpoint, self.cue, self.staging), self._kept_stager

    def _made_stager(self) -> Any | None:
        stager = self.staging.make_stager()
        self._made.append(stager)
        return stager

    def stage(self, state: dict[str, Any], checkpoint: Path) -> Any:
        """What a save of ``state`` to ``checkpoint`` stages: through its stager, or through
        its writer where the writer stages."""
        writer, stager = self.for_save(checkpoint)
        stages = stager if stager is not None else writer
        if stager is None and not self.staging.writer_stages:
            raise ValueError(f"{self.staging.name}: the build stages inside async_save")
        staged = stages.stage(state)
        return staged.result() if isinstance(staged, Future) else staged

    def close(self) -> None:
        for stager in self._made:
            if stager is not None:
                stager.close()


@dataclass
class PendingSave:
    """An ``async_save`` in flight, and the promise the build made with it."""

    returned: Any  # a Future, or an AsyncSaveResponse (staging and upload completions)
    checkpointer: Checkpointer

    @property
    def promise(self) -> str:
        """When the state may change again."""
        if hasattr(self.returned, "staging_completion"):
            return "once staging completes"
        return "once async_save returns"

    def staged(self) -> None:
        """Wait until the state may change: staging's completion, where the build returns one
        (an error of staging is raised here)."""
        completion = getattr(self.returned, "staging_completion", None)
        if completion is not None:
            completion.result(timeout=FINISH_LIMIT_S[self.checkpointer])

    def staged_on_every_rank(self) -> None:
        """``staged``, then agreed across the ranks: where staging failed on some rank, every
        rank raises (a build may report staging complete on one rank while it failed on
        another, which would leave the ranks in different collectives)."""
        error: BaseException | None = None
        try:
            self.staged()
        except BaseException as raised:
            error = raised
        seen: list[str | None] = [None] * dist.get_world_size()
        dist.all_gather_object(seen, None if error is None else _headline(error))
        if error is not None:
            raise error
        failed = {rank: what for rank, what in enumerate(seen) if what is not None}
        if failed:
            raise AssertionError(
                f"staging failed on ranks {sorted(failed)} ({next(iter(failed.values()))}), "
                f"while rank {dist.get_rank()} was told it was complete"
            )

    @property
    def _upload(self) -> Future[Any]:
        upload: Future[Any] = getattr(self.returned, "upload_completion", self.returned)
        return upload

    def error(self) -> BaseException | None:
        """Wait for the save: the error it ended with (``CheckpointException`` is a
        ``BaseException``), or None where it succeeded. A save that neither finished nor
        failed within ``FINISH_LIMIT_S`` is a failure of its own."""
        limit = FINISH_LIMIT_S[self.checkpointer]
        try:
            self._upload.result(timeout=limit)
        except TimeoutError:
            raise AssertionError(
                f"the async save neither finished nor failed within {limit:g} s"
            ) from None
        except BaseException as error:
            return error
        return None

    def finish(self) -> None:
        """Wait for the save; raise what it ended with."""
        error = self.error()
        if error is not None:
            raise error


def _headline(error: BaseException) -> str:
    return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"[:300]


def start_async_save(
    state: dict[str, Any],
    checkpoint: Path | None,
    writer: Any,
    checkpointer: Checkpointer,
    group: Any,
    stager: Any | None = None,
) -> PendingSave:
    """``dcp.async_save`` of ``state`` to ``checkpoint`` through ``writer`` (which may have
    written elsewhere before; where ``checkpoint`` is None, where the writer points) with
    ``checkpointer`` and ``stager`` (None: none given), its collectives on ``group``; a skip
    naming what the release lacks."""
    save = dcp.async_save
    options: dict[str, Any] = {"storage_writer": writer, "process_group": group}
    if checkpoint is not None:
        options["checkpoint_id"] = str(checkpoint)
    if checkpointer != "thread":  # the thread is every release's default
        with_parameters(save, "async_checkpointer_type")
        options["async_checkpointer_type"] = dcp_saver.AsyncCheckpointerType(checkpointer)
    if stager is not None:
        with_parameters(save, "async_stager")
        options["async_stager"] = stager
    return PendingSave(save(state, **options), checkpointer)


def skip_unless_checkpointer(checkpointer: Checkpointer) -> None:
    """Skip, naming the parameter, where ``async_save`` has no choice of checkpointer."""
    if checkpointer != "thread":
        with_parameters(dcp.async_save, "async_checkpointer_type")


def contents(checkpoint: Path, scratch: Path) -> dict[str, Any]:
    """Everything ``checkpoint`` holds, each tensor whole, read by this rank alone
    (``dcp_to_torch_save``, then ``torch.load``); ``scratch`` is a file path of this rank's."""
    dcp_formats.dcp_to_torch_save(str(checkpoint), str(scratch))
    loaded: dict[str, Any] = torch.load(scratch, weights_only=False)
    return loaded


def read_whole(world: Any, name: str) -> dict[str, Any]:
    """The leaves of the checkpoint ``name`` in the test's folder, read whole by this rank
    alone (``contents``)."""
    scratch = world.tmp_path / f"{name}-r{world.rank}.pt"
    return tree_leaves(contents(world.tmp_path / name, scratch))


def last_words(error: BaseException) -> str:
    """An error's last words: its last line that is not a traceback's caret marks."""
    lines = [line.strip() for line in str(error).splitlines()]
    said = [line for line in lines if line and set(line) - set("^~ ")]
    return said[-1] if said else type(error).__name__


@torch.no_grad()
def change_in_place(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    for value in (*model.parameters(), *model.buffers()):
        if value.is_floating_point():
            value.add_(1.0)
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor) and value.is_floating_point():
                value.add_(1.0)


def change_every_value(training: Any, step: int) -> None:
    """What training does after a save's call, and more: the step that follows ``step``
    steps, a ``zero_grad``, then every parameter, floating buffer and optimizer state tensor
    changed in place, so a save that still reads the live state shows it."""
    model, optimizer, scheduler = training
    train(model, optimizer, 1, scheduler, start=step)
    optimizer.zero_grad()
    change_in_place(model, optimizer)
