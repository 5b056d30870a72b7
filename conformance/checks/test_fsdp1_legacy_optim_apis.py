"""FSDP1's older optimizer state-dict APIs against the oracle of ``fsdp/_optim_utils.py``.

``full_optim_state_dict``, ``sharded_optim_state_dict``,
``shard_full_optim_state_dict``, ``flatten_sharded_optim_state_dict``,
``scatter_full_optim_state_dict`` and ``rekey_optim_state_dict`` still
exist in torch; forks keep them for older checkpoints. Each is run on every
FSDP1 cell after two Adam steps and must equal the oracle on the same
instance; an API missing from the build is a skip that names it.

In detail, on every FSDP1 cell at 2 and 4 ranks:

- ``full_optim_state_dict`` (every rank, rank 0 only) and ``sharded_optim_state_dict``
  against the oracle;
- the ``shard_full_``, ``scatter_full_`` (rank 0 alone passes the state) and
  ``flatten_sharded_optim_state_dict`` conversions against the oracle's, then loaded back;
- ``rekey_optim_state_dict`` to parameter IDs: the result loads into an unwrapped model's Adam
  as the single-process state, with one param group and with per-layer groups around an
  empty one (original-parameter cells);
- ``rekey_optim_state_dict`` to names: the result, then sharded, equals the cell's own
  optimizer state;
- both ways for an optimizer not stepped yet, whose param groups need re-keying all the same.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

import reference_impl as ri
from conformance._upstream import fsdp
from conformance.cells import PARALLELISMS, exists_at_size
from conformance.compare import assert_state_dict_equal, assert_trees_identical
from conformance.models.common import ground_truth, seeded_mlp, train
from conformance.models.optimizers import OPTIMIZERS
from conformance.training import FSDP1_CELLS, fsdp1_api, state_names_sorted

STEPS = 2


def _trained(
    world: Any, name: str, recipe: str = "adam"
) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    PARALLELISMS[name].require(world.size)
    OPTIMIZERS[recipe].skip_unless_applies(PARALLELISMS[name])
    model = PARALLELISMS[name].parallelise(seeded_mlp(), world)
    optimizer, _ = OPTIMIZERS[recipe].build(model)
    train(model, optimizer, STEPS)
    return model, optimizer


# The legacy save APIs and the oracle options that model them: both offload by default.
SAVES: dict[str, tuple[str, dict[str, Any], dict[str, bool]]] = {
    "full_optim_state_dict": ("full_optim_state_dict", {"rank0_only": False}, {}),
    "full_optim_state_dict_rank0_only": ("full_optim_state_dict", {}, {"rank0_only": True}),
    "sharded_optim_state_dict": (
        "sharded_optim_state_dict",
        {},
        {"shard_state": True, "use_dtensor": False},  # no state_dict_type sets up DTensors
    ),
}


@pytest.mark.world(2, 4, applies=exists_at_size())
@pytest.mark.parametrize("api", sorted(SAVES))
@pytest.mark.parametrize("name", FSDP1_CELLS)
def test_legacy_save_matches_the_oracle(world, name, api):
    model, optimizer = _trained(world, name)
    function, kwargs, options = SAVES[api]
    theirs = fsdp1_api(function)(model, optimizer, **kwargs)
    ours = ri.fsdp_optim_state_dict(model, optimizer, cpu_offload=True, **options)
    assert_trees_identical(theirs, ours)


# The legacy load APIs: what each converts (the oracle's full or sharded dict) and how.
LOADS = {
    "shard_full_optim_state_dict": ({}, False),
    "scatter_full_optim_state_dict": ({}, True),
    "flatten_sharded_optim_state_dict": ({"shard_state": True}, False),
}


def _legacy_load(api: str, saved: Any, model: Any, optimizer: Any, rank: int) -> Any:
    function = fsdp1_api(api)
    if api == "scatter_full_optim_state_dict":
        return function(saved if rank == 0 else None, model, optim=optimizer)
    return function(saved, model, optim=optimizer)


@pytest.mark.world(2, 4, applies=exists_at_size())
@pytest.mark.parametrize("api", sorted(LOADS))
@pytest.mark.parametrize("name", FSDP1_CELLS)
def test_legacy_load_matches_the_oracle(world, name, api):
    """Convert the oracle's saved state by the legacy API and by the oracle, then load it.

    Both conversions must be identical (for ``scatter``, only rank 0 passes
    the saved state), and the optimizer loaded from the oracle's must hold
    exactly the state that was saved.
    """
    model, optimizer = _trained(world, name)
    save_options, rank0_only = LOADS[api]
    saved = ri.fsdp_optim_state_dict(model, optimizer, **save_options)
    theirs = _legacy_load(api, copy.deepcopy(saved), model, optimizer, world.rank)
    given = copy.deepcopy(saved) if world.rank == 0 or not rank0_only else None
    ours = ri.fsdp_optim_state_dict_to_load(model, optimizer, given, rank0_only=rank0_only)
    assert_trees_identical(state_names_sorted(theirs), ours)
    fresh, _ = OPTIMIZERS["adam"].build(model)
    fresh.load_state_dict(ours)
    assert_trees_identical(ri.fsdp_optim_state_dict(model, fresh, **save_options), saved)


def _single_process(
    device: torch.device, recipe: str = "adam"
) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The MLP and ``recipe``'s optimizer trained alone on ``device`` (the world's: see
    ``ground_truth``)."""
    model = seeded_mlp().to(device)
    optimizer, _ = OPTIMIZERS[recipe].build(model)
    train(model, optimizer, STEPS)
    return model, optimizer


