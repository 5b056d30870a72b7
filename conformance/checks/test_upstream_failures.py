"""Failures upstream state-dict code has had, or torch 2.13 has: each passes on a correct build.

Each test states the correct behaviour and names the upstream issue. Where
the torch under test still fails, its manifest lists the test with the
reason; a crash or hang is cut by the harness's deadline and reported with
every rank's stack.

Each failure upstream has had (pytorch#136228, #157781, #138842 under NCCL, #103730 on
accelerators, #128011, #192225, #192202, #158519, #124546, #128444, #164843, #126310, PR
#128004) and each real failure of torch 2.13.0 on CPU, as a test of the correct behaviour. A
hang is cut at 30 s and reported with every rank's stack; a segfault with its signal.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
import torch.distributed as dist

from conformance._upstream import (
    activation_checkpointing,
    dcp,
    ddp,
    dsd,
    dtensor,
    fsdp,
    full_options,
    fully_shard_on,
    quiet_deprecations,
    sdu,
    sharded_tensor,
)
from conformance.cells import PARALLELISMS
from conformance.compare import assert_state_dict_equal, assert_trees_identical
from conformance.models import fsdp1_small as small
from conformance.models.common import ground_truth, seeded_mlp, seeded_tied, tokens, train
from conformance.models.optimizers import adam, sgd
from conformance.training import torch_model_state_dict
from harness import devices

HANG_DEADLINE_S = 30  # a correct build takes well under a second here


def _wrapped(name: str, world: Any) -> torch.nn.Module:
    return PARALLELISMS[name].parallelise(seeded_mlp(), world)


# ----- torch 2.13.0's own failures (TORCH-2.13-CPU-FACTS, "Real divergences") ------------


@pytest.mark.world(2, timeout=HANG_DEADLINE_S)
@pytest.mark.parametrize("params", ["orig", "flat"])
def test_fsdp1_full_offloaded_state_dict_equals_single_process(world, params):
    """pytorch#188989: rank 0 gets the full CPU state dict, the other ranks an empty one."""
    model = _wrapped(f"fsdp1_full_shard_{params}", world)
    expected = ground_truth(steps=0, device=world.device).model
    actual = dsd.get_model_state_dict(
        model, options=dsd.StateDictOptions(full_state_dict=True, cpu_offload=True)
    )
    if world.rank == 0:
        devices = {key: value.device.type for key, value in actual.items()}
        assert set(devices.values()) == {"cpu"}, f"rank 0's offloaded state lies on {devices}"
        assert_state_dict_equal(actual, expected)
    else:
        assert actual == {}, f"rank {world.rank} got {sorted(actual)}"


@pytest.mark.world(2, timeout=HANG_DEADLINE_S)
@pytest.mark.parametrize("params", ["orig", "flat"])
def test_fsdp1_full_offloaded_optimizer_state_dict_equals_single_process(world, params):
    """Upstream's ``test_cpu_offload_full_state_dict``: ``get_optimizer_state_dict`` with
    ``full_state_dict`` and ``cpu_offload`` gives rank 0 the single-process Adam state, every
    tensor on the CPU, and the other ranks ``{}``."""
    model = _wrapped(f"fsdp1_full_shard_{params}", world)
    optimizer = adam(model)
    train(model, optimizer, 1)
    expected = ground_truth(steps=1, device=world.device).optimizer_state
    actual = dsd.get_optimizer_state_dict(
        model, optimizer, options=dsd.StateDictOptions(full_state_dict=True, cpu_offload=True)
    )
    if world.rank != 0:
        assert actual == {}, f"rank {world.rank} got {sorted(actual)}"
        return
    devices = {
        f"{key}.{name}": value.device.type
        for key, state in actual["state"].items()
        for name, value in state.items()
        if isinstance(value, torch.Tensor)
    }
    assert set(devices.values()) == {"cpu"}, f"rank 0's offloaded state lies on {devices}"
    assert_state_dict_equal(actual["state"], expected)


