"""FSDP1's optimizer state dicts against the oracle of ``fsdp/_optim_utils.py``.

The checks run on every FSDP1 cell (each strategy, with and without ``use_orig_params``, flat
and nested wrapping) and every optimizer that applies to it. Every optimizer runs at the
cell's smallest world size; Adam runs at 4 ranks as well. After two training steps:

- ``FSDP.optim_state_dict`` under the FULL (every rank, rank 0 only, offloaded) and SHARDED
  optimizer configs equals ``reference_impl.fsdp_optim_state_dict`` on the same instance. It
  is compared key by key and shard by shard.
- The oracle's gathered state equals the single-process Adam state.
- ``FSDP.optim_state_dict_to_load`` equals the oracle's on the same saved state (full and
  sharded). An optimizer loaded from the oracle's conversion gives back exactly the state that
  was saved.
- No two state tensors of one rank's result may share memory (every cell by config): an
  optimizer that loads them updates each in place.
- The older DCP flow: SHARDED model and optimizer state saved by ``dcp.save`` (locally and
  through fsspec), the optimizer's read back by ``load_sharded_optimizer_state_dict`` and
  converted by ``FSDP.optim_state_dict_to_load``, on every FSDP1 cell and FSDP1 + TP: the
  fresh optimizer holds the saved state.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

import reference_impl as ri
from conformance._upstream import dcp, dcp_fsspec, dcp_optimizer, fsdp
from conformance.cells import PARALLELISMS, exists_at_size, first_size_only
from conformance.compare import (
    assert_no_state_tensors_overlap,
    assert_state_dict_equal,
    assert_trees_identical,
)
from conformance.models.common import ground_truth, seeded_mlp, train
from conformance.models.optimizers import OPTIMIZERS
from conformance.training import (
    FSDP1_CELLS,
    OPTIM_ORACLE_OPTIONS,
    state_names_sorted,
    torch_model_load,
    torch_model_state_dict,
    under_optim_settings,
)


def _trained(world: Any, name: str, recipe: str) -> tuple[Any, Any]:
    """The cell's model and optimizer after two steps; Adam runs at every size, others once."""
    cell = PARALLELISMS[name]
    cell.require(world.size)
    OPTIMIZERS[recipe].skip_unless_applies(cell)
    model = cell.parallelise(seeded_mlp(), world)
    optimizer, scheduler = OPTIMIZERS[recipe].build(model)
    train(model, optimizer, 2, scheduler)
    return model, optimizer


@pytest.mark.world(2, 4, applies=first_size_only(every_size_if={"recipe": "adam"}))
@pytest.mark.parametrize("config", sorted(OPTIM_ORACLE_OPTIONS))
@pytest.mark.parametrize("recipe", sorted(OPTIMIZERS))
@pytest.mark.parametrize("name", FSDP1_CELLS)
def test_optim_state_dict_matches_the_oracle(world, name, recipe, config):
    model, optimizer = _trained(world, name, recipe)
    save = fsdp.FullyShardedDataParallel.optim_state_dict
    theirs = under_optim_settings(model, config, lambda: save(model, optimizer))
    ours = ri.fsdp_optim_state_dict(model, optimizer, **OPTIM_ORACLE_OPTIONS[config])
    assert_trees_identical(theirs, ours)


@pytest.mark.world(2, 4, applies=first_size_only())
@pytest.mark.parametrize("config", sorted(OPTIM_ORACLE_OPTIONS))
@pytest.mark.parametrize("name", FSDP1_CELLS)
def test_no_two_state_tensors_share_memory(world, name, config):
    """Loaded into an optimizer over separate parameters (``use_orig_params``, another
    wrapping, no FSDP), every state tensor is updated in place: none may alias another.
    Each cell runs at its smallest world size."""
    model, optimizer = _trained(world, name, "adam")
    save = fsdp.FullyShardedDataParallel.optim_state_dict
    theirs = under_optim_settings(model, config, lambda: save(model, optimizer))
    assert_no_state_tensors_overlap(theirs.get("state", {}))  # rank0_only: {} on other ranks


@pytest.mark.world(2, 4, applies=exists_at_size())
@pytest.mark.parametrize("name", FSDP1_CELLS)
def test_the_oracles_full_state_equals_the_single_process_state(world, name):
    """The oracle on its own: gathered FSDP1 state is the single-process Adam state, exactly."""
    PARALLELISMS[name].require(world.size)
    model = PARALLELISMS[name].parallelise(seeded_mlp(), world)
    optimizer, _ = OPTIMIZERS["adam"].build(model)
    train(model, optimizer, 2)
    truth = ground_truth(steps=2, recipe=OPTIMIZERS["adam"], device=world.device)
    ours = ri.fsdp_optim_state_dict(model, optimizer, cpu_offload=True)
    assert_state_dict_equal(ours["state"], truth.optimizer_state)
    assert_no_state_tensors_overlap(ours["state"])
    assert [g["params"] for g in ours["param_groups"]] == [g["params"] for g in truth.param_groups]


