"""CPU-world counterparts of upstream's ``test/distributed/fsdp/test_fsdp_optim_state.py``.

Upstream's nested model (``Blocks`` here) has an unwrapped root, and FSDP1 wrappers on some
blocks and on some of their inner modules. So an optimizer holds flat parameters and plain
ones side by side. Each case runs torch and the oracle on the same instances and asserts
identical results. Where upstream compares with an unwrapped model trained the same way, so
do these tests. Gradients are averaged over ranks, so those values agree to float32 rounding,
not bit for bit. Upstream's ``use_optim_input`` variants are the deprecated-argument case.
Its transformer variants are covered by the matrix's transformer model. Its save/load at half
the world size is covered by ``test_fsdp1_reshard_loads.py`` and the half-world cases here.

The cases, the rest of upstream's ``test_fsdp_optim_state.py``:

- Full, ``rank0_only`` and sharded state, with one or two param groups (the root's ``bias``
  in neither) and parameter orders reversed on odd ranks. These must equal the oracle and an
  unwrapped model trained alike.
- Conversion for another wrapping, with or without ``use_orig_params``, at the same world
  size or on half of it. It must equal the oracle and that model's own state, then load and
  train on. Sharded state of parameters the loading model leaves out of FSDP1 stays
  ShardedTensors, as upstream's test accepts: it is checked gathered, not loaded.
- Optimizer state keys equal the model's state-dict keys, with an ignored module and with
  checkpoint wrappers.
- A rank whose optimizer lacks a parameter that rank 0 has makes torch raise. It makes the
  oracle raise on every rank, naming the FQN.
- An unmanaged parameter outside FSDP1 is skipped by both conversions. One inside a flat
  parameter is refused by both.
- A first parameter without state; state without ``param_groups``; ``load_directly``.
- Parameters whose ``requires_grad`` changes between steps.
- Plain layers whose names depend on the rank, under Adam and a ``_NamedOptimizer``, whose
  state loads back (``is_named_optimizer``) after more steps; and beside a HYBRID_SHARD
  part on a 2-D mesh, whose sharded state is DTensors.
- ``FSDP.optim_state_dict`` given the optimizer's own state dict, under the default config,
  SHARDED, and FULL with ``rank0_only`` and ``offload_to_cpu``.
- The deprecated ``optim_input`` argument: it warns, and gives the same result.
"""

from __future__ import annotations

import bisect
import copy
import functools
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

import reference_impl as ri
from conformance._upstream import dist_optim, dtensor, fsdp, quiet_deprecations, sharded_tensor
from conformance.cells import SubWorld
from conformance.compare import assert_state_dict_equal, assert_trees_identical
from conformance.models import fsdp1_small as small
from conformance.models.common import train
from conformance.models.optimizers import adam
from conformance.training import (
    fsdp1_api,
    keys_and_names_sorted,
    state_names_sorted,
    under_optim_settings,
)

STEPS = 3
LR = 0.01
DEPRECATION = (UserWarning, FutureWarning)  # upstream expects the former; 2.13 gives the latter
FLOAT32_ROUNDING = {"atol": 1e-6, "rtol": 1e-5}  # averaged gradients: sums in another order


def _blocks_and_adam(
    world: Any,
    *,
    groups: bool = False,
    reversed_on_odd_ranks: bool = False,
    wrap: bool = True,
    **wrap_kwargs: Any,
) -> tuple[small.Blocks, torch.optim.Optimizer]:
    """``Blocks`` wrapped as ``wrap_blocks`` does (or not at all), with Adam over them.

    ``groups`` gives upstream's two param groups (the root ``bias`` in
    neither); ``reversed_on_odd_ranks`` reverses each group's parameters on
    odd ranks, so parameter IDs name different parameters on different ranks.
    """
    model = small.Blocks()
    if wrap:
        model = small.wrap_blocks(model, world.device, **wrap_kwargs)
    else:
        model = model.to(world.device)
    params: list[Any] = model.two_param_groups() if groups else [{"params": model.parameters()}]
    if reversed_on_odd_ranks and world.rank % 2:
        params = [{**group, "params": list(group["params"])[::-1]} for group in params]
    return model, torch.optim.Adam(params, lr=LR)


