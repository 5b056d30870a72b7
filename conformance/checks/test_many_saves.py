"""Two hundred saves in a row each hold their own moment and leave the machine as they found
it; a checkpointer process killed between two saves fails the next loudly or is replaced.

A run saves hundreds of times from one process, and what a save leaks (a staged copy, a file
descriptor, a thread, a checkpointer process, shared memory) a run accumulates. FSDP2 at 2
ranks holds a model of two wide layers and 48 narrow ones with Adam. Its state is about 12
MiB a rank (``STATE_MIN_BYTES`` at least): one copy leaked per save climbs far above the
noise of a reading. Each saver saves it ``SAVES`` times, changing every value in place
between saves. The savers: ``dcp.save``; ``async_save`` with the thread and the process
checkpointer, each with a stager made for every save (``fresh``: none given) and with one
kept across the saves (``kept``: ``DefaultStager`` with shared memory, staged in the
background). Each async save is waited for before the next.

After every save each rank reads what it and its descendant processes hold
(``conformance.training.read_resources``). The first ``WARM_UP`` saves start a checkpointer
process and fill a stager's buffers. After them no reading may climb by more than its bound
above its highest in the warm-up's second half (a staged copy comes and goes). The bounds
come from the rank's state size ``S``: resident memory ``2 S`` plus the machine's reading
resolution; shared and pinned memory ``S``; descriptors ``FDS_SLACK`` and two per tensor
of the state (a process checkpointer receives each staged storage as a descriptor); threads
``THREADS_SLACK``; child processes none. A leak of one copy, a descriptor per tensor or a
thread per save passes its bound within a tenth of the saves. The checkpoints of
``SAMPLED`` saves are kept and read back whole, each equal bit for bit to the state at its
save (by digests: copies would count as memory held). The readings are plotted, one line
per rank with its bound, into the gate's ``plots`` folder, which its report shows.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
from typing import Any, Literal

import pytest
import torch
import torch.distributed as dist

from conformance._upstream import dcp, dtensor
from conformance.cells import PARALLELISMS
from conformance.training import (
    STAGINGS,
    Resources,
    change_in_place,
    contents,
    descendants,
    plot_path,
    plot_readings,
    read_resources,
    sized_model_after_a_step,
    skip_unless_checkpointer,
    start_async_save,
    tree_leaves,
)
from harness.memory import host_resolution_bytes

Saver = Literal["dcp", "thread_fresh", "thread_kept", "process_fresh", "process_kept"]
SAVERS: tuple[Saver, ...] = ("dcp", "thread_fresh", "thread_kept", "process_fresh", "process_kept")
SAVES = 200
WARM_UP = 10
SAMPLED = (0, WARM_UP, SAVES // 2, SAVES - 1)
STATE_MIN_BYTES = 8 * 2**20
WIDE_LAYERS = 2
FDS_SLACK = 8
THREADS_SLACK = 4


@pytest.mark.world(2, timeout=900)
@pytest.mark.parametrize("saver", SAVERS)
def test_two_hundred_saves_hold_their_moments_and_leak_nothing(world, saver):
    model, optimizer = sized_model_after_a_step(PARALLELISMS["fsdp2"], world, WIDE_LAYERS)
    state = {"model": model, "optimizer": optimizer}
    size, tensors = _state_bytes(state), _state_tensors(state)
    assert size >= STATE_MIN_BYTES, f"the state is {size} bytes a rank, under {STATE_MIN_BYTES}"
    save = _Saver(saver, world)
    readings: list[Resources] = []
    moments: dict[int, dict[str, str]] = {}  # digests: copies would count as held memory
    try:
        for index in range(SAVES):
            save(_app_state(model, optimizer), world.tmp_path / f"save-{index}")
            readings.append(read_resources())
            if index in SAMPLED:
                moments[index] = _digests(_app_state(model, optimizer))
            _forget(world, index - 1)
            change_in_place(model, optimizer)
    finally:
        save.close()
    bounds = _bounds(size, len(tensors))
    every_rank: list[Any] = [None] * world.size
    dist.all_gather_object(every_rank, [reading.as_dict() for reading in readings])
    if world.rank == 0:
        title = f"{saver}: {SAVES} saves"
        plot_readings(every_rank, bounds, WARM_UP, title, plot_path(f"many-saves-{saver}"))
    climbed = _climbs(readings, bounds)
    assert not climbed, (
        f"rank {world.rank}, {saver}: after save {WARM_UP} (state {size / 2**20:.1f} MiB): "
        + "; ".join(climbed)
    )
    for index, expected in moments.items():
        found = _digests(_read_back(world, index))
        wrong = _differing(found, expected)
        assert not wrong, (
            f"rank {world.rank}, {saver}: checkpoint {index} differs from the state at its save "
            f"at {len(wrong)} keys, first {wrong[:3]}"
        )


@pytest.mark.world(2)
def test_a_checkpointer_process_killed_between_saves_fails_the_next_or_is_replaced(world):
    """The last rank's checkpointer process is killed (SIGKILL) after a save finished. The next
    save must end within the process checkpointer's limit: an error on every rank, or a
    checkpoint of the new moment."""
    skip_unless_checkpointer("process")
    if not world.respawn_after_test():
        pytest.skip("a dead checkpointer process stays the build's; torchrun cannot respawn")
    model, optimizer = sized_model_after_a_step(PARALLELISMS["fsdp2"], world, WIDE_LAYERS)
    save = _Saver("process_fresh", world)
    save(_app_state(model, optimizer), world.tmp_path / "first")
    change_in_place(model, optimizer)
    expected = _digests(_app_state(model, optimizer))
    if world.rank == world.size - 1:
        checkpointers = descendants(os.getpid())
        assert checkpointers, "the process checkpointer left no process after its first save"
        for pid in checkpointers:
            os.kill(pid, signal.SIGKILL)
    world.barrier()
    pending = start_async_save(
        _app_state(model, optimizer),
        world.tmp_path / "second",
        dcp.FileSystemWriter(str(world.tmp_path / "second")),
        "process",
        save.group,
    )
    error = pending.error()  # raises where it neither finishes nor fails within its limit
    failed: list[Any] = [None] * world.size
    dist.all_gather_object(failed, error is not None)
    if any(failed):
        assert all(failed), (
            f"after the last rank's checkpointer process was killed, the next save failed on "
            f"ranks {[r for r, f in enumerate(failed) if f]} only: {error!r}"
        )
        return
    wrong = _differing(_digests(_read_back(world, "second")), expected)
    assert not wrong, f"a replaced checkpointer process saved another state at {wrong[:3]}"


class _Saver:
    """One saver's way to save and wait for the save; ``group``: its async saves' group."""

    def __init__(self, saver: Saver, world: Any) -> None:
        self.saver = saver
        self.group = dist.new_group(backend="gloo")
        checkpointer, _, stager = saver.partition("_")
        self.checkpointer = checkpointer
        if checkpointer != "dcp":
            skip_unless_checkpointer(checkpointer)  # type: ignore[arg-type]
        self.staging = STAGINGS["stager_kept" if stager == "kept" else "default"]
        self.staging.skip_unless_available()
        self.stager = self.staging.make_stager() if stager == "kept" else None

    def __call__(self, state: dict[str, Any], target: Any) -> None:
        if self.checkpointer == "dcp":
            dcp.save(state, checkpoint_id=str(target))
            return
        pending = start_async_save(
            state,
            target,
            dcp.FileSystemWriter(str(target)),
            self.checkpointer,  # type: ignore[arg-type]
            self.group,
            self.stager,
        )
        pending.staged()
        pending.finish()

    def close(self) -> None:
        if self.stager is not None:
            self.stager.close()


def _app_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict()}


def _whole_tensors(tree: Any) -> dict[str, torch.Tensor]:
    """The tensors of a state dict by key path, each whole (a DTensor gathered), copied."""
    return {
        path: value
        for path, value in tree_leaves(_made_whole(tree)).items()
        if isinstance(value, torch.Tensor)
    }


def _digests(tree: Any) -> dict[str, str]:
    """A digest of each whole tensor of a state dict (dtype, shape and bytes), by key path."""
    return {
        path: f"{value.dtype} {list(value.shape)} "
        + hashlib.sha256(value.reshape(-1).contiguous().view(torch.uint8).numpy()).hexdigest()
        for path, value in _whole_tensors(tree).items()
    }


def _differing(found: dict[str, str], expected: dict[str, str]) -> list[str]:
    """The keys whose digests differ, or that one side lacks."""
    keys = found.keys() | expected.keys()
    return sorted(key for key in keys if found.get(key) != expected.get(key))


def _made_whole(tree: Any) -> Any:
    if isinstance(tree, dict):
        return {key: _made_whole(value) for key, value in tree.items()}
    if isinstance(tree, (list, tuple)):
        return [_made_whole(value) for value in tree]
    if isinstance(tree, dtensor.DTensor):
        return tree.full_tensor()
    return tree


def _state_tensors(state: dict[str, Any]) -> list[torch.Tensor]:
    """This rank's shares of the model's and optimizer's tensors."""
    model, optimizer = state["model"], state["optimizer"]
    tensors = [*model.parameters(), *model.buffers()]
    tensors += [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
    return [getattr(t, "_local_tensor", t) for t in tensors]


def _state_bytes(state: dict[str, Any]) -> int:
    """Bytes of this rank's share of the model's and optimizer's tensors."""
    return sum(t.numel() * t.element_size() for t in _state_tensors(state))


def _forget(world: Any, index: int) -> None:
    """Delete save ``index``'s checkpoint unless it is sampled: a run keeps a few."""
    world.barrier()
    if index >= 0 and index not in SAMPLED and world.rank == 0:
        shutil.rmtree(world.tmp_path / f"save-{index}")


def _bounds(size: int, tensors: int) -> Resources:
    """How far each reading may climb past the warm-up, for a state of ``size`` bytes in
    ``tensors`` tensors. A process checkpointer receives each staged storage as a descriptor,
    and those of one save may still be open as the next begins: two per tensor."""
    return Resources(
        rss=2 * size + host_resolution_bytes(),
        shared=size,
        pinned=size,
        fds=FDS_SLACK + 2 * tensors,
        threads=THREADS_SLACK,
        children=0,
    )


def _climbs(readings: list[Resources], bounds: Resources) -> list[str]:
    """Each kind of reading that climbed past its bound after the warm-up (above the highest
    reading of the warm-up's second half, as a staged copy comes and goes): by how much,
    where."""
    limits = bounds.as_dict()
    found = []
    for kind, limit in limits.items():
        base = max(r.as_dict()[kind] for r in readings[WARM_UP // 2 : WARM_UP])
        peak, at = max((r.as_dict()[kind], i) for i, r in enumerate(readings[WARM_UP:], WARM_UP))
        if peak - base > limit:
            found.append(
                f"{kind} climbed from {base} to {peak} at save {at} (bound: {limit} above "
                f"the highest reading of saves {WARM_UP // 2} to {WARM_UP - 1})"
            )
    return found


def _read_back(world: Any, index: int | str) -> dict[str, torch.Tensor]:
    """The tensors of a checkpoint, read whole by this rank alone, by key path."""
    name = f"save-{index}" if isinstance(index, int) else index
    scratch = world.tmp_path / f"{name}-r{world.rank}.pt"
    return _whole_tensors(contents(world.tmp_path / name, scratch))