@pytest.mark.world(2, 4, applies=first_size_only(every_size_if={"recipe": "adam"}))
@pytest.mark.parametrize("config", ["full", "sharded"])
@pytest.mark.parametrize("recipe", sorted(OPTIMIZERS))
@pytest.mark.parametrize("name", FSDP1_CELLS)
def test_optim_state_dict_to_load_matches_the_oracle(world, name, recipe, config):
    """Convert the same saved state for loading, by torch and by the oracle, then load and train.

    Both conversions must be identical, and an optimizer loaded from the
    oracle's must hold the state that was saved.
    """
    model, optimizer = _trained(world, name, recipe)
    saved = ri.fsdp_optim_state_dict(model, optimizer, **OPTIM_ORACLE_OPTIONS[config])
    to_load = fsdp.FullyShardedDataParallel.optim_state_dict_to_load
    theirs = under_optim_settings(
        model, config, lambda: to_load(model, optimizer, copy.deepcopy(saved))
    )
    fresh, _ = OPTIMIZERS[recipe].build(model)
    ours = ri.fsdp_optim_state_dict_to_load(model, fresh, copy.deepcopy(saved))
    assert_trees_identical(state_names_sorted(theirs), ours)
    fresh.load_state_dict(ours)
    assert_trees_identical(
        ri.fsdp_optim_state_dict(model, fresh, **OPTIM_ORACLE_OPTIONS[config]), saved
    )


def _saved_flat_adam(world: Any) -> tuple[Any, Any, dict[str, Any]]:
    model = PARALLELISMS["fsdp1_full_shard_flat"].parallelise(seeded_mlp(), world)
    optimizer, _ = OPTIMIZERS["adam"].build(model)
    train(model, optimizer, 1)
    return model, optimizer, ri.fsdp_optim_state_dict(model, optimizer)


@pytest.mark.world(2)
def test_the_oracle_names_the_parameter_whose_state_has_the_wrong_shape(world):
    model, optimizer, saved = _saved_flat_adam(world)
    saved["state"]["fc2.weight"]["exp_avg"] = saved["state"]["fc2.weight"]["exp_avg"].t()
    with pytest.raises(ValueError, match=r"fc2\.weight\.exp_avg: shape \[10, 5\], the parameter"):
        ri.fsdp_optim_state_dict_to_load(model, optimizer, saved)


@pytest.mark.world(2)
def test_the_oracle_refuses_originals_of_one_flat_parameter_at_different_steps(world):
    model, optimizer, saved = _saved_flat_adam(world)
    saved["state"]["fc1.bias"]["step"] = saved["state"]["fc1.bias"]["step"] + 1
    with pytest.raises(ValueError, match=r"'fc1\.bias'.*step must be one zero-dim value"):
        ri.fsdp_optim_state_dict_to_load(model, optimizer, saved)


LEGACY_STORES = ("local", "fsspec")


@pytest.mark.world(2, 4, applies=exists_at_size())
@pytest.mark.parametrize("store", LEGACY_STORES)
@pytest.mark.parametrize("name", FSDP1_CELLS)
def test_the_legacy_sharded_optimizer_loader_restores_the_saved_state(world, name, store):
    """Upstream's older DCP flow for FSDP1 (and FSDP1 + TP): SHARDED model state and
    ``FSDP.optim_state_dict`` saved by ``dcp.save``; a fresh model loads its state by
    ``dcp.load``, its optimizer state by ``load_sharded_optimizer_state_dict`` and
    ``FSDP.optim_state_dict_to_load``. Through ``FileSystemWriter`` and through fsspec's
    writer and reader (``file://``), the fresh optimizer holds the saved state."""
    model, optimizer = _trained(world, name, "adam")
    save = fsdp.FullyShardedDataParallel.optim_state_dict
    path = world.tmp_path / "legacy"
    writer, reader = _legacy_storage(store, path)
    state = {
        "model": torch_model_state_dict(model, "sharded", world.device),
        "optim": under_optim_settings(model, "sharded", lambda: save(model, optimizer)),
    }
    dcp.save(state, storage_writer=writer)
    expected = ri.fsdp_optim_state_dict(model, optimizer)
    fresh = PARALLELISMS[name].parallelise(seeded_mlp(), world)
    fresh_optimizer, _ = OPTIMIZERS["adam"].build(fresh)
    template = {"model": torch_model_state_dict(fresh, "sharded", world.device)}
    dcp.load(template, storage_reader=reader)
    torch_model_load(fresh, template["model"], "sharded")
    loaded = dcp_optimizer.load_sharded_optimizer_state_dict(
        model_state_dict=template["model"], optimizer_key="optim", storage_reader=reader
    )
    to_load = under_optim_settings(
        fresh,
        "sharded",
        lambda: fsdp.FullyShardedDataParallel.optim_state_dict_to_load(
            fresh, fresh_optimizer, loaded["optim"]
        ),
    )
    fresh_optimizer.load_state_dict(to_load)
    assert_trees_identical(
        _groups_keys_sorted(state_names_sorted(ri.fsdp_optim_state_dict(fresh, fresh_optimizer))),
        _groups_keys_sorted(state_names_sorted(expected)),
    )


def _groups_keys_sorted(optim_state_dict: dict[str, Any]) -> dict[str, Any]:
    """Each param group's entries in name order: a loaded group's order is no contract."""
    groups = [dict(sorted(group.items())) for group in optim_state_dict["param_groups"]]
    return {**optim_state_dict, "param_groups": groups}


def _legacy_storage(store: str, path: Any) -> tuple[Any, Any]:
    if store == "local":
        return dcp.FileSystemWriter(str(path)), dcp.FileSystemReader(str(path))
    url = f"file://{path}"
    return dcp_fsspec.FsspecWriter(url), dcp_fsspec.FsspecReader(url)
