"""The matrix's models beyond the plain MLP, across the parallelisms.

The models:

- tied embeddings (one parameter, two FQNs);
- frozen parameters (``fc1`` frozen);
- extra state (``get_extra_state``);
- a small transformer (``conformance/models/transformer.py``): two blocks of causal attention
  and a feed-forward layer whose width 10 splits unevenly, layer norms, Megatron-style TP plan;
- the MLP and transformer under activation checkpointing (``*_checkpointed``);
- the MLP and transformer under ``torch.compile`` with the eager backend, the whole wrapped
  model (``*_compiled``) or each unit before the wrapping, as recipes compile blocks
  (``*_compiled_blocks``).

Each model runs in ``ddp``, FSDP1 (FULL_SHARD orig/flat nested, SHARD_GRAD_OP flat,
HYBRID_SHARD orig nested), ``fsdp2``, ``fsdp2_keep_unsharded``, ``hsdp2``, ``tp`` and
``fsdp2_tp``, where the model allows it. Where it does not, the skip gives the reason: no TP
plan, or frozen and trainable parameters in one flat parameter. Each cell runs at the smallest
world size it has above one rank. There each wrapped model must give the single-process state
dicts, agree with the oracle, and load back what it saved:

- full state dicts equal the single-process ones;
- torch's and the oracle's get agree (sharded, full, ``ignore_frozen_params``);
- torch's set loads back what torch's get saved after one more step.

The frozen model also runs upstream's fine-tuning flow: saved without its frozen layer
(``ignore_frozen_params``), loaded with ``strict=False`` into fresh objects that must then hold
the saved run's full state.

Tensor-parallel cells compare within the tolerances of ``comparison_tolerance``; every other
cell is exact. Every model is also saved through DCP at 4 ranks (FSDP2, HSDP2). It is loaded
at 2 ranks (FSDP1 FULL_SHARD orig nested, DDP) and at 1 (rank 0 alone), and the full state is
the saved one.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

import reference_impl as ri
from conformance._upstream import dcp, dsd
from conformance.cells import (
    PARALLELISMS,
    Parallelism,
    SubWorld,
    comparison_tolerance,
    first_size_only,
    reshards,
    with_role,
)
from conformance.compare import assert_state_dict_equal, assert_trees_identical
from conformance.models.optimizers import adam
from conformance.models.zoo import MODELS, TRAIN_STEPS, ModelRecipe
from conformance.training import load_checkpoint, load_options_for, save_checkpoint

CELLS = with_role("zoo")
# The plain MLP: the main matrix.
MODEL_IDS = tuple(name for name in MODELS if name != "mlp")
OPTION_SETS = {
    "sharded": {},
    "full": {"full_state_dict": True},
    "no_frozen": {"ignore_frozen_params": True},
}
FULL = ri.StateDictOptions(full_state_dict=True)


def _trained(
    recipe: ModelRecipe, cell: Parallelism, world: Any
) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The model in ``cell``, trained ``TRAIN_STEPS`` Adam steps; skips where it cannot run."""
    cell.require(world.size)
    reason = recipe.unsupported(cell)
    if reason is not None:
        pytest.skip(reason)
    model = recipe.make(cell, world)
    optimizer = adam(model)
    recipe.train(model, optimizer, TRAIN_STEPS)
    return model, optimizer


@pytest.mark.world(2, 4, 8, applies=first_size_only("cell"))
@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("model_id", MODEL_IDS)
def test_model_state_equals_single_process(world, model_id, cell):
    recipe, parallelism = MODELS[model_id], PARALLELISMS[cell]
    model, optimizer = _trained(recipe, parallelism, world)
    expected = recipe.ground_truth(TRAIN_STEPS, world.device)
    tolerance = comparison_tolerance(parallelism)
    get_model = dsd.get_model_state_dict
    get_optimizer = dsd.get_optimizer_state_dict
    theirs = dsd.StateDictOptions(full_state_dict=True)
    assert_state_dict_equal(get_model(model, options=theirs), expected.model, **tolerance)
    actual = get_optimizer(model, optimizer, options=theirs)
    assert_state_dict_equal(actual["state"], expected.optimizer_state, **tolerance)


@pytest.mark.world(2, 4, 8, applies=first_size_only("cell"))
@pytest.mark.parametrize("options", sorted(OPTION_SETS))
@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("model_id", MODEL_IDS)
def test_model_get_state_dict_matches_the_oracle(world, model_id, cell, options):
    model, optimizer = _trained(MODELS[model_id], PARALLELISMS[cell], world)
    theirs = dsd.StateDictOptions(**OPTION_SETS[options])
    ours = ri.StateDictOptions(**OPTION_SETS[options])
    assert_trees_identical(
        dsd.get_model_state_dict(model, options=theirs),
        ri.get_model_state_dict(model, options=ours),
    )
    assert_trees_identical(
        dsd.get_optimizer_state_dict(model, optimizer, options=theirs),
        ri.get_optimizer_state_dict(model, optimizer, options=ours),
    )


