"""Oracle agreement and round trips of ``get_*``/``set_*`` state dict, across the parallelisms.

For each parallelism and set of options, the torch build's
``torch.distributed.checkpoint.state_dict`` and the oracle's
``reference_impl.state_dict`` run on the same model instance and must give
identical results: keys, types, placements, local shards, values.

In detail:

- Torch's ``get_model_state_dict``/``get_optimizer_state_dict`` and the oracle's run on the
  same model, for every parallelism and option set. The option sets: sharded, ``cpu_offload``,
  ``full_state_dict``, both, flattened optimizer state, ``ignore_frozen_params``. The results
  are compared key by key, placement by placement and shard by shard (ShardedTensors by
  metadata and local shards).
- ``set_state_dict`` by torch and by the oracle into fresh models, sharded and full, must
  leave identical models and optimizers.
- Every optimizer is checked by sharded, full and flattened get and load.
- Get → set → get is the identity. What loads do to their inputs is judged by
  test_loading_leaves_its_input.py.
- A key the model lacks makes a strict load raise, naming it, and a non-strict load report
  it, in torch as in the oracle.
- ``broadcast_from_rank0``: rank 0 alone passes the full model and optimizer dicts (the
  others ``{}``) to ``set_model_state_dict`` and ``set_optimizer_state_dict``. Torch and the
  oracle load them into every parallelism (FSDP1 cells included), under Adam, per-layer
  groups around an empty one, and AdamW with a scheduler. Both leave identical models and
  optimizers, holding the source's values and param groups (``initial_lr`` too). A strict
  broadcast load whose dict lacks a key raises on every rank, naming it.
- The deprecated ``submodules`` selection: ``fc2`` alone, its prefix kept or cut by
  ``keep_submodule_prefixes``, sharded and full. It runs in every parallelism whose ranks all
  hold ``fc2`` (not a pipeline's stages). It and a set keyed by submodule warn with
  ``FutureWarning`` and still work; so does FSDP1's ``state_dict_type``, while
  ``get_model_state_dict`` gives no such warning.

Under ``broadcast_from_rank0`` rank 0 passes the whole model's dicts. On a pipeline that is
every stage's part, and each stage takes its own. The oracle's strict broadcast optimizer load
refuses state of a parameter no rank holds, on every rank. It names that parameter, and none
that another stage holds.
"""

from __future__ import annotations

import copy
import re
import warnings
from typing import Any

import pytest
import torch

import reference_impl as ri
from conformance._upstream import ddp, dsd, fsdp, quiet_deprecations
from conformance.cells import (
    PARALLELISMS,
    Parallelism,
    exists_at_size,
    first_size_only,
    whole_model_at_size,
)
from conformance.compare import (
    assert_state_dict_equal,
    assert_trees_identical,
    held_part,
    whole_model_state,
    whole_optimizer_state,
)
from conformance.models.common import train, unwrapped_name
from conformance.models.optimizers import OPTIMIZERS, adam
from conformance.models.zoo import model_of

OPTION_SETS: dict[str, dict[str, bool]] = {
    "sharded": {},
    "offload": {"cpu_offload": True},
    "full": {"full_state_dict": True},
    "full_offload": {"full_state_dict": True, "cpu_offload": True},
    "flat_optim": {"flatten_optimizer_state_dict": True},
    "full_flat_optim": {"full_state_dict": True, "flatten_optimizer_state_dict": True},
    "no_frozen": {"ignore_frozen_params": True},
}


