"""Round trips through ``torch.distributed.checkpoint``: save, load, reshard, train on.

A checkpoint saved under one parallelism and world size loads under another, and every value
survives. After a load, training goes on exactly as if the model had never been saved.

DCP save → load restores every value, and training then continues exactly as without the
save, for every parallelism. Resharding loads run at 4 → 2 ranks, 4 → 1 (rank 0 alone,
``no_dist``) and 2 → 4, across parallelisms (FSDP1 → FSDP2, DDP → FSDP2, FSDP2+TP → TP, TP →
DDP, ...). A save over an existing checkpoint replaces it where its writer allows it
(``FileSystemWriter(overwrite=True)``, the default). Where the writer does not, the save is
refused on every rank and the files are left as they were (upstream's ``test_overwrite``).
Tensors in lists in lists, dicts in lists, ``OrderedDict``s, integer keys, long lists and a
``BytesIO`` come back as saved, into a template and rebuilt whole by ``dcp_to_torch_save``.
"""

from __future__ import annotations

import collections
import copy
import io
from collections.abc import Callable
from typing import Any

import pytest
import torch

from conformance._upstream import dcp, dcp_formats, dsd, full_options, with_parameters
from conformance.cells import (
    PARALLELISMS,
    SubWorld,
    comparison_tolerance,
    exists_at_size,
    loaders_of,
    reshards,
)
from conformance.compare import assert_state_dict_equal, assert_trees_identical
from conformance.models.common import train
from conformance.training import (
    file_hashes,
    load_checkpoint,
    load_options_for,
    model_and_adam,
    save_checkpoint,
)