@pytest.mark.world(2, timeout=HANG_DEADLINE_S)
def test_fsdp1_local_state_dict_offloads_from_an_accelerator(world):
    """pytorch#103730: FSDP1's LOCAL_STATE_DICT with ``offload_to_cpu`` gives each flat
    parameter's ShardedTensor with its local shard on the CPU, as it is on the device."""
    if world.device.type == "cpu":
        pytest.skip("needs an accelerator world: on the CPU the offload returns the shard itself")
    model = _wrapped("fsdp1_full_shard_flat", world)
    on_device = torch_model_state_dict(model, "local")
    offloaded = torch_model_state_dict(model, "local_offloaded")
    assert offloaded.keys() == on_device.keys()
    for key, value in on_device.items():
        if not isinstance(value, sharded_tensor.ShardedTensor):
            continue
        moved = offloaded[key].local_shards()
        assert [shard.tensor.device.type for shard in moved] == ["cpu"], key
        assert_trees_identical(moved[0].tensor, value.local_shards()[0].tensor.cpu())


@pytest.mark.world(2, timeout=HANG_DEADLINE_S)
def test_broadcast_from_rank0_with_empty_dicts_on_other_ranks(world):
    """pytorch#157781: ranks other than 0 pass ``{}`` for both dicts and still load the model."""
    source = _wrapped("fsdp2", world)
    source_optimizer = adam(source)
    train(source, source_optimizer, steps=2)
    model_state, optim_state = dsd.get_state_dict(source, source_optimizer, options=full_options())
    model = _wrapped("fsdp2", world)
    optimizer = adam(model)
    given = (model_state, optim_state) if world.rank == 0 else ({}, {})
    dsd.set_state_dict(
        model,
        optimizer,
        model_state_dict=given[0],
        optim_state_dict=given[1],
        options=dsd.StateDictOptions(full_state_dict=True, broadcast_from_rank0=True),
    )
    expected = ground_truth(steps=2, device=world.device).model
    assert_state_dict_equal(dsd.get_model_state_dict(model, options=full_options()), expected)


@pytest.mark.world(2)
def test_fsdp1_hybrid_shard_with_one_rank_shard_groups_equals_single_process(world):
    """HYBRID_SHARD on a (N, 1) mesh: replicas of one rank each, optimizer state still exact."""

    mesh = world.mesh((world.size, 1), ("replicate", "shard"))
    model = fsdp.FullyShardedDataParallel(
        seeded_mlp(),
        device_mesh=mesh,
        device_id=world.device,
        sharding_strategy=fsdp.ShardingStrategy.HYBRID_SHARD,
        use_orig_params=True,
    )
    optimizer = adam(model)
    train(model, optimizer, steps=2)
    expected_state = ground_truth(steps=2, device=world.device).optimizer_state
    actual = dsd.get_optimizer_state_dict(model, optimizer, options=full_options())
    assert_state_dict_equal(actual["state"], expected_state)


@pytest.mark.world(2)
def test_fsdp1_rekey_to_parameter_ids_without_orig_params(world):
    """``rekey_optim_state_dict(PARAM_ID)`` given the wrapped model keys each FQN by its
    original parameter's position: the result loads into an unwrapped model's Adam as is."""

    model = _wrapped("fsdp1_full_shard_flat", world)
    optimizer = adam(model)
    train(model, optimizer, steps=2)
    with quiet_deprecations():
        full = fsdp.FullyShardedDataParallel.full_optim_state_dict(
            model, optimizer, rank0_only=False
        )
        rekeyed = fsdp.FullyShardedDataParallel.rekey_optim_state_dict(
            full, fsdp.OptimStateKeyType.PARAM_ID, model
        )
    plain = seeded_mlp()
    plain_optimizer = adam(plain)
    plain_optimizer.load_state_dict(rekeyed)
    names = {param: fqn for fqn, param in plain.named_parameters()}
    loaded = {names[param]: state for param, state in plain_optimizer.state.items()}
    assert_state_dict_equal(loaded, ground_truth(steps=2, device=world.device).optimizer_state)