def build(
    parallelism: Parallelism, world: Any, recipe: str = "adam"
) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The parallelised model, trained two steps of ``recipe`` (its scheduler stepping too);
    skips sizes the parallelism lacks and cells the recipe does not apply to."""
    parallelism.require(world.size)
    OPTIMIZERS[recipe].skip_unless_applies(parallelism)
    model = model_of(parallelism, world)
    optimizer, scheduler = OPTIMIZERS[recipe].build(model)
    train(model, optimizer, 2, scheduler)
    return model, optimizer


def both_options(options: dict[str, bool]) -> tuple[Any, ri.StateDictOptions]:
    theirs = dsd.StateDictOptions(**options)
    return theirs, ri.StateDictOptions(**options)


def _get_cells() -> list[tuple[str, str]]:
    """Every pair of parallelism and option set, except FSDP1 with full offloaded state dicts.

    Those crash torch 2.13 (segfault, or an error on rank 0 that leaves the
    others waiting); ``test_known_failures`` holds them at two cells, so the
    gate reports them without paying a hang in every FSDP1 cell.
    """
    return [
        (name, options)
        for name in sorted(PARALLELISMS)
        for options in sorted(OPTION_SETS)
        if not (PARALLELISMS[name].fsdp1 and options == "full_offload")
    ]


@pytest.mark.world(1, 2, 4, 8, applies=exists_at_size())
@pytest.mark.parametrize(("name", "options"), _get_cells())
def test_get_state_dict_matches_the_oracle(world, name, options):
    model, optimizer = build(PARALLELISMS[name], world)
    theirs, ours = both_options(OPTION_SETS[options])
    get_model = dsd.get_model_state_dict
    get_optimizer = dsd.get_optimizer_state_dict
    assert_trees_identical(
        get_model(model, options=theirs), ri.get_model_state_dict(model, options=ours)
    )
    assert_trees_identical(
        get_optimizer(model, optimizer, options=theirs),
        ri.get_optimizer_state_dict(model, optimizer, options=ours),
    )


@pytest.mark.world(2, 4, applies=first_size_only())
@pytest.mark.parametrize("options", ["sharded", "full", "flat_optim"])
@pytest.mark.parametrize("recipe", sorted(OPTIMIZERS))
@pytest.mark.parametrize("name", sorted(PARALLELISMS))
def test_optimizer_state_dict_of_every_optimizer_matches_the_oracle(world, name, recipe, options):
    """Get, then load into a fresh optimizer, by torch and by the oracle: the same results.

    Each parallelism runs at the smallest world size it has (above one rank),
    which keeps the product of optimizers and options affordable.
    """
    parallelism = PARALLELISMS[name]
    model, optimizer = build(parallelism, world, recipe)
    model.zero_grad(set_to_none=True)  # fresh optimizers below create their state by a step
    theirs, ours = both_options(OPTION_SETS[options])
    saved = ri.get_optimizer_state_dict(model, optimizer, options=ours)
    assert_trees_identical(dsd.get_optimizer_state_dict(model, optimizer, options=theirs), saved)
    loaded = []
    for load, options_used in (
        (dsd.set_optimizer_state_dict, theirs),
        (ri.set_optimizer_state_dict, ours),
    ):
        fresh_optimizer, _ = OPTIMIZERS[recipe].build(model)
        load(model, fresh_optimizer, copy.deepcopy(saved), options=options_used)
        loaded.append(ri.get_optimizer_state_dict(model, fresh_optimizer, options=ours))
    assert_trees_identical(loaded[0], loaded[1])


@pytest.mark.world(1, 2, 4, 8, applies=exists_at_size())
@pytest.mark.parametrize("options", ["sharded", "full", "full_flat_optim"])
@pytest.mark.parametrize("name", sorted(PARALLELISMS))
def test_set_state_dict_matches_the_oracle(world, name, options):
    """Load the same state dict into two fresh models, by torch and by the oracle."""
    source, source_optimizer = build(PARALLELISMS[name], world)
    theirs, ours = both_options(OPTION_SETS[options])
    model_state = ri.get_model_state_dict(source, options=ours)
    optim_state = ri.get_optimizer_state_dict(source, source_optimizer, options=ours)
    results = []
    for loader, options_used in (
        (dsd.set_state_dict, theirs),
        (ri.set_state_dict, ours),
    ):
        model = model_of(PARALLELISMS[name], world)
        optimizer = adam(model)
        keys = loader(  # copies: torch's loader rewrites the dicts it is given
            model,
            optimizer,
            model_state_dict=copy.deepcopy(model_state),
            optim_state_dict=copy.deepcopy(optim_state),
            options=options_used,
        )
        results.append(
            (
                (sorted(keys.missing_keys), sorted(keys.unexpected_keys)),
                ri.get_model_state_dict(model, options=ours),
                ri.get_optimizer_state_dict(model, optimizer, options=ours),
            )
        )
    assert_trees_identical(results[0], results[1])
    assert_trees_identical(results[1][1], model_state)


@pytest.mark.world(1, 2, 4, 8, applies=exists_at_size())
@pytest.mark.parametrize("name", sorted(PARALLELISMS))
def test_get_set_get_is_the_identity(world, name):
    """Save, train on, load what was saved: the model and optimizer are back where they were."""
    model, optimizer = build(PARALLELISMS[name], world)
    get_state, set_state = dsd.get_state_dict, dsd.set_state_dict
    model_state, optim_state = copy.deepcopy(get_state(model, optimizer))
    full = ri.StateDictOptions(full_state_dict=True)
    expected = copy.deepcopy(ri.get_state_dict(model, optimizer, options=full))
    train(model, optimizer, steps=1)
    set_state(model, optimizer, model_state_dict=model_state, optim_state_dict=optim_state)
    actual = ri.get_state_dict(model, optimizer, options=full)
    assert_state_dict_equal(actual[0], expected[0])
    assert_state_dict_equal(actual[1]["state"], expected[1]["state"])


def _model_loader(loader: str) -> tuple[Any, Any]:
    """``set_model_state_dict`` and ``StateDictOptions`` of torch or of the oracle."""
    if loader == "torch":
        return dsd.set_model_state_dict, dsd.StateDictOptions
    return ri.set_model_state_dict, ri.StateDictOptions


@pytest.mark.world(2, applies=exists_at_size())
@pytest.mark.parametrize("name", sorted(PARALLELISMS))
def test_strict_load_refuses_an_unexpected_or_missing_key_and_non_strict_reports_them(world, name):
    """A key the model lacks, or a dict that lacks one of the model's keys: strict loading
    raises, in torch and in the oracle, naming it; non-strict loading of a dict with both
    reports them as unexpected and missing keys, the same in both."""
    model, _ = build(PARALLELISMS[name], world)
    held = ri.get_model_state_dict(model)
    dropped = sorted(held)[0]
    state = {**held, "fc3.weight": torch.zeros(1)}
    lacking = {key: value for key, value in held.items() if key != dropped}
    reported = {}
    for loader in ("torch", "oracle"):
        load, options = _model_loader(loader)
        with pytest.raises(RuntimeError, match=r"fc3\.weight"):
            load(model, copy.copy(state), options=options(strict=True))
        with pytest.raises(RuntimeError, match=rf"(?i)missing key.*{re.escape(dropped)}"):
            load(model, copy.copy(lacking), options=options(strict=True))
        both = {**lacking, "fc3.weight": torch.zeros(1)}
        keys = load(model, both, options=options(strict=False))
        reported[loader] = (sorted(keys.missing_keys), sorted(keys.unexpected_keys))
    expected = ([dropped], ["fc3.weight"])  # (missing, unexpected), by canonical FQN
    assert reported == {"torch": expected, "oracle": expected}, f"rank {world.rank}"


BROADCAST = {"full_state_dict": True, "broadcast_from_rank0": True}


# Plain Adam; per-layer groups around an empty one; AdamW whose scheduler adds ``initial_lr``
# to every group: the groups a broadcast load must match and restore.
BROADCAST_RECIPES = ("adam", "adam_groups", "adamw_step_lr")


@pytest.mark.world(2, 4, applies=exists_at_size())
@pytest.mark.parametrize("recipe", BROADCAST_RECIPES)
@pytest.mark.parametrize("name", sorted(PARALLELISMS))
def test_broadcast_from_rank0_matches_the_oracle(world, name, recipe):
    """Rank 0 alone passes the full model and optimizer dicts, the others ``{}``, to
    ``set_model_state_dict`` and ``set_optimizer_state_dict``: torch's loads and the oracle's
    give the same model and optimizer, holding the source's values and param groups (each
    group's hyper-parameters, ``initial_lr`` included) on every rank."""
    parallelism = PARALLELISMS[name]
    source, source_optimizer = build(parallelism, world, recipe)
    full = ri.StateDictOptions(full_state_dict=True)
    # The whole model's dicts, where each rank holds a pipeline stage's part of them.
    model_state = whole_model_state(ri.get_model_state_dict(source, options=full))
    optim_state = whole_optimizer_state(
        ri.get_optimizer_state_dict(source, source_optimizer, options=full)
    )
    theirs, ours = both_options(BROADCAST)
    upstream_loaders = (
        dsd.set_model_state_dict,
        dsd.set_optimizer_state_dict,
    )
    oracle_loaders = (ri.set_model_state_dict, ri.set_optimizer_state_dict)
    results = []
    for (load_model, load_optimizer), options in (
        (upstream_loaders, theirs),
        (oracle_loaders, ours),
    ):
        model = model_of(parallelism, world)
        optimizer, _ = OPTIMIZERS[recipe].build(model)
        rank0 = world.rank == 0
        load_model(model, copy.deepcopy(model_state) if rank0 else {}, options=options)
        load_optimizer(
            model, optimizer, copy.deepcopy(optim_state) if rank0 else {}, options=options
        )
        results.append(ri.get_state_dict(model, optimizer, options=full))
    assert_trees_identical(results[0], results[1])
    assert_trees_identical(results[1][0], held_part(model_state, model))
    assert_trees_identical(results[1][1]["state"], held_part(optim_state["state"], model))
    if not parallelism.partial:  # a stage's groups hold its parameters alone
        source_groups = ri.get_optimizer_state_dict(source, source_optimizer, options=full)
        assert_trees_identical(
            _tuples_as_lists(results[0][1]["param_groups"]),
            _tuples_as_lists(source_groups["param_groups"]),
        )


