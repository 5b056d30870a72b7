"""FSDP1 state saved by one wrapping and loaded into another, or at half the world size.

A checkpoint outlives its job's layout: the next job may wrap the model
differently (nested or flat, another strategy, with or without
``use_orig_params``) or run on fewer ranks. After two Adam steps the saving
cell's model and optimizer state go through the oracle. The loading cell
converts the optimizer state by torch's ``FSDP.optim_state_dict_to_load``
and by the oracle, with identical results. It loads the oracle's, trains a
third step, and must then hold exactly what a single process holds after three.
"""

from __future__ import annotations

import copy

import pytest

import reference_impl as ri
from conformance._upstream import fsdp
from conformance.cells import PARALLELISMS, SubWorld, exists_at_size, reshards
from conformance.compare import assert_state_dict_equal, assert_trees_identical
from conformance.models.common import ground_truth, seeded_mlp, train
from conformance.models.optimizers import OPTIMIZERS
from conformance.training import optim_settings, state_names_sorted, under_optim_settings

STEPS = 2

# (saved by, loaded by): every pair changes the wrapping, the strategy or use_orig_params.
PAIRS = [(saved_by, loaded_by) for saved_by, loaded_by, _ in reshards("fsdp1")]


@pytest.mark.world(2, 4, applies=exists_at_size("saved_by"))
@pytest.mark.parametrize("ranks", ["same_ranks", "half_the_ranks"])
@pytest.mark.parametrize("kind", ["full", "sharded"])
@pytest.mark.parametrize(("saved_by", "loaded_by"), PAIRS, ids=[f"{s}-to-{t}" for s, t in PAIRS])
def test_load_into_another_wrapping_and_train_on(world, saved_by, loaded_by, kind, ranks):
    if kind == "sharded" and ranks == "half_the_ranks":
        pytest.skip("a sharded state dict's shards belong to the ranks that saved it")
    if kind == "sharded" and "no_shard" in saved_by:
        pytest.skip("NO_SHARD gives a full model state dict for SHARDED_STATE_DICT")
    model = PARALLELISMS[saved_by].parallelise(seeded_mlp(), world)
    optimizer, _ = OPTIMIZERS["adam"].build(model)
    train(model, optimizer, STEPS)
    model_type = optim_settings(kind)[0]
    saved_model = ri.fsdp_state_dict(model, model_type)
    saved_optim = ri.fsdp_optim_state_dict(model, optimizer, shard_state=kind == "sharded")
    loaders = SubWorld(world, world.size // 2 if ranks == "half_the_ranks" else world.size)
    if loaders.member:
        group = loaders.group
        target = PARALLELISMS[loaded_by].parallelise(seeded_mlp(), loaders)
        ri.fsdp_load_state_dict(target, copy.deepcopy(saved_model), model_type, group=group)
        target_optimizer, _ = OPTIMIZERS["adam"].build(target)
        to_load = fsdp.FullyShardedDataParallel.optim_state_dict_to_load
        theirs = under_optim_settings(
            target, kind, lambda: to_load(target, target_optimizer, copy.deepcopy(saved_optim))
        )
        ours = ri.fsdp_optim_state_dict_to_load(target, target_optimizer, saved_optim)
        assert_trees_identical(state_names_sorted(theirs), ours)
        target_optimizer.load_state_dict(ours)
        train(target, target_optimizer, 1, start=STEPS)
        truth = ground_truth(STEPS + 1, OPTIMIZERS["adam"], device=world.device)
        after = ri.fsdp_optim_state_dict(target, target_optimizer, group=group)
        assert_state_dict_equal(after["state"], truth.optimizer_state)
        assert_state_dict_equal(ri.fsdp_state_dict(target), truth.model)
    world.barrier()