@pytest.mark.world(2)
def test_comparing_sharded_tensors_with_torch_equal(world):
    """``torch.equal`` on two CPU ShardedTensors (an FSDP1 sharded state dict) says True. It
    communicates its result on the accelerator, so it fails only where there is none: on a
    machine with one the divergence cannot be seen, and the test skips there, naming it."""
    found = devices.accelerator()
    if found is not None:
        pytest.skip(
            f"torch.equal on CPU ShardedTensors reaches for an accelerator, which this machine "
            f"has ({found}): the failure it meets without one cannot be seen here"
        )
    model = _wrapped("fsdp1_full_shard_orig", world)
    state = dsd.get_model_state_dict(model)
    weight = state["fc1.weight"]
    assert torch.equal(weight, copy.deepcopy(weight))


@pytest.mark.world(2)
@pytest.mark.parametrize("name", ["ddp", "fsdp2", "fsdp1_full_shard_orig"])
def test_frozen_parameters_keep_their_optimizer_state_on_load(world, name):
    """pytorch#192202: the state a frozen parameter had is loaded back, not dropped."""
    model = _wrapped(name, world)
    optimizer = adam(model)
    train(model, optimizer, steps=2)
    _freeze_fc1_weight(model)
    saved = copy.deepcopy(dsd.get_optimizer_state_dict(model, optimizer, options=full_options()))
    fresh = _wrapped(name, world)
    _freeze_fc1_weight(fresh)
    fresh_optimizer = adam(fresh)
    dsd.set_optimizer_state_dict(fresh, fresh_optimizer, saved, options=full_options())
    loaded = dsd.get_optimizer_state_dict(fresh, fresh_optimizer, options=full_options())
    assert_state_dict_equal(loaded["state"], saved["state"])


def _freeze_fc1_weight(model: torch.nn.Module) -> None:
    for name, param in model.named_parameters():
        if name.endswith("fc1.weight"):
            param.requires_grad_(False)


@pytest.mark.world(2)
def test_cpu_state_dict_of_a_dtensor_whose_local_tensor_is_a_view(world):
    """PR #167597 gave a DTensor its local tensor's storage offset; ``_create_cpu_state_dict``
    deep-copies CPU DTensors, and ``Tensor.__deepcopy__`` then takes a DTensor made from a
    chunk at an offset (here rank 1's) for one with real storage: "invalid python storage"."""

    create = sdu._create_cpu_state_dict
    full = torch.arange(4.0 * world.size, device=world.device)
    local = full.chunk(world.size)[world.rank]  # a view at offset 4 * rank
    value = dtensor.DTensor.from_local(local, world.mesh(world.size, ("dp",)), [dtensor.Shard(0)])
    created = create({"w": value})["w"]
    assert isinstance(created, dtensor.DTensor)
    assert (created.placements, created.shape) == (value.placements, value.shape)
    assert created.to_local().device.type == "cpu"
    assert created.to_local().shape == local.shape
    assert created.to_local().untyped_storage().data_ptr() != local.untyped_storage().data_ptr()


@pytest.mark.world(4)
def test_dcp_load_on_a_rank_without_local_shards(world):
    """A rank holding no shard of a ShardedTensor (FSDP1 chunks 5 rows as 2, 2, 1, 0): the
    load planner drops that key there, takes the gap for a pre-2.4 checkpoint, re-keys the
    state dict in the old format, and then misses ``groups`` (old format: one key per list)."""

    rows = world.size - 1  # the last rank holds none

    def state(fill: float, lr: float) -> dict[str, Any]:
        shards = []
        if world.rank < rows:
            placement = f"rank:{world.rank}/{world.device}"
            metadata = sharded_tensor.ShardMetadata([world.rank, 0], [1, 2], placement)
            shards.append(
                sharded_tensor.Shard(torch.full((1, 2), fill, device=world.device), metadata)
            )
        return {"w": sharded_tensor.init_from_local_shards(shards, rows, 2), "groups": [{"lr": lr}]}

    path = str(world.tmp_path / "checkpoint")
    dcp.save(state(float(world.rank), 0.1), checkpoint_id=path)
    loaded = state(-1.0, 0.0)
    dcp.load(loaded, checkpoint_id=path)
    assert loaded["groups"] == [{"lr": 0.1}]
    for shard in loaded["w"].local_shards():
        assert torch.equal(shard.tensor, torch.full((1, 2), float(world.rank), device=world.device))