def _tuples_as_lists(tree: Any) -> Any:
    """``tree`` with tuples as lists: a broadcast passes ``betas`` on as a list, and the
    optimizer takes either."""
    if isinstance(tree, dict):
        return {key: _tuples_as_lists(value) for key, value in tree.items()}
    if isinstance(tree, (list, tuple)):
        return [_tuples_as_lists(item) for item in tree]
    return tree


@pytest.mark.world(2, timeout=20, applies=exists_at_size())
@pytest.mark.parametrize("name", ["ddp", "pp"])
def test_the_oracle_refuses_broadcast_state_of_a_parameter_no_rank_holds(world, name):
    """Rank 0's whole optimizer dict also holds state for ``fc3.weight``, which no rank's
    model has: the oracle's strict broadcast load raises on every rank, naming it and no
    parameter another rank (a pipeline's other stage) holds; no rank is left waiting."""
    model, optimizer = build(PARALLELISMS[name], world)
    full = ri.StateDictOptions(full_state_dict=True)
    state = whole_optimizer_state(ri.get_optimizer_state_dict(model, optimizer, options=full))
    state["state"]["fc3.weight"] = copy.deepcopy(state["state"]["fc1.weight"])
    given = state if world.rank == 0 else {}
    options = ri.StateDictOptions(**BROADCAST)
    with pytest.raises(RuntimeError, match=r"fc3\.weight") as refused:
        ri.set_optimizer_state_dict(model, optimizer, given, options=options)
    assert "fc1" not in str(refused.value)
    assert "fc2" not in str(refused.value)