@pytest.mark.world(2, 4, applies=exists_at_size())
@pytest.mark.parametrize("recipe", ["adam", "adam_groups"])
@pytest.mark.parametrize("given", ["full", "sharded"])
@pytest.mark.parametrize("name", FSDP1_CELLS)
def test_rekey_to_ids_matches_the_oracle(world, name, given, recipe):
    """FQN-keyed state re-keyed to IDs for an unwrapped model loads into its optimizer as is;
    ``sharded_optim_state_dict``'s state (ShardedTensors) re-keys to the same, once gathered.

    The oracle re-keys the same way whether it is given the unwrapped model
    or the wrapped one with its own optimizer.
    """
    model, optimizer = _trained(world, name, recipe)
    full = ri.fsdp_optim_state_dict(model, optimizer)
    plain, plain_optimizer = _single_process(world.device, recipe)
    rekey = fsdp1_api("rekey_optim_state_dict")
    source = full
    if given == "sharded":
        source = fsdp1_api("sharded_optim_state_dict")(model, optimizer)
    theirs = rekey(source, fsdp.OptimStateKeyType.PARAM_ID, plain, optim=plain_optimizer)
    ours = ri.fsdp_rekey_optim_state_dict(
        full, fsdp.OptimStateKeyType.PARAM_ID, plain, plain_optimizer
    )
    assert_trees_identical(ri.gather_state_dict(theirs), ours)
    by_wrapped = ri.fsdp_rekey_optim_state_dict(
        full, fsdp.OptimStateKeyType.PARAM_ID, model, optimizer
    )
    assert_trees_identical(by_wrapped, ours)
    fresh, _ = OPTIMIZERS[recipe].build(plain)
    fresh.load_state_dict(ours)
    truth = ground_truth(STEPS, OPTIMIZERS[recipe], device=world.device)
    names = {param: fqn for fqn, param in plain.named_parameters()}
    assert_state_dict_equal({names[p]: s for p, s in fresh.state.items()}, truth.optimizer_state)


@pytest.mark.world(2, 4, applies=exists_at_size())
@pytest.mark.parametrize("name", FSDP1_CELLS)
def test_rekey_to_names_then_shard_matches_the_oracle(world, name):
    """An unwrapped model's ID-keyed state, re-keyed to FQNs and sharded for an FSDP1 model,
    is exactly what that model's own optimizer holds after the same training."""
    model, optimizer = _trained(world, name)
    plain, plain_optimizer = _single_process(world.device)
    saved = plain_optimizer.state_dict()
    rekey = fsdp1_api("rekey_optim_state_dict")
    theirs = rekey(saved, fsdp.OptimStateKeyType.PARAM_NAME, plain, optim=plain_optimizer)
    ours = ri.fsdp_rekey_optim_state_dict(
        saved, fsdp.OptimStateKeyType.PARAM_NAME, plain, plain_optimizer
    )
    assert_trees_identical(theirs, ours)
    sharded = fsdp1_api("shard_full_optim_state_dict")(
        copy.deepcopy(theirs), model, optim=optimizer
    )
    our_sharded = ri.fsdp_optim_state_dict_to_load(model, optimizer, copy.deepcopy(ours))
    assert_trees_identical(state_names_sorted(sharded), our_sharded)
    assert_trees_identical(our_sharded, state_names_sorted(optimizer.state_dict()))


@pytest.mark.world(2)
@pytest.mark.parametrize("to", ["names", "ids"])
def test_rekey_of_an_optimizer_not_stepped_yet(world, to):
    """An optimizer not stepped yet has no state, but its param groups still need re-keying:
    to names, so the dict shards for an FSDP1 model's optimizer; to IDs, so it is again what
    the plain optimizer saved."""
    plain = seeded_mlp()
    plain_optimizer, _ = OPTIMIZERS["adam_groups"].build(plain)
    by_ids = plain_optimizer.state_dict()
    assert not by_ids["state"]
    names = {param: fqn for fqn, param in plain.named_parameters()}
    by_names = ri.fsdp_rekey_optim_state_dict(
        by_ids, fsdp.OptimStateKeyType.PARAM_NAME, plain, plain_optimizer
    )
    assert [group["params"] for group in by_names["param_groups"]] == [
        sorted(names[param] for param in group["params"]) for group in plain_optimizer.param_groups
    ]
    assert_trees_identical(
        ri.fsdp_rekey_optim_state_dict(
            by_names, fsdp.OptimStateKeyType.PARAM_ID, plain, plain_optimizer
        ),
        by_ids,
    )
    rekey = fsdp1_api("rekey_optim_state_dict")
    given, key_type, expected = {
        "names": (by_ids, fsdp.OptimStateKeyType.PARAM_NAME, by_names),
        "ids": (by_names, fsdp.OptimStateKeyType.PARAM_ID, by_ids),
    }[to]
    theirs = rekey(copy.deepcopy(given), key_type, plain, optim=plain_optimizer)
    assert_trees_identical(theirs, expected)
    if to == "names":
        model = PARALLELISMS["fsdp1_full_shard_orig"].parallelise(seeded_mlp(), world)
        optimizer, _ = OPTIMIZERS["adam_groups"].build(model)
        sharded = fsdp1_api("shard_full_optim_state_dict")(theirs, model, optim=optimizer)
        assert_trees_identical(sharded, optimizer.state_dict())