@pytest.mark.world(2)
def test_fsdp1_offloaded_optimizer_state_with_orig_params_equals_single_process(world):
    """With ``use_orig_params``, FSDP1 gathers each state name into a buffer and, when offloading,
    skips the copy and calls ``.cpu()``: a no-op on CPU, so ``exp_avg`` is left a view of a
    buffer that the gather of ``exp_avg_sq`` then overwrites."""

    model = _wrapped("fsdp1_full_shard_orig", world)
    optimizer = adam(model)
    train(model, optimizer, steps=2)
    optim_config = fsdp.FullOptimStateDictConfig(offload_to_cpu=True, rank0_only=False)
    with (
        quiet_deprecations(),
        fsdp.FullyShardedDataParallel.state_dict_type(
            model, fsdp.StateDictType.FULL_STATE_DICT, fsdp.FullStateDictConfig(), optim_config
        ),
    ):
        state = fsdp.FullyShardedDataParallel.optim_state_dict(model, optimizer)["state"]
    assert_state_dict_equal(state, ground_truth(steps=2, device=world.device).optimizer_state)


@pytest.mark.world(2)
@pytest.mark.parametrize("loaded_by", ["ddp", "fsdp1_full_shard_orig"])
def test_flat_fsdp1_optimizer_state_trains_on_over_separate_parameters(world, loaded_by):
    """A flat parameter's full optimizer state, loaded by a model whose optimizer holds the
    original parameters, trains on as a single process does. On 2.13 every entry of one flat
    parameter holds the same ``step`` tensor, which Adam then advances once per parameter."""
    source = _wrapped("fsdp1_full_shard_flat", world)
    source_optimizer = adam(source)
    train(source, source_optimizer, steps=2)
    model_state = dsd.get_model_state_dict(source, options=full_options())
    optim_state = dsd.get_optimizer_state_dict(source, source_optimizer, options=full_options())
    target = _wrapped(loaded_by, world)
    target_optimizer = adam(target)
    dsd.set_model_state_dict(target, model_state, options=full_options())
    dsd.set_optimizer_state_dict(target, target_optimizer, optim_state, options=full_options())
    train(target, target_optimizer, steps=1, start=2)
    state = dsd.get_optimizer_state_dict(target, target_optimizer, options=full_options())["state"]
    assert_state_dict_equal(state, ground_truth(steps=3, device=world.device).optimizer_state)


@pytest.mark.world(2, 4)
@pytest.mark.parametrize("name", ["fsdp1_full_shard_flat", "fsdp1_no_shard_flat"])
def test_flattened_optimizer_load_of_flat_fsdp1_restores_the_saved_state(world, name):
    """A run resumes from a flattened optimizer state dict of FSDP1 without
    ``use_orig_params``, trains a step, and goes back to the same checkpoint: its optimizer
    then holds the single-process state of the checkpoint. Each rank orders a set of names by
    its own hash seed, as the processes a launcher starts do (the harness gives rank r
    ``PYTHONHASHSEED`` = ``--world-hash-seed`` + r); the loads must not depend on that order."""
    flattened = dsd.StateDictOptions(flatten_optimizer_state_dict=True)
    source = _wrapped(name, world)
    source_optimizer = adam(source)
    train(source, source_optimizer, steps=2)
    saved = copy.deepcopy(dsd.get_optimizer_state_dict(source, source_optimizer, options=flattened))
    target = _wrapped(name, world)
    target_optimizer = adam(target)
    dsd.set_optimizer_state_dict(target, target_optimizer, copy.deepcopy(saved), options=flattened)
    train(target, target_optimizer, steps=1, start=2)
    dsd.set_optimizer_state_dict(target, target_optimizer, saved, options=flattened)
    state = dsd.get_optimizer_state_dict(target, target_optimizer, options=full_options())["state"]
    assert_state_dict_equal(state, ground_truth(steps=2, device=world.device).optimizer_state)