@pytest.mark.world(
    2, timeout=20, applies=exists_at_size()
)  # a hang is cut here; a correct build takes a second
@pytest.mark.parametrize("loader", ["torch", "oracle"])
@pytest.mark.parametrize("name", ["ddp", "fsdp2", "fsdp1_full_shard_flat", "fsdp1_full_shard_orig"])
def test_broadcast_from_rank0_refuses_a_missing_key_on_every_rank(world, name, loader):
    """Rank 0's full dict lacks a parameter: a strict broadcast load raises on every rank,
    naming the key; no rank is left waiting in the broadcast."""
    model, _ = build(PARALLELISMS[name], world)
    state = ri.get_model_state_dict(model, options=ri.StateDictOptions(full_state_dict=True))
    del state["fc2.bias"]
    load, options = _model_loader(loader)
    with pytest.raises(RuntimeError, match=r"[Mm]issing key.*fc2\.bias"):
        load(model, state if world.rank == 0 else {}, options=options(**BROADCAST))
    torch.distributed.barrier()


def _submodule(model: torch.nn.Module, fqn: str) -> torch.nn.Module:
    """The first module whose name, wrapper segments left out, is ``fqn`` (under FSDP1 the
    wrapper, under DDP the module DDP holds)."""
    root = model.module if isinstance(model, ddp.DistributedDataParallel) else model
    for name, module in root.named_modules():
        if unwrapped_name(name) == fqn:
            return module
    raise LookupError(f"{type(model).__name__} has no submodule {fqn}")


