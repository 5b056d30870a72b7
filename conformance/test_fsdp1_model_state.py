"""FSDP1's model state-dict types against the oracle of ``fsdp/_state_dict_utils.py``.

For every FSDP1 cell (strategies, with and without ``use_orig_params``,
flat and nested wrapping) after two Adam steps: ``model.state_dict()``
inside ``FSDP.state_dict_type`` equals ``reference_impl.fsdp_state_dict``
on the same instance for each type and config, or both refuse; the
oracle's full state dict is the single-process one; loading the same state
dict through torch and through the oracle gives the same flat shards, and
the loaded models train on identically; the same with float16 buffers
under mixed precision and an ignored module; the oracle's errors for bad
input, on every rank. FULL_STATE_DICT with
``offload_to_cpu`` is left to ``test_upstream_failures.py``
(``test_fsdp1_full_offloaded_state_dict_equals_single_process``): on this
build it crashes a rank.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.distributed.fsdp import (
    FullStateDictConfig,
    FullyShardedDataParallel,
    LocalStateDictConfig,
    MixedPrecision,
    ShardedStateDictConfig,
    StateDictConfig,
    StateDictType,
)

import reference_impl as ri
from conformance._compare import assert_state_dict_equal, assert_trees_identical
from conformance._fsdp1 import FSDP1_CELLS
from conformance._models import ground_truth, seeded_mlp, train
from conformance._parallelisms import PARALLELISMS

# Each kind's type and a factory of its config: FSDP1 writes into the configs it is given.
KINDS: dict[str, tuple[StateDictType, Callable[[], StateDictConfig]]] = {
    "full": (StateDictType.FULL_STATE_DICT, FullStateDictConfig),
    "full_rank0_only": (
        StateDictType.FULL_STATE_DICT,
        lambda: FullStateDictConfig(rank0_only=True),
    ),
    "sharded": (StateDictType.SHARDED_STATE_DICT, ShardedStateDictConfig),
    "sharded_offloaded": (
        StateDictType.SHARDED_STATE_DICT,
        lambda: ShardedStateDictConfig(offload_to_cpu=True),
    ),
    "local": (StateDictType.LOCAL_STATE_DICT, LocalStateDictConfig),
    "local_offloaded": (
        StateDictType.LOCAL_STATE_DICT,
        lambda: LocalStateDictConfig(offload_to_cpu=True),
    ),
}
LOAD_KINDS = ["full", "sharded", "local"]


def _wrapped(world: Any, name: str, steps: int = 2) -> Any:
    """The cell's model after ``steps`` Adam steps (none: as freshly wrapped)."""
    cell = PARALLELISMS[name]
    cell.skip_unless_supported(world.size)
    model = cell.parallelise(seeded_mlp(), world)
    if steps:
        train(model, torch.optim.Adam(model.parameters(), lr=0.01), steps)
    return model


def _refused(name: str, state_dict_type: StateDictType) -> bool:
    """LOCAL_STATE_DICT refuses modules given a device mesh (our HYBRID_SHARD cells).

    NO_SHARD modules give a full state dict whatever type is asked for.
    """
    return state_dict_type == StateDictType.LOCAL_STATE_DICT and "hybrid" in name


def _torch_state_dict(model: Any, kind: str) -> dict[str, Any]:
    state_dict_type, config = KINDS[kind]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        with FullyShardedDataParallel.state_dict_type(model, state_dict_type, config()):
            return dict(model.state_dict())


def _torch_load(model: Any, state_dict: dict[str, Any], kind: str) -> None:
    state_dict_type, config = KINDS[kind]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        with FullyShardedDataParallel.state_dict_type(model, state_dict_type, config()):
            model.load_state_dict(state_dict)


def _oracle_state_dict(model: Any, kind: str) -> dict[str, Any]:
    state_dict_type, config = KINDS[kind]
    return ri.fsdp_state_dict(model, state_dict_type, config())


def _by_key(state_dict: dict[str, Any]) -> dict[str, Any]:
    """Keys in sorted order: FSDP1's key order follows module registration, not a contract."""
    return dict(sorted(state_dict.items()))


