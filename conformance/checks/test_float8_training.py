"""Float8 training (torchao's ``Float8Linear``) under FSDP2: its state dicts hold the fp32
masters, and its checkpoints resume it and load into a model without float8.

torchao converts the linear layers of ``conformance.models.float8``'s MLP, which the golden
FSDP2 cell then shards, with FSDP2's float8 all-gather (``float8_all_gather``) or without it
(``fp32_all_gather``). Its sharded parameters are then DTensors whose local parts are
torchao's tensor subclass (``WeightWithDynamicFloat8CastTensor``). After ``SAVED_AFTER`` Adam
steps at 2 and 4 ranks:

- the sharded model state has the eager MLP's keys, each a DTensor of fp32; the full model
  and optimizer state equal one process's float8 training, bit for bit;
- saved (``dcp.save``; ``dcp.async_save`` with the thread checkpointer; each rank's
  ``torch.save`` of its sharded state, read with ``torch.load(weights_only=True)``) and
  loaded into fresh float8 objects, it trains ``MORE_STEPS`` more to that process's state
  after all of them;
- its DCP checkpoint loads into the MLP without float8, sharded by FSDP2 and whole on every
  rank, each holding the float8 model's values exactly.

Skips, naming why, where torchao's float8 cannot be imported (torchao is pinned in the test
extras for the default torch; its releases pair with torch's).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from conformance._upstream import dcp, dsd, full_options
from conformance.cells import PARALLELISMS
from conformance.compare import assert_state_dict_equal
from conformance.models.common import train
from conformance.models.float8 import Float8ReadyMLP, float8_batch, float8_truth, seeded_model
from conformance.models.optimizers import adam
from conformance.training import (
    assert_state_is,
    load_checkpoint,
    save_checkpoint,
    start_async_save,
    training_state,
)

CELL = "fsdp2"
ALL_GATHERS = {"float8_all_gather": True, "fp32_all_gather": False}
SAVERS = ("dcp", "async_save", "torch_save")
SAVED_AFTER = 2
MORE_STEPS = 2


def _sharded(world: Any, float8_all_gather: bool | None) -> tuple[Any, Any]:
    """The MLP (float8 unless ``float8_all_gather`` is None) sharded as the FSDP2 cell
    shards, and its Adam."""
    cell = PARALLELISMS[CELL]
    cell.skip_unless_runnable(world.device)
    model = cell.wrap(seeded_model(float8_all_gather).to(world.device), world)
    return model, adam(model)


@pytest.mark.world(2, 4)
@pytest.mark.parametrize("all_gather", sorted(ALL_GATHERS))
def test_a_float8_state_dict_holds_the_masters_one_process_trains(world, all_gather):
    model, optimizer = _sharded(world, ALL_GATHERS[all_gather])
    train(model, optimizer, SAVED_AFTER, inputs=float8_batch)
    sharded = dsd.get_model_state_dict(model)
    assert sorted(sharded) == sorted(Float8ReadyMLP().state_dict()), (
        f"rank {world.rank}: float8 training's state dict has keys {sorted(sharded)}"
    )
    for key, value in sharded.items():
        assert value.dtype == torch.float32, f"rank {world.rank}, {key}: {value.dtype}"
    model_state, optim_state = dsd.get_state_dict(model, optimizer, options=full_options())
    assert_state_is(model_state, optim_state, float8_truth(SAVED_AFTER))


@pytest.mark.world(2, 4)
@pytest.mark.parametrize("saver", SAVERS)
@pytest.mark.parametrize("all_gather", sorted(ALL_GATHERS))
def test_a_float8_run_resumes_as_one_process_trains(world, all_gather, saver):
    model, optimizer = _sharded(world, ALL_GATHERS[all_gather])
    train(model, optimizer, SAVED_AFTER, inputs=float8_batch)
    path = world.tmp_path / "checkpoint"
    _save(saver, model, optimizer, path, world)
    model, optimizer = _sharded(world, ALL_GATHERS[all_gather])
    _load(saver, model, optimizer, path, world.rank)
    train(model, optimizer, MORE_STEPS, start=SAVED_AFTER, inputs=float8_batch)
    model_state, optim_state = dsd.get_state_dict(model, optimizer, options=full_options())
    truth = float8_truth(SAVED_AFTER + MORE_STEPS)
    assert_state_is(model_state, optim_state, truth, full_load=True)


@pytest.mark.world(2, 4)
def test_a_float8_checkpoint_loads_into_a_model_without_float8(world):
    model, optimizer = _sharded(world, float8_all_gather=True)
    train(model, optimizer, SAVED_AFTER, inputs=float8_batch)
    path = str(world.tmp_path / "checkpoint")
    dcp.save(dsd.get_model_state_dict(model), checkpoint_id=path)
    trained = dsd.get_model_state_dict(model, options=full_options())
    eager, _ = _sharded(world, float8_all_gather=None)
    state = dsd.get_model_state_dict(eager)
    dcp.load(state, checkpoint_id=path)
    dsd.set_model_state_dict(eager, state)
    assert_state_dict_equal(dsd.get_model_state_dict(eager, options=full_options()), trained)
    whole = {key: torch.zeros_like(value) for key, value in trained.items()}
    dcp.load(whole, checkpoint_id=path)
    assert_state_dict_equal(whole, trained)


def _save(saver: str, model: Any, optimizer: Any, path: Path, world: Any) -> None:
    if saver == "torch_save":
        path.mkdir(exist_ok=True)
        torch.save(training_state(model, optimizer, None), path / f"rank_{world.rank}.pt")
    elif saver == "dcp":
        save_checkpoint(model, optimizer, str(path))
    else:
        state = training_state(model, optimizer, None)
        start_async_save(state, path, dcp.FileSystemWriter(str(path)), "thread", None).finish()
    world.barrier()


def _load(saver: str, model: Any, optimizer: Any, path: Path, rank: int) -> None:
    if saver != "torch_save":
        load_checkpoint(model, optimizer, str(path))
        return
    state = torch.load(path / f"rank_{rank}.pt", weights_only=True)
    dsd.set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
    )
