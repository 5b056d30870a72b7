"""The tests that write a golden set: ``python -m ci.gate.golden`` runs this module (it is no
check of the gate, which collects ``test_*.py`` alone).

Each test trains fresh objects of a cell ``STEPS`` steps (the matrix's model, AdamW and a
StepLR scheduler) and writes one checkpoint under ``$GOLDEN_OUT``: DCP, saved and
asynchronously saved, by every parallelism family at every world size it has up to 4; FSDP1's
FULL, SHARDED and LOCAL state dicts through ``torch.save``; and one process's model, optimizer
and scheduler state through ``torch.save``, with each step's state of ``STEPS + MORE_STEPS``
steps. Beside each checkpoint, rank 0 leaves an entry (``ENTRIES``) with every value the
checkpoint holds, for the command to gather into the set's record.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from conformance._golden import (
    ENTRIES,
    OUT_VARIABLE,
    RECIPE,
    STEPS,
    TRAJECTORY,
    Kind,
    full_state,
    full_state_leaves,
    leaf_records,
    state_leaves,
)
from conformance._upstream import dcp
from conformance.cells import PARALLELISMS, exists_at_size, with_role
from conformance.compare import holds_a_part
from conformance.divergences import resolve
from conformance.divergences.session import applied_manifests
from conformance.models.common import train
from conformance.models.optimizers import OPTIMIZERS
from conformance.models.zoo import MODELS
from conformance.training import (
    MORE_STEPS,
    fsdp1_api,
    torch_model_state_dict,
    trained,
    training_state,
    under_optim_settings,
)
from harness.machine import this_machine

DCP_WRITERS = with_role("golden")
DCP_MODES = ("sync", "async")
# FSDP1's state-dict kinds, each by the cell that writes it: LOCAL has no optimizer state dict
# of its own, and loads only without use_orig_params (upstream's record
# local-state-dict-with-orig-params-unloadable).
FSDP1_WRITERS = {
    "full": "fsdp1_full_shard_orig",
    "sharded": "fsdp1_full_shard_orig",
    "local": "fsdp1_full_shard_flat",
}
SINGLE_MODELS = ("mlp", "moe")  # the models the DCP writers train
# Upstream's records of what some releases cannot save: async_save staging FSDP1's
# ShardedTensors; get_state_dict on a rank whose FSDP1 shard of a parameter is empty (a hang).
ASYNC_SHARDED_TENSORS = "defaultstager-cannot-stage-sharded-tensors"
EMPTY_FSDP1_SHARD = "empty-fsdp1-shard-is-meta-check-hangs"
EMPTY_SHARD_SIZE = 4  # the world size at which a rank holds no shard of a parameter


def _scheduled(scheduler: Any) -> Any:
    """The recipe's scheduler, which ``RECIPE`` always has."""
    if scheduler is None:
        raise ValueError(f"{RECIPE} builds no scheduler; the golden sets need one")
    return scheduler


def _out() -> Path:
    return Path(os.environ[OUT_VARIABLE])


def _leave_entry(world: Any, entry: dict[str, Any]) -> None:
    """Rank 0 leaves the checkpoint's entry for the record; every rank waits for it."""
    if world.rank == 0:
        entries = _out() / ENTRIES
        entries.mkdir(parents=True, exist_ok=True)
        name = entry["path"].replace("/", "--")
        (entries / f"{name}.json").write_text(json.dumps(entry))
    world.barrier()


def _skip_where_upstream_diverges(divergence_id: str) -> None:
    """Skip, naming upstream's record, where it holds for the release under test: a checkpoint
    the release cannot write is left out of its set, the reason in the record."""
    for known in resolve(applied_manifests([]), torch.__version__).known:
        if known.id == divergence_id:
            pytest.skip(f"upstream {known.id}: {known.reason} ({known.link})")


def _entry(
    path: str, kind: Kind, cell: str, size: int, form: str, model: str, flattened: bool
) -> dict[str, Any]:
    """A checkpoint's entry in the record, but for its files and values (``GoldenCheckpoint``)."""
    return {
        "path": path,
        "kind": kind,
        "cell": cell,
        "size": size,
        "form": form,
        "model": model,
        "flattened": flattened,
    }


