"""FSDP1's model state-dict types against the oracle of ``fsdp/_state_dict_utils.py``.

Every FSDP1 cell runs at 2 and 4 ranks: each strategy, with and without ``use_orig_params``,
flat and nested wrapping. After two Adam steps, the module checks:

- ``model.state_dict()`` inside ``FSDP.state_dict_type`` against
  ``reference_impl.fsdp_state_dict`` on the same model, for each type and config. The types
  are FULL (every rank, ``rank0_only``), SHARDED and LOCAL (each on device and offloaded). The
  two must be equal, or both refuse. LOCAL refuses the HYBRID cells' device mesh, in both.
- The oracle's full state dict (on device, offloaded, and ``rank0_only``: global rank 0
  alone) against the single-process model.
- Float16 mixed-precision buffers with an ignored module: every type against torch, and
  buffers saved in their float32 dtype.
- One saved FULL, SHARDED (on device and offloaded) or LOCAL state dict, passed through
  ``torch.save`` and ``torch.load``, loaded by torch and by
  ``reference_impl.fsdp_load_state_dict`` into fresh models. Both must write identical flat
  shards (the saved values, zero padding), and the loaded models must train on identically.
- The oracle's errors for bad input, raised on every rank: a missing parameter, a wrong shape,
  another model's state dict, and keys present on some ranks only.

FULL_STATE_DICT with ``offload_to_cpu`` is left to ``test_upstream_failures.py``
(``test_fsdp1_full_offloaded_state_dict_equals_single_process``): on this build it crashes a
rank.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

import reference_impl as ri
from conformance._upstream import fsdp, quiet_deprecations
from conformance.cells import PARALLELISMS, exists_at_size
from conformance.compare import assert_state_dict_equal, assert_trees_identical
from conformance.models.common import ground_truth, seeded_mlp, train
from conformance.models.optimizers import adam
from conformance.training import (
    FSDP1_CELLS,
    MODEL_KINDS,
    model_settings,
    oracle_model_state_dict,
    through_torch_save,
    torch_model_load,
    torch_model_state_dict,
)

LOAD_KINDS = ["full", "sharded", "sharded_offloaded", "local"]


def _wrapped(world: Any, name: str, steps: int = 2) -> Any:
    """The cell's model after ``steps`` Adam steps (none: as freshly wrapped)."""
    cell = PARALLELISMS[name]
    cell.require(world.size)
    model = cell.parallelise(seeded_mlp(), world)
    if steps:
        train(model, adam(model), steps)
    return model


def _refused(name: str, state_dict_type: fsdp.StateDictType) -> bool:
    """LOCAL_STATE_DICT refuses modules given a device mesh (HYBRID_SHARD and FSDP1 + TP).

    NO_SHARD modules give a full state dict whatever type is asked for.
    """
    return state_dict_type == fsdp.StateDictType.LOCAL_STATE_DICT and PARALLELISMS[name].fsdp1_mesh


def _by_key(state_dict: dict[str, Any]) -> dict[str, Any]:
    """Keys in sorted order: FSDP1's key order follows module registration, not a contract."""
    return dict(sorted(state_dict.items()))


@pytest.mark.world(2, 4, applies=exists_at_size())
@pytest.mark.parametrize("kind", MODEL_KINDS)
@pytest.mark.parametrize("name", FSDP1_CELLS)
def test_state_dict_type_matches_the_oracle(world, name, kind):
    if kind == "local_offloaded" and world.device.type != "cpu":
        pytest.skip(
            "FSDP1 cannot offload a LOCAL state dict from an accelerator (pytorch#103730): "
            "judged by test_upstream_failures.py::test_fsdp1_local_state_dict_offloads_from_an_"
            "accelerator"
        )
    model = _wrapped(world, name)
    if _refused(name, model_settings(kind)[0]):
        with pytest.raises(RuntimeError):
            torch_model_state_dict(model, kind)
        with pytest.raises(RuntimeError):
            oracle_model_state_dict(model, kind)
        return
    theirs = torch_model_state_dict(model, kind)
    ours = oracle_model_state_dict(model, kind)
    assert_trees_identical(_by_key(theirs), _by_key(ours))


@pytest.mark.world(2, 4, applies=exists_at_size())
@pytest.mark.parametrize("offload", [False, True], ids=["on_device", "offloaded"])
@pytest.mark.parametrize("name", FSDP1_CELLS)
def test_the_oracles_full_state_dict_equals_the_single_process_one(world, name, offload):
    model = _wrapped(world, name)
    config = fsdp.FullStateDictConfig(offload_to_cpu=offload)
    ours = ri.fsdp_state_dict(model, fsdp.StateDictType.FULL_STATE_DICT, config)
    assert_state_dict_equal(ours, ground_truth(steps=2, device=world.device).model)
    if offload:
        assert {str(value.device) for value in ours.values()} == {"cpu"}