# ----- historic upstream failures, fixed upstream: they must stay fixed ------------------


@pytest.mark.world(2)
@pytest.mark.parametrize("use_orig_params", [True, False], ids=["orig", "flat"])
def test_aliased_submodules_keep_every_name_in_full_state_dicts(world, use_orig_params):
    """pytorch#126310: a model that reaches one submodule by two names (``net3`` is ``net2``),
    FSDP1 FULL_SHARD, trained two steps. FSDP1's full state dict and ``get_model_state_dict``'s
    equal the single-process model's, with the shared layer under both names, and
    ``get_model_state_dict`` of the submodule ``net2`` alone equals ``net2.state_dict()``.
    (A ``state_dict()`` called on a module inside an FSDP1 wrapper, as the issue does, is not
    FSDP1's API: it gives the module's sharded views, or nothing under flat parameters.)"""
    inputs = small.seeded_batch(8)
    plain = small.SharedModuleAndParameter()
    train(plain, adam(plain), steps=2, inputs=inputs)
    model = small.fsdp1(
        small.SharedModuleAndParameter(), world.device, use_orig_params=use_orig_params
    )
    train(model, adam(model), steps=2, inputs=inputs)
    assert_state_dict_equal(torch_model_state_dict(model, "full"), plain.state_dict())
    assert_state_dict_equal(
        dsd.get_model_state_dict(model, options=full_options()), plain.state_dict()
    )
    submodule_only = dsd.StateDictOptions(full_state_dict=True, keep_submodule_prefixes=False)
    net2 = dsd.get_model_state_dict(model, submodules={model.module.net2}, options=submodule_only)
    assert_state_dict_equal(net2, plain.net2.state_dict())


@pytest.mark.world(4)
def test_full_load_of_uneven_fsdp2_tp_tensors(world):
    """pytorch#136228: full state dicts of uneven tensors load into FSDP2+TP (``_StridedShard``)."""
    source = _wrapped("fsdp2_tp", world)
    source_optimizer = adam(source)
    train(source, source_optimizer, steps=2)
    model_state, optim_state = copy.deepcopy(
        dsd.get_state_dict(source, source_optimizer, options=full_options())
    )
    model = _wrapped("fsdp2_tp", world)
    optimizer = adam(model)
    dsd.set_state_dict(
        model,
        optimizer,
        model_state_dict=model_state,
        optim_state_dict=optim_state,
        options=full_options(),
    )
    loaded_model, loaded_optim = dsd.get_state_dict(model, optimizer, options=full_options())
    assert_state_dict_equal(loaded_model, model_state)
    assert_state_dict_equal(loaded_optim["state"], optim_state["state"])