@pytest.mark.world(1, 2, 4, applies=exists_at_size("cell"))
@pytest.mark.parametrize("mode", DCP_MODES)
@pytest.mark.parametrize("cell", DCP_WRITERS)
def test_writes_a_dcp_checkpoint(world: Any, cell: str, mode: str) -> None:
    parallelism = PARALLELISMS[cell]
    parallelism.skip_unless_runnable(world.device)
    if parallelism.fsdp1 and world.size == EMPTY_SHARD_SIZE:
        _skip_where_upstream_diverges(EMPTY_FSDP1_SHARD)
    if mode == "async" and parallelism.fsdp1:
        _skip_where_upstream_diverges(ASYNC_SHARDED_TENSORS)
    model, optimizer, scheduler = trained(parallelism, world, RECIPE, STEPS)
    flattened = holds_a_part(model)
    path = f"dcp/{cell}-w{world.size}-{mode}"
    state = training_state(model, optimizer, scheduler, flatten=flattened)
    if mode == "sync":
        dcp.save(state, checkpoint_id=str(_out() / path))
    else:
        dcp.async_save(state, checkpoint_id=str(_out() / path)).result()
    values = full_state_leaves(model, optimizer, scheduler, flatten=flattened)
    entry = _entry(path, "dcp", cell, world.size, mode, parallelism.model_id, flattened)
    _leave_entry(world, entry | {"values": values})


@pytest.mark.world(2, 4)
@pytest.mark.parametrize("kind", sorted(FSDP1_WRITERS))
def test_writes_fsdp1_state_dicts(world: Any, kind: str) -> None:
    """Each rank's ``torch.save`` of its state dicts of ``kind`` (rank 0's alone for FULL,
    which every rank holds whole)."""
    cell = FSDP1_WRITERS[kind]
    model, optimizer, scheduler = trained(PARALLELISMS[cell], world, RECIPE, STEPS)
    state: dict[str, Any] = {
        "model": torch_model_state_dict(model, kind),
        "scheduler": _scheduled(scheduler).state_dict(),
    }
    if kind != "local":
        optim_state_dict = fsdp1_api("optim_state_dict")
        state["optim"] = under_optim_settings(
            model, kind, lambda: optim_state_dict(model, optimizer)
        )
    path = f"fsdp1/{kind}-w{world.size}"
    (_out() / path).mkdir(parents=True, exist_ok=True)
    if kind != "full" or world.rank == 0:
        torch.save(state, _out() / path / f"rank{world.rank}.pt")
    values = full_state_leaves(model, optimizer, scheduler, flatten=False)
    entry = _entry(path, "fsdp1", cell, world.size, kind, "mlp", False)
    _leave_entry(world, entry | {"values": values})


@pytest.mark.world(1)
@pytest.mark.parametrize("model_id", SINGLE_MODELS)
def test_writes_the_single_process_state(world: Any, model_id: str) -> None:
    """One process's model, optimizer and scheduler state after ``STEPS`` steps, each through
    ``torch.save`` as users keep them, and its whole state after every step of ``STEPS +
    MORE_STEPS`` (``TRAJECTORY``), with the signature of the machine that computed it."""
    recipe = MODELS[model_id]
    model = recipe.build().to(world.device)
    optimizer, scheduler = OPTIMIZERS[RECIPE].build(model)
    path = f"single/{model_id}"
    (_out() / path).mkdir(parents=True, exist_ok=True)
    trajectory = []
    for step in range(STEPS + MORE_STEPS):
        train(model, optimizer, 1, scheduler, start=step, inputs=recipe.inputs)
        state = full_state(model, optimizer, scheduler, flatten=False)
        trajectory.append({key: _kept(leaf) for key, leaf in state_leaves(state).items()})
        if step + 1 == STEPS:
            torch.save(model.state_dict(), _out() / path / "model.pt")
            torch.save(optimizer.state_dict(), _out() / path / "optim.pt")
            torch.save(_scheduled(scheduler).state_dict(), _out() / path / "scheduler.pt")
    torch.save(trajectory, _out() / path / TRAJECTORY)
    entry = _entry(path, "single", "single", 1, "torch.save", model_id, False)
    values = leaf_records(trajectory[STEPS - 1])
    machine = this_machine(world.device_type).to_json()
    _leave_entry(world, entry | {"values": values, "machine": machine})


def _kept(leaf: Any) -> Any:
    """A leaf as the trajectory keeps it: a tensor detached, on the host, its own copy."""
    return leaf.detach().cpu().clone() if isinstance(leaf, torch.Tensor) else leaf