@pytest.mark.world(2, 4, 8, applies=first_size_only("cell"))
@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("model_id", MODEL_IDS)
def test_model_load_restores_what_was_saved(world, model_id, cell):
    """torch's get, one more step, torch's set: the full state dicts are back as saved."""
    recipe = MODELS[model_id]
    model, optimizer = _trained(recipe, PARALLELISMS[cell], world)
    model_state, optim_state = copy.deepcopy(dsd.get_state_dict(model, optimizer))
    expected = copy.deepcopy(ri.get_state_dict(model, optimizer, options=FULL))
    recipe.train(model, optimizer, 1)
    dsd.set_state_dict(model, optimizer, model_state_dict=model_state, optim_state_dict=optim_state)
    actual = ri.get_state_dict(model, optimizer, options=FULL)
    assert_state_dict_equal(actual[0], expected[0])
    assert_state_dict_equal(actual[1]["state"], expected[1]["state"])


# Saved at 4 ranks by the first, loaded by the second at the given size ("single": one
# process without a parallelism). FSDP1 is no saver here: at 4 ranks it leaves a rank
# without a shard of some parameters, which DCP cannot load (see the 2.13.0 manifest).
DCP_RESHARDS = reshards("zoo")


def _loaded_from_checkpoint(
    recipe: ModelRecipe, loaded_by: str, loaders: SubWorld, path: str, load: dict[str, Any]
) -> tuple[Any, Any]:
    """A fresh model under ``loaded_by`` in the ``loaders``' ranks, loaded by DCP (``load``
    goes to ``dcp.load``) and ``set_state_dict`` from ``path``: its full model and optimizer
    state dicts."""
    model = (
        recipe.build().to(loaders.device)
        if loaded_by == "single"
        else recipe.make(PARALLELISMS[loaded_by], loaders)
    )
    optimizer = adam(model)
    load_checkpoint(model, optimizer, path, **load)
    return ri.get_state_dict(model, optimizer, options=FULL)


@pytest.mark.world(4)
@pytest.mark.parametrize(("saved_by", "loaded_by", "load_size"), DCP_RESHARDS)
@pytest.mark.parametrize("model_id", MODEL_IDS)
def test_model_dcp_resharding_keeps_every_value(world, model_id, saved_by, loaded_by, load_size):
    """Save through ``torch.distributed.checkpoint`` at 4 ranks, load at fewer under another
    parallelism: the full model and optimizer state are the saved ones."""
    recipe = MODELS[model_id]
    cells = [PARALLELISMS[name] for name in (saved_by, loaded_by) if name in PARALLELISMS]
    for cell in cells:
        cell.skip_unless_runnable(world.device)
        reason = recipe.unsupported(cell)
        if reason is not None:
            pytest.skip(reason)
    model = recipe.make(PARALLELISMS[saved_by], world)
    optimizer = adam(model)
    recipe.train(model, optimizer, TRAIN_STEPS)
    path = str(world.tmp_path / "checkpoint")
    save_checkpoint(model, optimizer, path)
    saved = copy.deepcopy(ri.get_state_dict(model, optimizer, options=FULL))
    world.barrier()
    loaders = SubWorld(world, load_size)
    load = load_options_for(loaders)
    try:  # every rank meets at the end, also when the loading ranks fail
        if loaders.member:
            loaded = _loaded_from_checkpoint(recipe, loaded_by, loaders, path, load)
            tolerance = comparison_tolerance(*cells)
            assert_state_dict_equal(loaded[0], saved[0], **tolerance)
            assert_state_dict_equal(loaded[1]["state"], saved[1]["state"], **tolerance)
    finally:
        world.barrier()


FINE_TUNING = ri.StateDictOptions(ignore_frozen_params=True)


@pytest.mark.world(2, 4, 8, applies=first_size_only("cell"))
@pytest.mark.parametrize("cell", CELLS)
def test_a_fine_tuning_checkpoint_without_its_frozen_layer_resumes(world, cell):
    """Upstream's fine-tuning flow on the frozen model: its state saved without the frozen
    ``fc1`` (``ignore_frozen_params``), loaded into fresh objects through a template of the
    same options and ``set_state_dict(strict=False)``. The checkpoint holds no ``fc1`` key,
    and the fresh objects hold the saved run's full state (``fc1`` as its seed gave it)."""
    recipe = MODELS["frozen"]
    model, optimizer = _trained(recipe, PARALLELISMS[cell], world)
    theirs = dsd.StateDictOptions(ignore_frozen_params=True)
    model_state, optim_state = dsd.get_state_dict(model, optimizer, options=theirs)
    path = str(world.tmp_path / "fine-tuned")
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=path)
    saved = copy.deepcopy(ri.get_state_dict(model, optimizer, options=FULL))
    world.barrier()
    stored = sorted(dcp.FileSystemReader(path).read_metadata().state_dict_metadata)
    frozen = [key for key in stored if key.startswith("model.fc1.")]
    assert not frozen, f"rank {world.rank}: the checkpoint holds frozen keys {frozen}"

    fresh = recipe.make(PARALLELISMS[cell], world)
    fresh_optimizer = adam(fresh)
    recipe.train(fresh, fresh_optimizer, 1)  # optimizer state for the template to hold
    model_template, optim_template = dsd.get_state_dict(fresh, fresh_optimizer, options=theirs)
    template = {"model": model_template, "optim": optim_template}
    dcp.load(template, checkpoint_id=path)
    dsd.set_state_dict(
        fresh,
        fresh_optimizer,
        model_state_dict=template["model"],
        optim_state_dict=template["optim"],
        options=dsd.StateDictOptions(strict=False),
    )
    resumed = ri.get_state_dict(fresh, fresh_optimizer, options=FULL)
    assert_state_dict_equal(resumed[0], saved[0])
    assert_state_dict_equal(resumed[1]["state"], saved[1]["state"])