@pytest.mark.world(2)
@pytest.mark.parametrize("saved_as", ["sharded", "full"])
@pytest.mark.parametrize("flatten", [False, True], ids=["nested", "flattened"])
@pytest.mark.parametrize("name", ["ddp", "fsdp1_flat", "fsdp2"])
def test_shared_parameters_in_set_optimizer_state_dict(world, name, flatten, saved_as):
    """pytorch#128011: a tied parameter's model and optimizer state, saved sharded or full,
    nested or flattened, loads into fresh objects through whichever FQN names it, giving the
    saved full state; FSDP1 keeps the tied parameter in a flat parameter."""

    def wrap(model: torch.nn.Module) -> torch.nn.Module:
        if name == "ddp":
            return ddp.DistributedDataParallel(model)
        if name == "fsdp1_flat":
            return fsdp.FullyShardedDataParallel(
                model, device_id=world.device, use_orig_params=False
            )
        return fully_shard_on(world.device)(model, mesh=world.mesh(world.size, ("dp",)))

    full = saved_as == "full"
    options = dsd.StateDictOptions(full_state_dict=full, flatten_optimizer_state_dict=flatten)
    model = wrap(seeded_tied())
    optimizer = adam(model)
    train(model, optimizer, steps=2, inputs=tokens)
    saved_model, saved = copy.deepcopy(dsd.get_state_dict(model, optimizer, options=options))
    expected_model, expected = dsd.get_state_dict(model, optimizer, options=full_options())
    fresh = wrap(seeded_tied())
    fresh_optimizer = adam(fresh)
    dsd.set_state_dict(
        fresh,
        fresh_optimizer,
        model_state_dict=saved_model,
        optim_state_dict=saved,
        options=options,
    )
    loaded_model, loaded = dsd.get_state_dict(fresh, fresh_optimizer, options=full_options())
    assert_state_dict_equal(loaded_model, expected_model)
    assert_state_dict_equal(loaded["state"], expected["state"])


@pytest.mark.world(2)
@pytest.mark.parametrize("name", ["ddp", "fsdp2"])
def test_flattened_round_trip_with_stateless_sgd(world, name):
    """pytorch#192225: SGD without momentum keeps no state; flattened save and load still work."""
    model = _wrapped(name, world)
    optimizer = sgd(model)
    train(model, optimizer, steps=2)
    flat = dsd.StateDictOptions(flatten_optimizer_state_dict=True)
    saved = dsd.get_optimizer_state_dict(model, optimizer, options=flat)
    fresh = _wrapped(name, world)
    fresh_optimizer = torch.optim.SGD(fresh.parameters(), lr=0.5)
    dsd.set_optimizer_state_dict(fresh, fresh_optimizer, saved, options=flat)
    assert [g["lr"] for g in fresh_optimizer.param_groups] == [0.1]
    assert_trees_identical(
        dsd.get_optimizer_state_dict(fresh, fresh_optimizer, options=flat), saved
    )


@pytest.mark.world(2)
def test_compiled_model_keys_before_and_after_set(world):
    """pytorch#158519: a compiled model's keys carry no ``_orig_mod.``, before and after a load."""
    model = torch.compile(_wrapped("fsdp2", world), backend="eager")
    optimizer = adam(model)
    train(model, optimizer, steps=1)
    before = dsd.get_model_state_dict(model)
    expected_keys = list(ground_truth(steps=0, device=world.device).model)
    assert sorted(before) == sorted(expected_keys)
    dsd.set_model_state_dict(model, copy.deepcopy(before))
    assert sorted(dsd.get_model_state_dict(model)) == sorted(expected_keys)


@pytest.mark.world(2)
@pytest.mark.parametrize("use_orig_params", [False, True])
@pytest.mark.parametrize("checkpointed", ["after_wrapping", "before_wrapping"])
def test_fsdp1_flat_params_with_activation_checkpointing_have_canonical_fqns(
    world, checkpointed, use_orig_params
):
    """pytorch#124546: FSDP1 plus checkpoint wrappers, applied to the wrapped model or, as
    upstream's test does, before the wrapping (the flat parameter then records its originals
    through ``_checkpoint_wrapped_module``): canonical FQNs."""

    def checkpoint(module: torch.nn.Module) -> None:
        activation_checkpointing.apply_activation_checkpointing(
            module, check_fn=lambda m: isinstance(m, torch.nn.Linear)
        )

    model = seeded_mlp()
    if checkpointed == "before_wrapping":
        checkpoint(model)
    model = fsdp.FullyShardedDataParallel(
        model, device_id=world.device, use_orig_params=use_orig_params
    )
    if checkpointed == "after_wrapping":
        checkpoint(model)
    optimizer = adam(model)
    train(model, optimizer, steps=2)
    truth = ground_truth(steps=2, device=world.device)
    expected, expected_state = truth.model, truth.optimizer_state
    assert_state_dict_equal(dsd.get_model_state_dict(model, options=full_options()), expected)
    actual = dsd.get_optimizer_state_dict(model, optimizer, options=full_options())
    assert_state_dict_equal(actual["state"], expected_state)


