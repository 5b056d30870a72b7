"""Compiled models keep canonical state dicts, load back what they gave, and resume as one
process generation after generation.

Recipes compile a model's blocks before FSDP wraps them, or the wrapped model whole. The
zoo's ``*_compiled`` (the wrapped model compiled) and ``*_compiled_blocks`` (each unit
compiled in its place, then wrapped) variants of the MLP and the transformer run here on the
golden cell of each family that trains the MLP, at its first size. Compilation uses the
eager backend, which traces as any backend does and runs on every CPU build.
``test_model_matrix.py`` judges the same variants on the zoo's cells against the oracle.

- **Canonical and the identity.** ``get_state_dict`` gives the single-process names (no
  ``_orig_mod.``): the model's keys, the optimizer state's keys and each param group's
  parameters; setting what it gave and getting again gives it back, bit for bit.
- **Three generations.** A step, a DCP save; then three times: fresh compiled objects load
  the last checkpoint, train a step and save. The last generation's full state equals one
  process's after four steps (TP cells within their tolerances).
- **Safetensors.** Rank 0 saves the full model state through ``HuggingFaceStorageWriter``;
  the file holds it, and fresh compiled objects load it back exactly (on the cells whose
  ranks hold the whole model).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from conformance._upstream import dcp, dsd, full_options
from conformance.cells import (
    DEFAULT_MODEL,
    PARALLELISMS,
    comparison_tolerance,
    first_size_only,
    with_role,
)
from conformance.compare import assert_state_dict_equal, assert_trees_identical
from conformance.models.common import train
from conformance.models.zoo import MODELS
from conformance.training import (
    assert_full_state_is_single_process,
    fresh_training,
    load_checkpoint,
    save_checkpoint,
)

MODEL_IDS = sorted(name for name in MODELS if MODELS[name].variant.startswith("compiled"))
CELLS = [name for name in with_role("golden") if PARALLELISMS[name].model_id == DEFAULT_MODEL]
WHOLE_CELLS = [name for name in CELLS if not PARALLELISMS[name].partial]  # one file holds all
RECIPE = "adam"
GENERATIONS = 3


def _fresh(world: Any, cell: str, model_id: str) -> tuple[torch.nn.Module, Any]:
    """Fresh compiled objects of ``model_id`` in ``cell``; skips where the variant is not
    built there."""
    parallelism = PARALLELISMS[cell]
    parallelism.skip_unless_runnable(world.device)
    reason = MODELS[model_id].unsupported(parallelism)
    if reason is not None:
        pytest.skip(reason)
    model, optimizer, _ = fresh_training(parallelism, world, RECIPE, model_id)
    return model, optimizer


def _step(model: torch.nn.Module, optimizer: Any, model_id: str, at: int) -> None:
    train(model, optimizer, 1, start=at, inputs=MODELS[model_id].inputs)


def _names(
    model_state: dict[str, Any], optimizer_state: dict[str, Any], param_groups: list[Any]
) -> dict[str, list[Any]]:
    """The names state dicts give: the model's keys, the optimizer state's keys and each
    param group's parameters."""
    return {
        "model": sorted(model_state),
        "optimizer state": sorted(optimizer_state),
        "param groups": [sorted(group["params"]) for group in param_groups],
    }


@pytest.mark.world(2, 4, applies=first_size_only("cell"))
@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("model_id", MODEL_IDS)
def test_a_compiled_models_state_dict_is_canonical_and_set_then_get_gives_it_back(
    world, model_id, cell
):
    model, optimizer = _fresh(world, cell, model_id)
    _step(model, optimizer, model_id, 0)
    truth = MODELS[model_id].ground_truth(1, world.device).held_by(model)
    got = copy.deepcopy(dsd.get_state_dict(model, optimizer))
    names = _names(got[0], got[1]["state"], got[1]["param_groups"])
    expected = _names(truth.model, truth.optimizer_state, truth.param_groups)
    assert names == expected, (
        f"rank {world.rank}: the compiled objects' state dicts name {names}, "
        f"one process's {expected}"
    )
    given = copy.deepcopy(got)  # a load may rename its input's keys (load-renames-the-callers-keys)
    dsd.set_state_dict(model, optimizer, model_state_dict=given[0], optim_state_dict=given[1])
    assert_trees_identical(dsd.get_state_dict(model, optimizer), got)


@pytest.mark.world(2, 4, applies=first_size_only("cell"))
@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("model_id", MODEL_IDS)
def test_a_compiled_model_resumes_three_generations_as_one_process(world, model_id, cell):
    model, optimizer = _fresh(world, cell, model_id)
    _step(model, optimizer, model_id, 0)
    path = str(world.tmp_path / "generation-0")
    save_checkpoint(model, optimizer, path)
    for generation in range(1, GENERATIONS + 1):
        model, optimizer = _fresh(world, cell, model_id)
        load_checkpoint(model, optimizer, path)
        _step(model, optimizer, model_id, generation)
        path = str(world.tmp_path / f"generation-{generation}")
        save_checkpoint(model, optimizer, path)
    assert_full_state_is_single_process(
        (model, optimizer, None),
        GENERATIONS + 1,
        RECIPE,
        model_id=model_id,
        full_load=True,
        **comparison_tolerance(PARALLELISMS[cell]),
    )


@pytest.mark.world(2, 4, applies=first_size_only("cell"))
@pytest.mark.parametrize("cell", WHOLE_CELLS)
@pytest.mark.parametrize("model_id", MODEL_IDS)
def test_a_compiled_model_round_trips_safetensors(world, model_id, cell):
    safetensors_torch = pytest.importorskip("safetensors.torch")
    writer_class = dcp.HuggingFaceStorageWriter  # every rank skips where the build lacks it
    model, optimizer = _fresh(world, cell, model_id)
    _step(model, optimizer, model_id, 0)
    full = copy.deepcopy(dsd.get_model_state_dict(model, options=full_options()))
    path = world.tmp_path / "hf"
    if world.rank == 0:
        dcp.save(full, storage_writer=writer_class(str(path)), no_dist=True)
        held = {
            key: tensor
            for file in sorted(path.glob("*.safetensors"))
            for key, tensor in safetensors_torch.load_file(str(file)).items()
        }
        assert_state_dict_equal(held, full)
    world.barrier()
    fresh, _ = _fresh(world, cell, model_id)
    state = dsd.get_model_state_dict(fresh)
    dcp.load(state, storage_reader=dcp.HuggingFaceStorageReader(str(path)))
    dsd.set_model_state_dict(fresh, state)
    assert_state_dict_equal(dsd.get_model_state_dict(fresh, options=full_options()), full)
