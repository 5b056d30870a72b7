"""A run resumed from a checkpoint of its whole state draws and trains as one that never
stopped: the same batches, the same random numbers, the same learning rates and loss scales,
the same values.

A run (``conformance.training.Run``) trains the MLP with AdamW, a learning-rate schedule, a
loss scaler, a shuffling ``StatefulDataLoader`` and noise from torch's generator; numpy's
and Python's streams are drawn per rank. It is saved after ``SAVED_AFTER`` steps, in the
middle of the second epoch, with all of it in the checkpoint:

- ``dcp``: ``dcp.save`` of the run as DCP's ``Stateful`` app state (sharded model and
  optimizer, each rank's random streams under its own key);
- ``async_save``: ``dcp.async_save`` of the same, with the thread checkpointer;
- ``torch_save``: each rank's ``torch.save`` of the run's state with the model and optimizer
  whole, read back with ``torch.load(weights_only=True)``.

Then every stream is seeded anew, fresh objects load the checkpoint, and ``MORE_STEPS``
steps are trained. At 2 ranks the run is saved and resumed at 2; at 4 it is saved at 4 and
resumed on the first 2, each taking its own rank's streams. Each step's draws (sample
indices, noise, per-rank numbers, learning rate, loss scale) must equal the same step of
one process that never stopped. So must the whole state after the last step: model and
optimizer, schedule, scaler, loader and streams, exactly (each cell here is exact). The
schedules are ``SequentialLR`` of a linear warm-up and a cosine on the golden cell of each
data-parallel family, and a ``LambdaLR`` warm-up and cosine and a ``StepLR`` on DDP's. A
failure names the rank, the step and what differs, with both values.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from conformance._upstream import dcp
from conformance.cells import PARALLELISMS, Parallelism, SubWorld
from conformance.compare import assert_state_dict_equal
from conformance.models.common import seeded_mlp
from conformance.models.zoo import model_of
from conformance.training import (
    Draws,
    Run,
    RunState,
    Schedule,
    load_options_for,
    seed_streams,
    start_async_save,
)

pytest.importorskip("torchdata.stateful_dataloader", reason="torchdata is not installed")

SAVED_AFTER = 4
MORE_STEPS = 4
RESUMED_SIZE = 2
GOLDEN = [c.name for c in PARALLELISMS.values() if "golden" in c.roles]
DATA_PARALLEL = [name for name in GOLDEN if PARALLELISMS[name].family in ("ddp", "fsdp1", "fsdp2")]
OF_DDP = [name for name in DATA_PARALLEL if PARALLELISMS[name].family == "ddp"]
# Each data-parallel family's golden cell with SequentialLR; the other schedules on DDP's.
RUNS: list[tuple[str, Schedule]] = [
    *((name, "warmup_cosine") for name in DATA_PARALLEL),
    *((name, schedule) for name in OF_DDP for schedule in ("lambda_warmup_cosine", "step")),
]
SAVERS = ("dcp", "async_save", "torch_save")
RESEEDED = 99  # the streams' seed between the save and the load: the load must undo it


@pytest.mark.world(2, 4)
@pytest.mark.parametrize("saver", SAVERS)
@pytest.mark.parametrize(("cell", "schedule"), RUNS)
def test_a_resumed_run_draws_and_trains_as_one_that_never_stopped(world, cell, schedule, saver):
    parallelism = PARALLELISMS[cell]
    parallelism.skip_unless_runnable(world.device)
    never_stopped, expected = _never_stopped(world, schedule)
    run = _run_in(parallelism, world, schedule)
    run.train(SAVED_AFTER)
    path = world.tmp_path / "checkpoint"
    _save(saver, run, path, world)
    resumers: Any = world if world.size == RESUMED_SIZE else SubWorld(world, RESUMED_SIZE)
    load = load_options_for(resumers) if resumers is not world else {}
    if resumers is not world and not resumers.member:
        world.barrier()
        return
    try:
        fresh = _run_in(parallelism, resumers, schedule)
        seed_streams(world.rank + RESEEDED, world.device)
        _load(saver, fresh, path, world.rank, load)
        drawn = fresh.train(MORE_STEPS)
        where = f"rank {world.rank}, saved at {world.size} ranks by {saver}, resumed at "
        where += f"{RESUMED_SIZE}"
        _assert_draws_equal(drawn, never_stopped[SAVED_AFTER:], where)
        try:
            assert_state_dict_equal(_as_lists(fresh.state_dict(full=True)), _as_lists(expected))
        except AssertionError as error:
            raise AssertionError(
                f"{where}: after {MORE_STEPS} more steps the run's state differs from one that "
                f"never stopped: {error}"
            ) from None
    finally:
        world.barrier()


def _run_in(cell: Parallelism, world: Any, schedule: Schedule) -> Run:
    """A run of ``cell`` on ``world``'s ranks, its streams seeded after the model is built."""
    run = Run.of(model_of(cell, world), schedule, cell, world.rank)
    seed_streams(world.rank, world.device)
    return run


def _never_stopped(world: Any, schedule: Schedule) -> tuple[list[Draws], dict[str, Any]]:
    """One process's run of ``SAVED_AFTER + MORE_STEPS`` steps, seeded as this rank's: what
    each step drew and the whole state after the last."""
    run = Run.of(seeded_mlp().to(world.device), schedule, None, world.rank)
    seed_streams(world.rank, world.device)
    drawn = run.train(SAVED_AFTER + MORE_STEPS)
    return drawn, run.state_dict(full=True)


def _save(saver: str, run: Run, path: Path, world: Any) -> None:
    if saver == "torch_save":
        path.mkdir(exist_ok=True)
        torch.save(run.state_dict(full=True), path / f"rank_{world.rank}.pt")
    elif saver == "dcp":
        dcp.save({"run": RunState(run)}, checkpoint_id=str(path))
    else:
        writer = dcp.FileSystemWriter(str(path))
        start_async_save({"run": RunState(run)}, path, writer, "thread", None).finish()
    world.barrier()


def _load(saver: str, run: Run, path: Path, rank: int, load: dict[str, Any]) -> None:
    if saver == "torch_save":
        state = torch.load(path / f"rank_{rank}.pt", weights_only=True)
        run.load_state_dict(state, full=True)
    else:
        dcp.load({"run": RunState(run)}, checkpoint_id=str(path), **load)


def _as_lists(tree: Any) -> Any:
    """``tree`` with its tuples as lists: a load rebuilds hyper-parameters such as Adam's
    ``betas`` as lists of the same values (see ``assert_state_is_single_process``)."""
    if isinstance(tree, dict):
        return {key: _as_lists(value) for key, value in tree.items()}
    if isinstance(tree, (list, tuple)):
        return [_as_lists(value) for value in tree]
    return tree


def _assert_draws_equal(drawn: list[Draws], expected: list[Draws], where: str) -> None:
    for step, (resumed, never) in enumerate(zip(drawn, expected, strict=True)):
        differences = resumed.differences(never)
        assert not differences, (
            f"{where}: step {step + 1} after the load drew otherwise than one process that "
            f"never stopped (resumed against never stopped): {'; '.join(differences)}"
        )