@pytest.mark.world(4)
@pytest.mark.parametrize("name", ["hsdp2", "fsdp1_hybrid_shard_orig"])
def test_hsdp_set_optimizer_state_dict(world, name):
    """pytorch#128444: HSDP loads its optimizer state back exactly."""
    model = _wrapped(name, world)
    optimizer = adam(model)
    train(model, optimizer, steps=2)
    saved = copy.deepcopy(dsd.get_optimizer_state_dict(model, optimizer))
    expected = copy.deepcopy(dsd.get_optimizer_state_dict(model, optimizer, options=full_options()))
    train(model, optimizer, steps=1)
    dsd.set_optimizer_state_dict(model, optimizer, saved)
    actual = dsd.get_optimizer_state_dict(model, optimizer, options=full_options())
    assert_state_dict_equal(actual["state"], expected["state"])


@pytest.mark.world(2)
def test_fsdp2_optimizer_state_is_dtensor_in_sharded_state_dicts(world):
    """PR #128004: ``exp_avg`` of a sharded parameter is a DTensor like the parameter."""

    model = _wrapped("fsdp2", world)
    optimizer = adam(model)
    train(model, optimizer, steps=1)
    state = dsd.get_optimizer_state_dict(model, optimizer)["state"]
    for fqn, entries in state.items():
        for name in ("exp_avg", "exp_avg_sq"):
            assert isinstance(entries[name], dtensor.DTensor), (
                f"{fqn}.{name}: {type(entries[name])}"
            )


@pytest.mark.world(1, 2)
def test_broadcast_of_cpu_tensors_under_a_device_backend(world):
    """pytorch#138842: a CPU model loads a full state dict broadcast over a backend that moves
    only accelerator tensors (NCCL, XCCL, HCCL, ...): rank 0 gives it, every other rank
    ``{}``, and every rank holds rank 0's values."""
    served = {part.partition(":")[0] for part in dist.get_backend_config().split(",")}
    if "cpu" in served:
        pytest.skip(
            f"needs a backend that moves only accelerator tensors; {world.backend} moves CPU "
            "tensors (run with --world-backend nccl, or the accelerator's own)"
        )
    model = seeded_mlp()  # stays on the CPU; the group only moves CUDA tensors
    expected = ground_truth(steps=0, device=world.device).model
    zeros = {k: torch.zeros_like(v) for k, v in expected.items()}
    model.load_state_dict(zeros)
    options = dsd.StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    dsd.set_model_state_dict(model, expected if world.rank == 0 else {}, options=options)
    assert_state_dict_equal(model.state_dict(), expected)


@pytest.mark.world(2, timeout=HANG_DEADLINE_S)
def test_broadcast_from_rank0_of_a_sharded_state_dict_names_its_keys_or_loads_it(world):
    """pytorch#164843: ``set_model_state_dict(full_state_dict, broadcast_from_rank0)`` given
    what an FSDP2 model's own ``state_dict()`` holds (DTensors, not full tensors) either loads
    those values or refuses by key; it must not fail inside the broadcast naming none."""
    model = _wrapped("fsdp2", world)
    train(model, adam(model), steps=2)
    expected = copy.deepcopy(dsd.get_model_state_dict(model, options=full_options()))
    options = dsd.StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    refusal = None
    try:
        dsd.set_model_state_dict(model, model.state_dict(), options=options)
    except Exception as error:  # judged below by what it names
        refusal = f"{type(error).__name__}: {error}"
    if refusal is None:
        loaded = dsd.get_model_state_dict(model, options=full_options())
        assert_state_dict_equal(loaded, expected)
    else:
        named = [key for key in expected if key in refusal]
        assert named, f"rank {world.rank}: {refusal} names no key"
