"""Loading into a model built on the meta device: how large models are loaded.

A model made under ``torch.device("meta")`` holds no memory until it is wrapped and loaded;
torchtitan and most recipes load big models this way. Each of the ways users load it is
judged against the single-process run, on every cell that wraps a model on meta, at every
size it has:

- ``broadcast``: ``set_model_state_dict(full_state_dict, broadcast_from_rank0)`` with the full
  state dict on rank 0 only (read from a ``torch.save`` file), nothing on the others;
- ``distribute``: ``set_model_state_dict(full_state_dict)`` with the full state dict on every
  rank: each rank keeps its piece and the load assigns it;
- ``to_empty``: ``model.to_empty(device)``, then ``dcp.load`` of a checkpoint the same cell
  saved.

After the load, every parameter and persistent buffer lies on the rank's device (none is
left on meta). After a full load, each sharded parameter's piece lies in memory of its own,
smaller than the whole tensor: not a view of the full tensor it was cut from. Each holds the
single-process value after ``SAVED_AFTER`` steps. An optimizer
built then is given the full optimizer state, broadcast from rank 0 where the model was. It
trains on to exactly what ``SAVED_AFTER + MORE_STEPS`` single-process steps give. DDP wraps
only real tensors (it broadcasts rank 0's at construction), so users materialize the model
before wrapping it: it is not a cell of this module. Non-persistent buffers are in no state
dict: they stay on meta after a full load, and initializing them is the user's part.

A full optimizer load gives a tuple hyper-parameter (Adam's ``betas``) back as a list of the
same values. The reason: ``_unflatten_state_dict`` rebuilds every sequence as a list, while
FSDP1 keeps the tuple. So hyper-parameters are compared as values. On 2.13.0 the module finds
these known divergences:

- FSDP1 at 4 ranks, where rank 3 holds no chunk of ``fc2``, cannot ``dcp.load`` after
  ``to_empty``.
- FSDP1 + TP refuses a full model state dict into the model it materialized ("aten.copy_.default
  got mixed torch.Tensor and DTensor"). It also chunks TP-sharded optimizer state as if whole.
- FSDP2 + TP cannot take a full state dict given on every rank (``_distribute_state_dict`` and
  ``_StridedShard``, pytorch#136228). Broadcast from rank 0, it loads exactly.

The mutant ``meta_model_load_leaves_a_buffer_on_meta`` (a persistent buffer left on meta
after the load) is seen by this module only.
"""

from __future__ import annotations

from typing import Any, Literal

import pytest
import torch
from torch import nn

from conformance._upstream import dsd, dtensor, full_options
from conformance.cells import (
    PARALLELISMS,
    Parallelism,
    comparison_tolerance,
    exists_at_size,
)
from conformance.compare import local_tensors_by_path
from conformance.models.common import train
from conformance.models.optimizers import OPTIMIZERS
from conformance.models.zoo import MODELS, truth_of
from conformance.training import (
    MORE_STEPS,
    assert_full_state_is_single_process,
    load_checkpoint,
    save_checkpoint,
    trained,
)

Load = Literal["broadcast", "distribute", "to_empty"]
LOADS: tuple[Load, ...] = ("broadcast", "distribute", "to_empty")
RECIPE = "adam"
SAVED_AFTER = 2

# Cells that take a model on meta: FSDP2 and TP shard it as it is; FSDP1 materializes it on
# the rank's device at wrapping (``to_empty``, then each module's ``reset_parameters``).
META_CELLS = tuple(sorted(name for name, cell in PARALLELISMS.items() if cell.builds_on_meta))


def _built_on_meta(cell: Parallelism, world: Any) -> nn.Module:
    """The matrix's model made on meta and wrapped by ``cell`` there (no device move)."""
    with torch.device("meta"):
        model = MODELS[cell.model_id].build()
    return cell.wrap(model, world)