@pytest.mark.world(2, 4, applies=exists_at_size())
@pytest.mark.parametrize("name", FSDP1_CELLS)
def test_the_oracles_rank0_only_state_dict_is_on_global_rank_0_only(world, name):
    """The contract, also where FSDP1 diverges (nested roots' buffers, HYBRID_SHARD)."""
    model = _wrapped(world, name)
    config = fsdp.FullStateDictConfig(rank0_only=True)
    ours = ri.fsdp_state_dict(model, fsdp.StateDictType.FULL_STATE_DICT, config)
    if world.rank == 0 or "no_shard" in name:  # NO_SHARD: a full state dict everywhere
        assert_state_dict_equal(ours, ground_truth(steps=2, device=world.device).model)
    else:
        assert ours == {}


def _flat_params(model: Any) -> dict[str, torch.Tensor]:
    """Every rank's flat shards, padding included: what a load really wrote."""
    return {shard.prefix + "_flat_param": shard.flat_param for shard in ri.flat_param_shards(model)}


@pytest.mark.world(2, 4, applies=exists_at_size())
@pytest.mark.parametrize("kind", LOAD_KINDS)
@pytest.mark.parametrize("name", FSDP1_CELLS)
def test_loading_matches_the_oracle(world, name, kind):
    """One saved state dict, passed through ``torch.save`` and ``torch.load`` as a training
    loop writes it to a file, loaded by torch and by the oracle into fresh models, then
    trained.

    Both must write the same flat shards (the saved values, zero padding)
    and train on to the same state.
    """
    state_dict_type = model_settings(kind)[0]
    if _refused(name, state_dict_type):
        pytest.skip(f"FSDP1 has no {state_dict_type.name} for {name}")
    saved = through_torch_save(oracle_model_state_dict(_wrapped(world, name), kind))
    by_torch, by_oracle = _wrapped(world, name, steps=0), _wrapped(world, name, steps=0)
    torch_model_load(by_torch, copy.copy(saved), kind)
    ri.fsdp_load_state_dict(by_oracle, copy.copy(saved), state_dict_type)
    assert_trees_identical(_flat_params(by_torch), _flat_params(by_oracle))
    assert_state_dict_equal(
        ri.fsdp_state_dict(by_oracle), ground_truth(steps=2, device=world.device).model
    )
    for model in (by_torch, by_oracle):
        train(model, adam(model), steps=1)
    assert_trees_identical(_flat_params(by_torch), _flat_params(by_oracle))


# ----- mixed-precision buffers and ignored modules -------------------------------------------


def _half_buffers_fc2_ignored(world: Any, steps: int = 2) -> Any:
    """FSDP1 over the MLP with float16 buffers and ``fc2`` left to the user (ignored)."""
    model = seeded_mlp()
    with quiet_deprecations():
        wrapped = fsdp.FullyShardedDataParallel(
            model,
            device_id=world.device,
            mixed_precision=fsdp.MixedPrecision(buffer_dtype=torch.float16),
            ignored_modules=[model.fc2],
        )
    train(wrapped, adam(wrapped), steps)
    return wrapped


@pytest.mark.world(2)
@pytest.mark.parametrize("kind", MODEL_KINDS)
def test_mixed_precision_buffers_and_ignored_modules_match_the_oracle(world, kind):
    model = _half_buffers_fc2_ignored(world)
    assert model.running_scale.dtype == torch.float16  # mixed precision is in effect
    assert_trees_identical(
        _by_key(torch_model_state_dict(model, kind)), _by_key(oracle_model_state_dict(model, kind))
    )


@pytest.mark.world(2)
def test_the_oracle_saves_buffers_in_their_dtype_before_mixed_precision(world):
    """Equal to a single-process model trained with a float16 buffer, saved as float32."""
    ours = ri.fsdp_state_dict(_half_buffers_fc2_ignored(world))
    single = seeded_mlp().to(world.device)  # the world's kind of device: see ground_truth
    single.running_scale = single.running_scale.half()
    train(single, adam(single), steps=2)
    truth = single.state_dict()
    truth["running_scale"] = truth["running_scale"].float()
    assert_state_dict_equal(ours, truth)
    assert ours["running_scale"].dtype == torch.float32


@pytest.mark.world(2)
@pytest.mark.parametrize("kind", LOAD_KINDS)
def test_loading_with_mixed_precision_and_ignored_modules_matches_the_oracle(world, kind):
    saved = oracle_model_state_dict(_half_buffers_fc2_ignored(world), kind)
    by_torch = _half_buffers_fc2_ignored(world, steps=0)
    by_oracle = _half_buffers_fc2_ignored(world, steps=0)
    torch_model_load(by_torch, copy.copy(saved), kind)
    ri.fsdp_load_state_dict(by_oracle, copy.copy(saved), model_settings(kind)[0])
    assert_trees_identical(_parameters(by_torch), _parameters(by_oracle))
    # torch's load runs FSDP1's lazy initialisation, which casts the buffers;
    # the oracle's leaves that to the first forward, as a fresh model does.
    for model in (by_torch, by_oracle):
        train(model, adam(model), steps=1)
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
        ri.fsdp_load_state_dict(fresh, saved, fsdp.StateDictType.SHARDED_STATE_DICT, strict=False)


def _sharded() -> tuple[fsdp.StateDictType, fsdp.StateDictConfig]:
    return fsdp.StateDictType.SHARDED_STATE_DICT, fsdp.ShardedStateDictConfig()