def _train(
    model: nn.Module, optimizer: torch.optim.Optimizer, steps: int = STEPS, width: int = 5
) -> None:
    train(model, optimizer, steps, inputs=small.seeded_batch(width))


def _param_id(optimizer: torch.optim.Optimizer, param: torch.Tensor) -> int:
    """The key of ``param`` in ``optimizer.state_dict()``: its place across the groups."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    return next(i for i, p in enumerate(params) if p is param)


def _by_name(model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[int, Any]) -> Any:
    """ID-keyed state keyed by the names of the parameters (flat ones too), in name order:
    the same order on every rank, as collectives over it need."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    names = {param: name for name, param in model.named_parameters()}
    return dict(sorted((names[params[key]], value) for key, value in state.items()))


def _fqn_keyed(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """An unwrapped model's optimizer state dict, keyed by parameter names."""
    names = {param: name for name, param in model.named_parameters()}
    return {
        "state": {names[p]: dict(s) for p, s in optimizer.state.items()},
        "param_groups": [
            {**group, "params": [names[p] for p in group["params"]]}
            for group in optimizer.param_groups
        ],
    }


def _assert_same_as_unwrapped(saved: dict[str, Any], unwrapped: dict[str, Any]) -> None:
    """Same state within float32 rounding; same param groups, FQN lists compared as sets."""
    assert_state_dict_equal(saved["state"], unwrapped["state"], **FLOAT32_ROUNDING)
    assert len(saved["param_groups"]) == len(unwrapped["param_groups"])
    for ours, theirs in zip(saved["param_groups"], unwrapped["param_groups"], strict=True):
        assert sorted(ours["params"]) == sorted(theirs["params"])
        assert {k: v for k, v in ours.items() if k != "params"} == {
            k: v for k, v in theirs.items() if k != "params"
        }


@pytest.mark.world(2, 4)
@pytest.mark.parametrize("order", ["same_order", "reversed_on_odd_ranks"])
@pytest.mark.parametrize("groups", ["one_group", "two_groups"])
@pytest.mark.parametrize("kind", ["full", "full_rank0_only", "sharded"])
def test_state_of_a_nested_model_matches_the_oracle_and_the_unwrapped_model(
    world, kind, groups, order
):
    """``FSDP.optim_state_dict`` of a non-FSDP root equals the oracle's, and its full state
    equals an unwrapped model's trained alike (sharded state once gathered)."""
    options = {"groups": groups == "two_groups", "reversed_on_odd_ranks": order != "same_order"}
    model, optimizer = _blocks_and_adam(world, **options)
    _train(model, optimizer)
    theirs = under_optim_settings(
        model, kind, lambda: fsdp1_api("optim_state_dict")(model, optimizer)
    )
    ours = ri.fsdp_optim_state_dict(
        model, optimizer, rank0_only=kind == "full_rank0_only", shard_state=kind == "sharded"
    )
    assert_trees_identical(state_names_sorted(theirs), state_names_sorted(ours))
    if kind == "full_rank0_only" and world.rank != 0:
        assert ours == {}
        return
    plain, plain_optimizer = _blocks_and_adam(world, wrap=False, **options)
    _train(plain, plain_optimizer)
    full = {**ours, "state": ri.gather_state_dict(ours["state"])}
    _assert_same_as_unwrapped(full, _fqn_keyed(plain, plain_optimizer))


@pytest.mark.world(2)
def test_optim_state_keys_are_the_model_state_dict_keys(world):
    """With an ignored module and activation checkpointing, the full optimizer state and the
    full model state dict name the same parameters, without wrapper prefixes."""
    model = small.wrap_blocks(small.Blocks(), world.device, ignore_a_shift=True)
    small.apply_checkpointing(model, around=nn.Sequential)
    optimizer = adam(model)
    _train(model, optimizer, 1)
    with quiet_deprecations():
        theirs = fsdp.FullyShardedDataParallel.full_optim_state_dict(
            model, optimizer, rank0_only=False
        )
        with fsdp.FullyShardedDataParallel.state_dict_type(
            model, fsdp.StateDictType.FULL_STATE_DICT
        ):
            model_keys = sorted(model.state_dict())
    ours = ri.fsdp_optim_state_dict(model, optimizer, cpu_offload=True)
    assert_trees_identical(theirs, ours)
    assert sorted(ours["state"]) == model_keys
    assert not [key for key in model_keys if "_checkpoint_wrapped_module" in key]


@pytest.mark.world(2, 4)
@pytest.mark.parametrize("half_world", [False, True], ids=["same_world", "half_world"])
@pytest.mark.parametrize("use_orig_params", [False, True], ids=["flat", "orig"])
@pytest.mark.parametrize("kind", ["full", "full_rank0_only", "sharded"])
@pytest.mark.parametrize("target", ["same_wrapping", "alternative_wrapping"])
def test_load_into_another_wrapping_or_world_equals_training_there(
    world, target, kind, use_orig_params, half_world
):
    """Save after three steps, then convert for a model wrapped another way (possibly on the
    first half of the ranks, its parameters in other orders on odd ranks): torch's and the
    oracle's conversions are identical and equal that model's own state after the same steps;
    the optimizer loads it and trains on.

    Sharded state of parameters that the loading model leaves out of FSDP1 stays as it was
    saved (ShardedTensors), in torch as in upstream's own test: its values are checked
    gathered, and no plain optimizer can step it, so that case stops before loading."""
    if half_world and kind == "sharded":
        pytest.skip("FSDP1 loads sharded optimizer state only at the world size it was saved at")
    model, optimizer = _blocks_and_adam(world, groups=True)
    _train(model, optimizer)
    saved = under_optim_settings(
        model, kind, lambda: fsdp1_api("optim_state_dict")(model, optimizer)
    )
    sub = SubWorld(world, world.size // 2 if half_world else world.size)
    if not sub.member:
        return
    loader, loader_optimizer = _blocks_and_adam(
        world,
        groups=True,
        reversed_on_odd_ranks=True,
        alternative=target == "alternative_wrapping",
        use_orig_params=use_orig_params,
        process_group=sub.group,
    )
    _train(loader, loader_optimizer)
    given = saved if kind != "full_rank0_only" or world.rank == 0 else None
    theirs = under_optim_settings(
        loader,
        kind,
        lambda: fsdp1_api("optim_state_dict_to_load")(
            loader, loader_optimizer, copy.deepcopy(given), group=sub.group
        ),
    )
    ours = ri.fsdp_optim_state_dict_to_load(
        loader,
        loader_optimizer,
        copy.deepcopy(given),
        rank0_only=kind == "full_rank0_only",
        group=sub.group,
    )
    assert_trees_identical(keys_and_names_sorted(theirs), keys_and_names_sorted(ours))
    own = state_names_sorted(loader_optimizer.state_dict())
    gathered = ri.gather_state_dict(_by_name(loader, loader_optimizer, ours["state"]))
    own_by_name = _by_name(loader, loader_optimizer, own["state"])
    assert_state_dict_equal(gathered, own_by_name, **FLOAT32_ROUNDING)
    assert ours["param_groups"] == own["param_groups"]
    if kind == "sharded" and target == "alternative_wrapping":
        left_out = ours["state"][_param_id(loader_optimizer, loader.block1.weight)]
        assert isinstance(left_out["exp_avg"], sharded_tensor.ShardedTensor)
        return
    loader_optimizer.load_state_dict(ours)
    _train(loader, loader_optimizer, 1)


@pytest.mark.world(2, 4)
def test_a_rank_without_state_that_rank_0_has_fails_on_every_rank(world):
    """Other ranks' optimizers leave out the last parameter: torch refuses to gather, and the
    oracle raises on every rank, naming the parameters, instead of leaving a rank waiting."""
    model = small.wrap_blocks(small.Blocks(), world.device)
    params = list(model.parameters())
    optimizer = torch.optim.Adam(params if world.rank == 0 else params[:-1], lr=LR)
    _train(model, optimizer)
    with pytest.raises(RuntimeError, match="some ranks are missing some of those states"):
        under_optim_settings(model, "full", lambda: fsdp1_api("optim_state_dict")(model, optimizer))
    with pytest.raises(ValueError, match=r"block2\.2\.weight"):
        ri.fsdp_optim_state_dict(model, optimizer)
    dist.barrier()  # every rank got here: none is left in a collective


# The legacy pair that saves and converts back each kind: FSDP1's defaults offload a full save.
LEGACY_PAIRS = {
    "full": ("full_optim_state_dict", {"rank0_only": False}, "shard_full_optim_state_dict"),
    "sharded": ("sharded_optim_state_dict", {}, "flatten_sharded_optim_state_dict"),
}


@pytest.mark.world(2)
@pytest.mark.parametrize("where", ["outside_fsdp", "inside_a_flat_parameter"])
@pytest.mark.parametrize("kind", sorted(LEGACY_PAIRS))
def test_loading_into_a_model_with_an_unmanaged_parameter(world, kind, where):
    """State saved without a parameter the loading model has: outside FSDP1 it is left to its
    owner (both conversions skip it, identically); inside a flat parameter the originals'
    state would disagree, and both refuse with ValueError (the oracle names the FQN)."""
    save, save_kwargs, convert = LEGACY_PAIRS[kind]
    model, optimizer = _blocks_and_adam(world)
    _train(model, optimizer, 1)
    saved = fsdp1_api(save)(model, optimizer, **save_kwargs)
    loader = small.Blocks()
    owner = loader.block2[2] if where == "inside_a_flat_parameter" else loader
    owner.register_parameter("unmanaged", nn.Parameter(torch.randn(5, 5)))
    loader = small.wrap_blocks(loader, world.device)
    loader_optimizer = adam(loader)

    def by_torch() -> Any:
        return fsdp1_api(convert)(copy.deepcopy(saved), loader, optim=loader_optimizer)

    def by_oracle() -> Any:
        return ri.fsdp_optim_state_dict_to_load(loader, loader_optimizer, copy.deepcopy(saved))

    if where == "inside_a_flat_parameter":
        with pytest.raises(ValueError, match="must have scalar state with the same value"):
            by_torch()
        with pytest.raises(ValueError, match=r"block2\.2\.unmanaged"):
            by_oracle()
        return
    ours = by_oracle()
    assert_trees_identical(keys_and_names_sorted(by_torch()), keys_and_names_sorted(ours))
    unmanaged = _param_id(loader_optimizer, loader.unmanaged)
    assert unmanaged not in ours["state"]
    bisect.insort(ours["param_groups"][0]["params"], unmanaged)  # its owner's part: no state yet
    loader_optimizer.load_state_dict(ours)
    _train(loader, loader_optimizer, 1)


@pytest.mark.world(2)
@pytest.mark.parametrize("kind", sorted(LEGACY_PAIRS))
def test_a_first_parameter_without_state_saves_and_loads(world, kind):
    """The optimizer's first parameter never gets a gradient, so it has no state: saving and
    converting back match the oracle, and the loaded optimizer trains on."""
    save, save_kwargs, convert = LEGACY_PAIRS[kind]
    model = small.first_unused(world.device)
    optimizer = adam(model)
    _train(model, optimizer, 1)
    saved = fsdp1_api(save)(model, optimizer, **save_kwargs)
    ours = ri.fsdp_optim_state_dict(
        model, optimizer, cpu_offload=True, shard_state=kind == "sharded", use_dtensor=False
    )
    assert_trees_identical(saved, ours)
    assert not [fqn for fqn in ours["state"] if fqn.startswith("lin1.")]
    theirs_to_load = fsdp1_api(convert)(copy.deepcopy(saved), model, optim=optimizer)
    ours_to_load = ri.fsdp_optim_state_dict_to_load(model, optimizer, copy.deepcopy(saved))
    assert_trees_identical(
        keys_and_names_sorted(theirs_to_load), keys_and_names_sorted(ours_to_load)
    )
    optimizer.load_state_dict(ours_to_load)
    _train(model, optimizer, 1)


@pytest.mark.world(2)
def test_state_without_param_groups(world):
    """Given a state dict without ``param_groups``, both save and convert back without them;
    with the groups put back, the optimizer loads exactly what it had."""
    model = small.fsdp1(small.four_linears(), world.device)
    optimizer = adam(model)
    _train(model, optimizer, 1, width=8)
    original = copy.deepcopy(optimizer.state_dict())
    without_groups = copy.deepcopy(original)
    groups = without_groups.pop("param_groups")
    theirs = under_optim_settings(
        model,
        "full",
        lambda: fsdp1_api("optim_state_dict")(model, optimizer, copy.deepcopy(without_groups)),
    )
    ours = ri.fsdp_optim_state_dict(model, optimizer, copy.deepcopy(without_groups))
    assert_trees_identical(state_names_sorted(theirs), state_names_sorted(ours))
    assert "param_groups" not in ours
    _train(model, optimizer, 1, width=8)
    theirs_to_load = under_optim_settings(
        model,
        "full",
        lambda: fsdp1_api("optim_state_dict_to_load")(model, optimizer, copy.deepcopy(ours)),
    )
    ours_to_load = ri.fsdp_optim_state_dict_to_load(model, optimizer, copy.deepcopy(ours))
    assert_trees_identical(
        keys_and_names_sorted(theirs_to_load), keys_and_names_sorted(ours_to_load)
    )
    assert "param_groups" not in ours_to_load
    optimizer.load_state_dict({**ours_to_load, "param_groups": groups})
    assert_trees_identical(
        keys_and_names_sorted(optimizer.state_dict()), keys_and_names_sorted(original)
    )


@pytest.mark.world(2)
@pytest.mark.parametrize("use_orig_params", [False, True], ids=["flat", "orig"])
def test_load_directly_loads_what_the_oracle_converts(world, use_orig_params):
    """``optim_state_dict_to_load(load_directly=True)`` leaves the optimizer holding what
    the oracle's conversion, loaded by hand, gives another optimizer."""
    model = small.fsdp1(small.four_linears(), world.device, use_orig_params=use_orig_params)
    optimizer = adam(model)
    _train(model, optimizer, 1, width=8)
    saved = ri.fsdp_optim_state_dict(model, optimizer)
    by_hand = adam(model)
    by_hand.load_state_dict(ri.fsdp_optim_state_dict_to_load(model, by_hand, copy.deepcopy(saved)))
    _train(model, optimizer, 1, width=8)
    under_optim_settings(
        model,
        "full",
        lambda: fsdp1_api("optim_state_dict_to_load")(
            model, optimizer, copy.deepcopy(saved), load_directly=True
        ),
    )
    assert_trees_identical(
        keys_and_names_sorted(optimizer.state_dict()), keys_and_names_sorted(by_hand.state_dict())
    )


@pytest.mark.world(2)
def test_parameters_whose_requires_grad_changes_between_steps(world):
    """The first layer is frozen on even steps (use_orig_params): after every step, torch
    and the oracle save the same state and convert it alike for the load, and torch's load
    of it (``load_directly``) changes nothing."""
    model = small.fsdp1(small.four_linears(), world.device, use_orig_params=True)
    optimizer = adam(model)
    first_layer = model.module[0]
    for step in range(5):
        first_layer.requires_grad_(step % 2 == 1)
        train(model, optimizer, 1, start=step, inputs=small.seeded_batch(8))
        held = copy.deepcopy(optimizer.state_dict())
        theirs = under_optim_settings(
            model, "full", lambda: fsdp1_api("optim_state_dict")(model, optimizer)
        )
        ours = ri.fsdp_optim_state_dict(model, optimizer)
        assert_trees_identical(state_names_sorted(theirs), state_names_sorted(ours))
        to_load = fsdp1_api("optim_state_dict_to_load")
        convert = functools.partial(to_load, model, optimizer, copy.deepcopy(theirs))
        converted = under_optim_settings(model, "full", convert)
        expected = ri.fsdp_optim_state_dict_to_load(model, optimizer, ours)
        assert_trees_identical(keys_and_names_sorted(converted), keys_and_names_sorted(expected))
        load = functools.partial(to_load, model, optimizer, theirs, load_directly=True)
        under_optim_settings(model, "full", load)
        assert_trees_identical(
            keys_and_names_sorted(optimizer.state_dict()), keys_and_names_sorted(held)
        )


def _named_adam(model: nn.Module) -> torch.optim.Optimizer:
    return dist_optim._NamedOptimizer(
        model.named_parameters(), torch.optim.Adam, module=model, lr=LR
    )


def _adam(model: nn.Module) -> torch.optim.Optimizer:
    return adam(model)


def _rank_dependent_saved(
    world: Any, build: Callable[[nn.Module], Any]
) -> tuple[nn.Module, Any, dict[str, Any]]:
    """``RankDependent`` after two steps, its optimizer, and torch's full optimizer state,
    checked against the oracle's."""
    model = small.RankDependent(world.rank, world.device)
    optimizer = build(model)
    _rank_dependent_steps(model, optimizer, range(2))
    theirs = under_optim_settings(
        model, "full", lambda: fsdp1_api("optim_state_dict")(model, optimizer)
    )
    ours = ri.fsdp_optim_state_dict(model, optimizer)
    assert_trees_identical(state_names_sorted(theirs), state_names_sorted(ours))
    return model, optimizer, theirs


def _rank_dependent_steps(model: nn.Module, optimizer: Any, steps: range) -> None:
    """The model clears gradients: a NamedOptimizer lacks what ``zero_grad`` needs."""
    for step in steps:
        model.zero_grad()
        model(small.seeded_batch(8)(step)).pow(2).mean().backward()
        optimizer.step()


@pytest.mark.world(2)
def test_rank_dependent_plain_layers_with_adam_and_a_named_optimizer(world):
    """Each rank saves its own plain layer beside the FSDP1 state, for an Adam and for a
    NamedOptimizer alike: both match the oracle, and equal each other. The named optimizer's
    state, loaded back after five more steps (``is_named_optimizer=True``), saves again as
    it was saved."""
    _, _, by_adam = _rank_dependent_saved(world, _adam)
    model, named, by_named = _rank_dependent_saved(world, _named_adam)
    assert f"sparse{min(world.rank, 1)}.weight" in by_adam["state"]
    assert_trees_identical(
        state_names_sorted(by_named)["state"], state_names_sorted(by_adam)["state"]
    )
    _rank_dependent_steps(model, named, range(2, 7))
    to_load = fsdp1_api("optim_state_dict_to_load")
    load = functools.partial(
        to_load, model, named, copy.deepcopy(by_named), is_named_optimizer=True
    )
    named.load_state_dict(under_optim_settings(model, "full", load))
    again = under_optim_settings(model, "full", lambda: fsdp1_api("optim_state_dict")(model, named))
    assert_trees_identical(state_names_sorted(again), state_names_sorted(by_named))


@pytest.mark.world(4)
def test_rank_dependent_plain_layers_beside_hybrid_sharded_state(world):
    """The dense part HYBRID_SHARD on a (2, 2) mesh, the root not FSDP1: the SHARDED
    ``FSDP.optim_state_dict`` of the optimizer's state holds the dense part's moments as
    DTensors ``(Replicate(), Shard(0))`` and the plain layer's as plain tensors, as the
    oracle's does."""
    mesh = world.mesh((2, 2), ("replicate", "shard"))
    hybrid = {"sharding_strategy": fsdp.ShardingStrategy.HYBRID_SHARD, "device_mesh": mesh}
    model = small.RankDependent(world.rank, world.device, **hybrid)
    optimizer = adam(model)
    _rank_dependent_steps(model, optimizer, range(2))
    save = fsdp1_api("optim_state_dict")
    theirs = under_optim_settings(
        model, "sharded", lambda: save(model, optimizer, optimizer.state_dict())
    )
    ours = ri.fsdp_optim_state_dict(model, optimizer, shard_state=True)
    assert_trees_identical(state_names_sorted(theirs), state_names_sorted(ours))
    for fqn, state in theirs["state"].items():
        for moment in ("exp_avg", "exp_avg_sq"):
            value = state[moment]
            if fqn.startswith("dense."):
                placements = (dtensor.Replicate(), dtensor.Shard(0))
                assert isinstance(value, dtensor.DTensor), f"{fqn}.{moment}: {type(value)}"
                assert tuple(value.placements) == placements, f"{fqn}.{moment}: {value.placements}"
            else:
                assert type(value) is torch.Tensor, f"{fqn}.{moment}: {type(value).__name__}"


@pytest.mark.world(2)
def test_optim_state_dict_of_the_optimizers_own_state_dict_under_each_config(world):
    """``FSDP.optim_state_dict(..., optim_state_dict=optimizer.state_dict())`` equals the
    call without it and the oracle's, under the default config (no ``state_dict_type``: full
    and offloaded, no ShardedTensor), SHARDED on device, and FULL with ``rank0_only`` and
    ``offload_to_cpu`` together (rank 0's state on the CPU, ``{}`` on the others)."""
    model = small.fsdp1(small.four_linears(), world.device)
    optimizer = adam(model)
    _train(model, optimizer, 1, width=8)
    own = copy.deepcopy(optimizer.state_dict())
    save = fsdp.FullyShardedDataParallel.optim_state_dict
    default = save(model, optimizer, optim_state_dict=copy.deepcopy(own))
    assert_trees_identical(default, save(model, optimizer))
    assert_trees_identical(default, ri.fsdp_optim_state_dict(model, optimizer, cpu_offload=True))
    assert {str(value.device) for value in _tensors(default)} == {"cpu"}
    sharded = under_optim_settings(
        model, "sharded", lambda: save(model, optimizer, optim_state_dict=copy.deepcopy(own))
    )
    assert_trees_identical(sharded, ri.fsdp_optim_state_dict(model, optimizer, shard_state=True))
    settings = (
        fsdp.StateDictType.FULL_STATE_DICT,
        fsdp.FullStateDictConfig(),
        fsdp.FullOptimStateDictConfig(offload_to_cpu=True, rank0_only=True),
    )
    with quiet_deprecations(), fsdp.FullyShardedDataParallel.state_dict_type(model, *settings):
        on_rank_0 = save(model, optimizer, optim_state_dict=copy.deepcopy(own))
    expected = ri.fsdp_optim_state_dict(model, optimizer, rank0_only=True, cpu_offload=True)
    assert_trees_identical(on_rank_0, expected)
    assert (on_rank_0 == {}) == (world.rank != 0), f"rank {world.rank}: {list(on_rank_0)}"


def _tensors(optim_state_dict: dict[str, Any]) -> list[torch.Tensor]:
    return [
        value
        for state in optim_state_dict["state"].values()
        for value in state.values()
        if isinstance(value, torch.Tensor)
    ]


@pytest.mark.world(2)
def test_the_deprecated_optim_input_argument_warns_and_gives_the_same_result(world):
    """The legacy APIs still accept ``optim_input`` in place of ``optim``: they warn that it
    is deprecated and give what the oracle gives for the optimizer."""
    model, optimizer = _blocks_and_adam(world)
    _train(model, optimizer, 2)
    optim_input = list(model.parameters())
    deprecated = "`optim_input` argument is deprecated"
    with pytest.warns(DEPRECATION, match=deprecated):
        full = fsdp.FullyShardedDataParallel.full_optim_state_dict(
            model, optimizer, optim_input, rank0_only=False
        )
    assert_trees_identical(full, ri.fsdp_optim_state_dict(model, optimizer, cpu_offload=True))
    expected = ri.fsdp_optim_state_dict_to_load(model, optimizer, copy.deepcopy(full))
    for api in ("shard_full_optim_state_dict", "scatter_full_optim_state_dict"):
        with pytest.warns(DEPRECATION, match=deprecated):
            converted = fsdp.get(f"FullyShardedDataParallel.{api}")(
                copy.deepcopy(full), model, optim_input=optim_input
            )
        assert_trees_identical(keys_and_names_sorted(converted), keys_and_names_sorted(expected))
    plain, plain_optimizer = _blocks_and_adam(world, wrap=False)
    with pytest.warns(DEPRECATION, match=deprecated):
        rekeyed = fsdp.FullyShardedDataParallel.rekey_optim_state_dict(
            full, fsdp.OptimStateKeyType.PARAM_ID, plain, optim_input=list(plain.parameters())
        )
    ours = ri.fsdp_rekey_optim_state_dict(
        full, fsdp.OptimStateKeyType.PARAM_ID, plain, plain_optimizer
    )
    assert_trees_identical(rekeyed, ours)