def _load_full(
    model: nn.Module, cell: Parallelism, world: Any, load: Load
) -> torch.optim.Optimizer:
    """The single-process state after ``SAVED_AFTER`` steps into ``model``, then into an
    optimizer built on the loaded parameters: every rank given it (``distribute``: the part it
    holds, on a pipeline's stage), or rank 0 only and broadcast (``broadcast``: the whole)."""
    holds_it = load == "distribute" or world.rank == 0
    options = full_options(broadcast_from_rank0=load == "broadcast")
    truth = truth_of(cell, SAVED_AFTER, OPTIMIZERS[RECIPE], world.device)
    if load == "distribute":
        truth = truth.held_by(model)
    dsd.set_model_state_dict(model, truth.model if holds_it else {}, options=options)
    _assert_none_on_meta(model, world)
    _assert_each_piece_holds_its_share_alone(model, world)
    optimizer, _ = OPTIMIZERS[RECIPE].build(model)
    optim_state = truth.optimizer_state_dict if holds_it else {}
    dsd.set_optimizer_state_dict(model, optimizer, optim_state, options=options)
    return optimizer


def _load_checkpoint_after_to_empty(
    model: nn.Module, world: Any, path: str
) -> torch.optim.Optimizer:
    """``model`` materialized on the rank's device, an optimizer built on it, and both loaded
    from the DCP checkpoint at ``path``."""
    model.to_empty(device=world.device)
    optimizer, _ = OPTIMIZERS[RECIPE].build(model)
    load_checkpoint(model, optimizer, path)
    _assert_none_on_meta(model, world)
    return optimizer


def _assert_none_on_meta(model: nn.Module, world: Any) -> None:
    """Every tensor of the model's state dict (this rank's pieces) lies on the rank's device."""
    pieces = local_tensors_by_path(dsd.get_model_state_dict(model))
    elsewhere = sorted(f"{path} on {t.device}" for path, t in pieces if t.device != world.device)
    assert not elsewhere, f"rank {world.rank}: not on {world.device} after the load: {elsewhere}"


def _assert_each_piece_holds_its_share_alone(model: nn.Module, world: Any) -> None:
    """A sharded parameter's local tensor, loaded from a full state dict, lies in memory of
    its own no larger than the whole tensor: a view of the full tensor it was cut from would
    keep that whole tensor alive on every rank (the memory a big model's load must not take)."""
    kept_whole = []
    for name, param in model.named_parameters():
        if not isinstance(param, dtensor.DTensor) or not _split(param):
            continue
        local = param.to_local()
        whole = param.numel() * param.element_size()
        if local.numel() and local.untyped_storage().nbytes() >= whole:
            kept_whole.append(f"{name}: {local.untyped_storage().nbytes()} bytes for {whole}")
    assert not kept_whole, f"rank {world.rank}: pieces in storage of the whole: {kept_whole}"


def _split(param: Any) -> bool:
    """Whether ``param`` is cut into pieces over more than one rank."""
    mesh = param.device_mesh
    return any(
        isinstance(placement, dtensor.Shard) and mesh.size(dim) > 1
        for dim, placement in enumerate(param.placements)
    )


@pytest.mark.world(1, 2, 4, applies=exists_at_size("cell"))
@pytest.mark.parametrize("load", LOADS)
@pytest.mark.parametrize("cell", META_CELLS)
def test_a_model_built_on_meta_loads_and_trains_as_one_process(world, cell, load):
    parallelism = PARALLELISMS[cell]
    parallelism.skip_unless_runnable(world.device)
    path = str(world.tmp_path / "checkpoint")
    if load == "to_empty":
        model, optimizer, _ = trained(parallelism, world, RECIPE, SAVED_AFTER)
        save_checkpoint(model, optimizer, path)
    model = _built_on_meta(parallelism, world)
    if load == "to_empty":
        optimizer = _load_checkpoint_after_to_empty(model, world, path)
    else:
        optimizer = _load_full(model, parallelism, world, load)
    compared: dict[str, Any] = {"full_load": load != "to_empty", "model_id": parallelism.model_id}
    compared.update(comparison_tolerance(parallelism))
    assert_full_state_is_single_process((model, optimizer, None), SAVED_AFTER, RECIPE, **compared)
    train(model, optimizer, MORE_STEPS, start=SAVED_AFTER)
    assert_full_state_is_single_process(
        (model, optimizer, None), SAVED_AFTER + MORE_STEPS, RECIPE, **compared
    )