@pytest.mark.world(2, 4)
@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("name", FSDP1_CELLS)
def test_state_dict_type_matches_the_oracle(world, name, kind):
    model = _wrapped(world, name)
    if _refused(name, KINDS[kind][0]):
        with pytest.raises(RuntimeError):
            _torch_state_dict(model, kind)
        with pytest.raises(RuntimeError):
            _oracle_state_dict(model, kind)
        return
    theirs = _torch_state_dict(model, kind)
    ours = _oracle_state_dict(model, kind)
    assert_trees_identical(_by_key(theirs), _by_key(ours))


@pytest.mark.world(2, 4)
@pytest.mark.parametrize("offload", [False, True], ids=["on_device", "offloaded"])
@pytest.mark.parametrize("name", FSDP1_CELLS)
def test_the_oracles_full_state_dict_equals_the_single_process_one(world, name, offload):
    model = _wrapped(world, name)
    config = FullStateDictConfig(offload_to_cpu=offload)
    ours = ri.fsdp_state_dict(model, StateDictType.FULL_STATE_DICT, config)
    assert_state_dict_equal(ours, ground_truth(steps=2).model)
    if offload:
        assert {str(value.device) for value in ours.values()} == {"cpu"}


@pytest.mark.world(2, 4)
@pytest.mark.parametrize("name", FSDP1_CELLS)
def test_the_oracles_rank0_only_state_dict_is_on_global_rank_0_only(world, name):
    """The contract, also where FSDP1 diverges (nested roots' buffers, HYBRID_SHARD)."""
    model = _wrapped(world, name)
    config = FullStateDictConfig(rank0_only=True)
    ours = ri.fsdp_state_dict(model, StateDictType.FULL_STATE_DICT, config)
    if world.rank == 0 or "no_shard" in name:  # NO_SHARD: a full state dict everywhere
        assert_state_dict_equal(ours, ground_truth(steps=2).model)
    else:
        assert ours == {}


def _flat_params(model: Any) -> dict[str, torch.Tensor]:
    """Every rank's flat shards, padding included: what a load really wrote."""
    return {shard.prefix + "_flat_param": shard.flat_param for shard in ri.flat_param_shards(model)}


@pytest.mark.world(2, 4)
@pytest.mark.parametrize("kind", LOAD_KINDS)
@pytest.mark.parametrize("name", FSDP1_CELLS)
def test_loading_matches_the_oracle(world, name, kind):
    """One saved state dict, loaded by torch and by the oracle into fresh models, then trained.

    Both must write the same flat shards (the saved values, zero padding)
    and train on to the same state.
    """
    state_dict_type = KINDS[kind][0]
    if _refused(name, state_dict_type):
        pytest.skip(f"FSDP1 has no {state_dict_type.name} for {name}")
    saved = _oracle_state_dict(_wrapped(world, name), kind)
    by_torch, by_oracle = _wrapped(world, name, steps=0), _wrapped(world, name, steps=0)
    _torch_load(by_torch, copy.copy(saved), kind)
    ri.fsdp_load_state_dict(by_oracle, copy.copy(saved), state_dict_type)
    assert_trees_identical(_flat_params(by_torch), _flat_params(by_oracle))
    assert_state_dict_equal(ri.fsdp_state_dict(by_oracle), ground_truth(steps=2).model)
    for model in (by_torch, by_oracle):
        train(model, torch.optim.Adam(model.parameters(), lr=0.01), steps=1)
    assert_trees_identical(_flat_params(by_torch), _flat_params(by_oracle))


# ----- mixed-precision buffers and ignored modules -------------------------------------------


def _half_buffers_fc2_ignored(world: Any, steps: int = 2) -> Any:
    """FSDP1 over the MLP with float16 buffers and ``fc2`` left to the user (ignored)."""
    model = seeded_mlp()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        wrapped = FullyShardedDataParallel(
            model,
            device_id=world.device,
            mixed_precision=MixedPrecision(buffer_dtype=torch.float16),
            ignored_modules=[model.fc2],
        )
    train(wrapped, torch.optim.Adam(wrapped.parameters(), lr=0.01), steps)
    return wrapped


@pytest.mark.world(2)
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_mixed_precision_buffers_and_ignored_modules_match_the_oracle(world, kind):
    model = _half_buffers_fc2_ignored(world)
    assert model.running_scale.dtype == torch.float16  # mixed precision is in effect
    assert_trees_identical(
        _by_key(_torch_state_dict(model, kind)), _by_key(_oracle_state_dict(model, kind))
    )