def _full(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[Any, Any]:
    model_state, optim_state = dsd.get_state_dict(model, optimizer, options=full_options())
    return copy.deepcopy(model_state), copy.deepcopy(optim_state["state"])


def _assert_full_equal(actual: tuple[Any, Any], expected: tuple[Any, Any], **tolerance: float):
    assert_state_dict_equal(actual[0], expected[0], **tolerance)
    assert_state_dict_equal(actual[1], expected[1], **tolerance)


@pytest.mark.world(1, 2, 4, applies=exists_at_size())
@pytest.mark.parametrize("name", sorted(PARALLELISMS))
def test_load_restores_the_saved_state_and_training_goes_on_identically(world, name):
    model, optimizer = model_and_adam(name, world)
    train(model, optimizer, steps=2)
    path = str(world.tmp_path / "checkpoint")
    save_checkpoint(model, optimizer, path)
    saved = _full(model, optimizer)
    train(model, optimizer, steps=1)
    moved_on = _full(model, optimizer)
    load_checkpoint(model, optimizer, path)
    _assert_full_equal(_full(model, optimizer), saved)
    train(model, optimizer, steps=1)  # the same step again, from the loaded state
    _assert_full_equal(_full(model, optimizer), moved_on)


RESHARDS = reshards("dcp")  # saved by (at 4 ranks), loaded by, at how many ranks


@pytest.mark.world(4)
@pytest.mark.parametrize(("saved_by", "loaded_by", "load_size"), RESHARDS)
def test_resharding_load_keeps_every_value(world, saved_by, loaded_by, load_size):
    """Save at 4 ranks, load at ``load_size`` under another parallelism (rank 0 alone at 1)."""
    for name in (saved_by, loaded_by):
        if name in PARALLELISMS:
            PARALLELISMS[name].skip_unless_runnable(world.device)
    model, optimizer = model_and_adam(saved_by, world)
    train(model, optimizer, steps=2)
    path = str(world.tmp_path / "checkpoint")
    save_checkpoint(model, optimizer, path)
    saved = _full(model, optimizer)
    world.barrier()
    loaders = SubWorld(world, load_size)
    load = load_options_for(loaders)
    if loaders.member:
        target, target_optimizer = model_and_adam(loaded_by, loaders)
        load_checkpoint(target, target_optimizer, path, **load)
        cells = [PARALLELISMS[n] for n in (saved_by, loaded_by) if n in PARALLELISMS]
        _assert_full_equal(_full(target, target_optimizer), saved, **comparison_tolerance(*cells))
    world.barrier()


@pytest.mark.world(4)
@pytest.mark.parametrize("loaded_by", loaders_of("fsdp2", "dcp_grow"))
def test_load_at_more_ranks_than_saved(world, loaded_by):
    """Save at 2 ranks (FSDP2), load at 4: every value lands in the finer shards."""
    for name in ("fsdp2", loaded_by):
        PARALLELISMS[name].skip_unless_runnable(world.device)
    savers = SubWorld(world, 2)
    path = str(world.tmp_path / "checkpoint")
    saved: tuple[Any, Any] | None = None
    if savers.member:
        model, optimizer = model_and_adam("fsdp2", savers)
        train(model, optimizer, steps=2)
        save_checkpoint(model, optimizer, path, process_group=savers.group)
        saved = _full(model, optimizer)
    world.barrier()
    target, target_optimizer = model_and_adam(loaded_by, world)
    load_checkpoint(target, target_optimizer, path)
    loaded = _full(target, target_optimizer)
    if saved is not None:
        _assert_full_equal(loaded, saved, **comparison_tolerance(PARALLELISMS[loaded_by]))


@pytest.mark.world(1, 2, 4, applies=exists_at_size())
@pytest.mark.parametrize("name", ["ddp", "fsdp2"])
def test_a_save_over_a_checkpoint_replaces_it_only_where_allowed(world, name):
    """Plain tensors and DTensors alike: a save with ``overwrite=True`` over a checkpoint
    replaces it (a load gets the later state); one with ``overwrite=False`` is refused on every
    rank, saying the checkpoint exists, and changes no file."""
    PARALLELISMS[name].skip_unless_runnable(world.device)
    with_parameters(dcp.FileSystemWriter, "overwrite")
    path = world.tmp_path / "checkpoint"
    model, optimizer = model_and_adam(name, world)

    def save(overwrite: bool) -> None:
        writer = dcp.FileSystemWriter(path, overwrite=overwrite)
        save_checkpoint(model, optimizer, str(path), storage_writer=writer)

    train(model, optimizer, steps=1)
    save(overwrite=False)
    train(model, optimizer, steps=1, start=1)
    later = _full(model, optimizer)
    save(overwrite=True)
    world.barrier()
    files = file_hashes(path)
    with pytest.raises(dcp.CheckpointException, match="already exists"):
        save(overwrite=False)
    assert file_hashes(path) == files, f"rank {world.rank}: the refused save changed the files"
    fresh, fresh_optimizer = model_and_adam(name, world)
    load_checkpoint(fresh, fresh_optimizer, str(path))
    _assert_full_equal(_full(fresh, fresh_optimizer), later)


def _nested(rank: int, scale: float) -> dict[Any, Any]:
    """Tensors inside lists inside lists, among plain numbers, an ``OrderedDict`` and integer
    keys; the first list's tensor differs on each rank (saved under the rank's own key)."""
    first = torch.arange(6.0).reshape(2, 3) * scale
    number = int(10 * scale)  # the plain numbers differ between saved and template too
    return {
        f"rank_{rank}": [
            first + rank,
            [33 + number, torch.ones(4) * scale, [44 + number, 55]],
            [66, 77 + number],
        ],
        "ordered": collections.OrderedDict(b=torch.full((2,), scale), a=torch.zeros(3) + scale),
        "by_number": {0: torch.tensor([scale]), 1: 2.5 * scale},
    }


def _deeper(rank: int, scale: float) -> dict[str, Any]:
    """Dicts inside lists inside dicts, an ``OrderedDict`` holding a list, a list of twelve
    tensors (its keys sort ``.10`` before ``.2``), a list inside a list, strings and a train
    state with an int32 step and a ``BytesIO``; one tensor of each rank's own."""
    number = int(10 * scale)
    blob = io.BytesIO()
    torch.save([number, "step"], blob)
    return {
        f"rank_{rank}": torch.full((2,), rank + scale),
        "ordered_list": collections.OrderedDict(key0=[99 + number, torch.full((2,), scale)]),
        "dicts_in_lists": {
            "key0": [{"key1": {"key2": torch.full((3,), 2 * scale)}}],
            "k2": [torch.full((2,), 3 * scale), 99 + number, [{"k3": torch.full((1,), scale)}]],
            "k3": ["x" * (1 + number), 99, [{"k3": "y"}]],
        },
        "lists": {
            "twelve": [torch.full((1,), index * scale) for index in range(12)],
            "list_in_list": [[torch.full((2,), 4 * scale)]],
        },
        "train_state": {
            "step": torch.tensor(7 * number, dtype=torch.int32),
            "loss": torch.tensor(0.5 * scale),
            "blob": blob,
        },
    }


@pytest.mark.world(1, 2)
def test_nested_containers_come_back_as_saved(world):
    """Upstream's nested and traversed state dicts: every leaf of lists in lists, an
    ``OrderedDict`` and integer keys comes back from ``dcp.load`` into a template of the same
    shape filled with other values; the containers keep their kinds."""
    _assert_come_back_as_saved(world, "nested", _nested)


@pytest.mark.world(1, 2)
def test_deeper_containers_come_back_as_saved(world):
    """Upstream's flattening, traversal and end-to-end states: dicts in lists, an
    ``OrderedDict`` of a list, long lists, a list in a list and a ``BytesIO`` come back from
    ``dcp.load`` into a template of the same shape filled with other values."""
    _assert_come_back_as_saved(world, "deeper", _deeper)


def _assert_come_back_as_saved(
    world: Any, name: str, state: Callable[[int, float], dict[Any, Any]]
) -> None:
    """``state(rank, 1.0)`` saved by ``dcp.save`` loads into ``state(rank, 0.0)`` as saved."""
    path = str(world.tmp_path / name)
    saved = state(world.rank, 1.0)
    dcp.save(copy.deepcopy(saved), checkpoint_id=path)
    template = state(world.rank, 0.0)
    dcp.load(template, checkpoint_id=path)
    assert_trees_identical(template, saved)


@pytest.mark.world(1, 2)
def test_deeper_containers_come_back_whole_without_a_template(world):
    """``dcp_to_torch_save`` rebuilds the containers from the keys alone (lists filled out of
    the order their keys sort in, a list inside a list, dicts inside lists): the file holds
    every rank's state as saved, whatever order its keys come in."""
    path = world.tmp_path / "deeper-whole"
    dcp.save(_deeper(world.rank, 1.0), checkpoint_id=str(path))
    world.barrier()
    if world.rank == 0:
        converted = world.tmp_path / "deeper.pt"
        dcp_formats.dcp_to_torch_save(str(path), str(converted))
        whole: dict[str, Any] = {}
        for rank in range(world.size):
            whole.update(_deeper(rank, 1.0))
        loaded = torch.load(converted, weights_only=False)
        assert_trees_identical(_keys_sorted(loaded), _keys_sorted(whole))


def _keys_sorted(tree: Any) -> Any:
    """``tree`` with every dict's keys in sorted order, each dict of its own type."""
    if isinstance(tree, dict):
        return type(tree)((key, _keys_sorted(tree[key])) for key in sorted(tree))
    if isinstance(tree, list):
        return [_keys_sorted(item) for item in tree]
    return tree