@pytest.mark.world(2, applies=whole_model_at_size())
@pytest.mark.parametrize("keep_prefixes", [True, False], ids=["prefix_kept", "prefix_cut"])
@pytest.mark.parametrize("options", ["sharded", "full"])
@pytest.mark.parametrize("name", sorted(PARALLELISMS))
def test_submodule_state_dict_matches_the_oracle(world, name, options, keep_prefixes):
    """The deprecated ``submodules`` selection keeps ``fc2``'s state alone, its prefix kept
    or cut, in torch as in the oracle."""
    model, _ = build(PARALLELISMS[name], world)
    theirs, ours = both_options({**OPTION_SETS[options], "keep_submodule_prefixes": keep_prefixes})
    fc2 = _submodule(model, "fc2")
    with quiet_deprecations():
        got = dsd.get_model_state_dict(model, submodules={fc2}, options=theirs)
    expected = ri.get_model_state_dict(model, submodules={fc2}, options=ours)
    assert_trees_identical(got, expected)
    assert sorted(expected) == (["fc2.bias", "fc2.weight"] if keep_prefixes else ["bias", "weight"])


# The deprecated calls upstream warns about, each with the FutureWarning it must give.
DEPRECATED_CALLS = {
    "submodules_get": "Getting submodules only model/optim state_dict is deprecated",
    "submodule_keyed_set": "Passing model_state_dict as a ",
}


@pytest.mark.world(2)
@pytest.mark.parametrize("call", sorted(DEPRECATED_CALLS))
@pytest.mark.parametrize("name", ["ddp", "fsdp2"])
def test_a_deprecated_selection_warns_and_still_works(world, name, call):
    """``submodules=`` in a get, and a set keyed by submodule, warn with ``FutureWarning``
    for as long as they ship, and still give and load ``fc2``'s own state."""
    model, _ = build(PARALLELISMS[name], world)
    fc2 = _submodule(model, "fc2")
    options = dsd.StateDictOptions(keep_submodule_prefixes=False)
    unprefixed = ri.StateDictOptions(keep_submodule_prefixes=False)
    expected = ri.get_model_state_dict(model, submodules={fc2}, options=unprefixed)
    if call == "submodules_get":
        with pytest.warns(FutureWarning, match=DEPRECATED_CALLS[call]):
            got = dsd.get_model_state_dict(model, submodules={fc2}, options=options)
    else:
        loaded = {key: value.detach().clone() for key, value in expected.items()}
        with torch.no_grad():
            for parameter in fc2.parameters():
                parameter.zero_()
        with pytest.warns(FutureWarning, match=DEPRECATED_CALLS[call]):
            dsd.set_model_state_dict(
                model, {fc2: loaded}, options=dsd.StateDictOptions(strict=False)
            )
        got = ri.get_model_state_dict(model, submodules={fc2}, options=unprefixed)
    assert_trees_identical(got, expected)


@pytest.mark.world(2)
def test_fsdp1s_state_dict_type_warns_and_get_model_state_dict_does_not(world):
    """``FSDP.state_dict_type`` is deprecated with a ``FutureWarning``; the call that replaces
    it, ``get_model_state_dict``, gives none."""
    model, _ = build(PARALLELISMS["fsdp1_full_shard_orig"], world)
    state_dict_type = fsdp.get("FullyShardedDataParallel.state_dict_type")
    deprecated = r"FSDP.state_dict_type\(\) and FSDP.set_state_dict_type\(\) are being deprecated"
    with (
        pytest.warns(FutureWarning, match=deprecated),
        state_dict_type(model, fsdp.StateDictType.FULL_STATE_DICT),
    ):
        model.state_dict()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dsd.get_model_state_dict(model)
    warned = [str(w.message) for w in caught if re.search(deprecated, str(w.message))]
    assert not warned, f"rank {world.rank}: get_model_state_dict warned {warned}"