@pytest.mark.world(2)
def test_the_oracle_saves_buffers_in_their_dtype_before_mixed_precision(world):
    """Equal to a single-process model trained with a float16 buffer, saved as float32."""
    ours = ri.fsdp_state_dict(_half_buffers_fc2_ignored(world))
    single = seeded_mlp()
    single.running_scale = single.running_scale.half()
    train(single, torch.optim.Adam(single.parameters(), lr=0.01), steps=2)
    truth = single.state_dict()
    truth["running_scale"] = truth["running_scale"].float()
    assert_state_dict_equal(ours, truth)
    assert ours["running_scale"].dtype == torch.float32


@pytest.mark.world(2)
@pytest.mark.parametrize("kind", LOAD_KINDS)
def test_loading_with_mixed_precision_and_ignored_modules_matches_the_oracle(world, kind):
    saved = _oracle_state_dict(_half_buffers_fc2_ignored(world), kind)
    by_torch = _half_buffers_fc2_ignored(world, steps=0)
    by_oracle = _half_buffers_fc2_ignored(world, steps=0)
    _torch_load(by_torch, copy.copy(saved), kind)
    ri.fsdp_load_state_dict(by_oracle, copy.copy(saved), KINDS[kind][0])
    assert_trees_identical(_parameters(by_torch), _parameters(by_oracle))
    # torch's load runs FSDP1's lazy initialisation, which casts the buffers;
    # the oracle's leaves that to the first forward, as a fresh model does.
    for model in (by_torch, by_oracle):
        train(model, torch.optim.Adam(model.parameters(), lr=0.01), steps=1)
    assert_trees_identical(
        {**_parameters(by_torch), **dict(by_torch.named_buffers())},
        {**_parameters(by_oracle), **dict(by_oracle.named_buffers())},
    )


def _parameters(model: Any) -> dict[str, torch.Tensor]:
    """Flat shards and the ignored module's own parameters."""
    return {**_flat_params(model), **dict(model.fc2.named_parameters())}


# ----- bad input: the same clear error on every rank ---------------------------------------


def _full_and_fresh(world: Any) -> tuple[dict[str, Any], Any]:
    saved = ri.fsdp_state_dict(_wrapped(world, "fsdp1_full_shard_flat"))
    return saved, _wrapped(world, "fsdp1_full_shard_flat", steps=0)


@pytest.mark.world(2)
def test_the_oracle_names_a_missing_parameter(world):
    saved, fresh = _full_and_fresh(world)
    del saved["fc2.bias"]
    with pytest.raises(RuntimeError, match=r"missing keys \['fc2.bias'\]"):
        ri.fsdp_load_state_dict(fresh, saved)


@pytest.mark.world(2)
def test_the_oracle_names_a_parameter_of_the_wrong_shape(world):
    saved, fresh = _full_and_fresh(world)
    saved["fc1.weight"] = saved["fc1.weight"][:, :6]
    wrong_shape = r"fc1.weight: shape \(10, 6\), the model's is \(10, 7\)"
    with pytest.raises(RuntimeError, match=wrong_shape):
        ri.fsdp_load_state_dict(fresh, saved)


@pytest.mark.world(2)
def test_the_oracle_refuses_a_state_dict_of_another_model(world):
    _, fresh = _full_and_fresh(world)
    other = {"embed.weight": torch.zeros(11, 6), "head.weight": torch.zeros(11, 6)}
    with pytest.raises(RuntimeError, match=r"unexpected keys \['embed.weight', 'head.weight'\]"):
        ri.fsdp_load_state_dict(fresh, other)


@pytest.mark.world(2)
def test_the_oracle_refuses_state_present_on_some_ranks_only(world):
    """Without the check, the ranks holding the key would gather it and wait for the others."""
    saved = ri.fsdp_state_dict(_wrapped(world, "fsdp1_full_shard_flat"), *_sharded())
    fresh = _wrapped(world, "fsdp1_full_shard_flat", steps=0)
    if world.rank != 0:
        del saved["fc1.weight"]
    other_keys = r"rank 1: holds other keys than rank 0: \['fc1.weight'\]"
    with pytest.raises(RuntimeError, match=other_keys):
        ri.fsdp_load_state_dict(fresh, saved, StateDictType.SHARDED_STATE_DICT, strict=False)


def _sharded() -> tuple[StateDictType, StateDictConfig]:
    return StateDictType.SHARDED_STATE_DICT, ShardedStateDictConfig()
