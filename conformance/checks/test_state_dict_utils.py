"""Utilities: the torch build's ``_state_dict_utils`` against the oracle, on generated state dicts.

Each property is searched by rank 0's hypothesis and checked on every rank
(see ``conformance.training._spmd_property``): a failure on one rank fails, and
shrinks, on all of them. The falsifying example is printed in rank 0's
captured output; the other ranks' errors carry it as a note.

Every function of torch's ``torch/distributed/_state_dict_utils.py`` is checked against the
oracle (``reference_impl``; ``_copy_state_dict`` blocking and non-blocking). The checks run on
generated nested state dicts at world sizes 1, 2 and 4. The generated state dicts hold:

- tensors: zero-dim, empty, non-contiguous, five dtypes;
- DTensors on real meshes: FSDP ``[Shard(n)]``, HSDP ``[Replicate(), Shard(0)]``, 2-D
  ``[Shard(0), Shard(1)]`` and ``[Shard(0), Replicate()]``, FSDP2+TP
  ``[_StridedShard(0, sf=2), Shard(0)]``, uneven shapes and empty local shards;
- lists and tuples;
- int, float, str, bytes, ``BytesIO`` and None leaves.

Results must match in structure, types, devices, dtypes, placements and values. They must also
match in aliasing where the contract promises it. The oracle is also held to a ground truth:
each DTensor gathers to the tensor it was built from. And a real FSDP2+TP model's state dict
gathers to the single-process model's.

Property tests use hypothesis on rank 0 only. It broadcasts each example, every rank checks
it, and the ranks agree on its outcome. So a failure on any rank fails and shrinks the search,
and all ranks always run the same collectives. Hypothesis mixes constants from the loaded
modules into its draws, so separate searches per rank diverged and hung. Every module of the
suite is loaded before a search, so a test draws the same examples alone or after others. The
falsifying example is printed in full in rank 0's output and as a note on the other ranks'
errors. Functions missing from the torch under test are skipped, naming the function and the
torch version.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from hypothesis import strategies as st

import reference_impl as ri
from conformance._upstream import (
    dtensor_placements,
    fsdp,
    fully_shard_on,
    quiet_deprecations,
    sdu,
    sharded_tensor,
    tensor_parallel,
    with_parameters,
)
from conformance.compare import (
    Builder,
    DTensorSpec,
    TensorSpec,
    assert_trees_identical,
    full_tensor,
    local_part,
    placements_for,
    tree_specs,
    world_meshes,
)
from conformance.training import spmd_property


class Full(Builder):
    """Builds the ground truth of a spec: every DTensor as the full tensor it holds."""

    def dtensor(self, spec: DTensorSpec) -> torch.Tensor:  # type: ignore[override]
        return full_tensor(spec.shape, spec.dtype, spec.seed).to(self.device)


def setup(world: Any) -> tuple[Builder, Full, tuple[str, ...]]:
    meshes = world_meshes(world)
    return Builder(meshes, world.device), Full(meshes, world.device), tuple(meshes)


@pytest.mark.world(1, 2, 4)
@pytest.mark.parametrize("cpu_offload", [False, True])
@pytest.mark.parametrize("ranks_only", [(), (0,)])
def test_gather_matches_the_oracle_and_the_ground_truth(world, cpu_offload, ranks_only):
    gather = sdu._gather_state_dict
    build, _, meshes = setup(world)
    full = Full(meshes, torch.device("cpu") if cpu_offload else world.device)

    def check(spec: dict[str, Any]) -> None:
        options = {"cpu_offload": cpu_offload, "ranks_only": ranks_only}
        theirs = gather(build.build(spec), **options)
        ours = ri.gather_state_dict(build.build(spec), **options)
        assert_trees_identical(theirs, ours)
        if not ranks_only or world.rank in ranks_only:
            assert_trees_identical(ours, full.build(spec))
        else:
            assert ours == {}

    spmd_property(world.device, tree_specs(meshes), check)


@pytest.mark.world(1, 2, 4)
def test_offload_matches_the_oracle(world):
    offload = sdu._offload_state_dict_to_cpu
    build, _, meshes = setup(world)
    spmd_property(
        world.device,
        tree_specs(meshes),
        lambda spec: assert_trees_identical(
            offload(build.build(spec)), ri.offload_state_dict_to_cpu(build.build(spec))
        ),
    )


def tensors_of(tree: Any) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    ri.traverse_state_dict(
        tree, lambda _, v: found.append(v) if isinstance(v, torch.Tensor) else None
    )
    return found


@pytest.mark.world(1, 2, 4)
def test_copy_matches_the_oracle_and_returns_the_companions_tensors(world):
    build, _, meshes = setup(world)

    def check(spec: dict[str, Any]) -> None:
        source = build.build(spec)
        for non_blocking in (False, True):
            _check_one_copy(source, non_blocking, world.device)

    spmd_property(world.device, tree_specs(meshes), check)


def _check_one_copy(source: Any, non_blocking: bool, device: torch.device) -> None:
    """``_copy_state_dict`` of ``source`` into a CPU companion, by torch and by the oracle;
    a non-blocking copy is read after the device has finished it."""
    their_companion = ri.create_cpu_state_dict(source)
    our_companion = ri.create_cpu_state_dict(source)
    theirs = sdu._copy_state_dict(source, their_companion, non_blocking=non_blocking)
    ours = ri.copy_state_dict(source, our_companion, non_blocking=non_blocking)
    if device.type != "cpu":
        torch.get_device_module(device.type).synchronize(device)
    assert_trees_identical(theirs, ours)
    assert_trees_identical(their_companion, our_companion)
    for result, companion in ((theirs, their_companion), (ours, our_companion)):
        for got, target in zip(tensors_of(result), tensors_of(companion), strict=True):
            assert got is target, "the copy must return the companion's own tensors"


@pytest.mark.world(1, 2, 4)
def test_create_cpu_state_dict_matches_the_oracle_and_shares_no_storage(world):
    create = sdu._create_cpu_state_dict
    build, _, meshes = setup(world)

    def storages(tree: Any) -> set[int]:
        locals_ = [local_part(t) for t in tensors_of(tree)]
        return {t.untyped_storage().data_ptr() for t in locals_ if t.numel() and t.dim()}

    def check(spec: dict[str, Any]) -> None:
        source = build.build(spec)
        theirs, ours = create(source), ri.create_cpu_state_dict(source)
        # Contents are uninitialised: fill both from the source, then compare everything.
        ri.copy_state_dict(source, theirs)
        ri.copy_state_dict(source, ours)
        assert_trees_identical(theirs, ours)
        assert not storages(ours) & storages(source)
        assert not storages(theirs) & storages(source)

    spmd_property(world.device, tree_specs(meshes), check)


@pytest.mark.world(1, 2, 4)
def test_create_cpu_state_dict_in_shared_memory(world):
    create = sdu._create_cpu_state_dict
    build, _, meshes = setup(world)

    def check(spec: dict[str, Any]) -> None:
        source = build.build(spec)
        for result in (
            create(source, share_memory=True),
            ri.create_cpu_state_dict(source, share_memory=True),
        ):
            for tensor in tensors_of(result):
                local = local_part(tensor)
                assert local.dim() == 0 or local.is_shared()

    spmd_property(world.device, tree_specs(meshes, with_dtensors=False), check, examples=10)


@st.composite
def similar_pairs(
    draw: st.DrawFn, meshes: tuple[str, ...]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A spec and either itself or a copy with one top-level tensor's shape or dtype changed."""
    spec = draw(tree_specs(meshes))
    other = dict(spec)
    tensor_keys = [k for k, v in spec.items() if isinstance(v, TensorSpec)]
    if tensor_keys and draw(st.booleans()):
        key = draw(st.sampled_from(tensor_keys))
        old = spec[key]
        if draw(st.booleans()):
            other[key] = TensorSpec((*old.shape, 1), old.dtype, old.seed)
        else:
            dtype = torch.float16 if old.dtype != torch.float16 else torch.float32
            other[key] = TensorSpec(old.shape, dtype, old.seed)
    return spec, other


@pytest.mark.world(1, 2)
def test_similarity_check_matches_the_oracle(world):
    similar = sdu._check_state_dict_similarity
    build, _, meshes = setup(world)

    def check(pair: tuple[dict[str, Any], dict[str, Any]]) -> None:
        first, second = pair
        assert similar(build.build(first), build.build(second)) == ri.check_state_dict_similarity(
            build.build(first), build.build(second)
        )

    spmd_property(world.device, similar_pairs(meshes), check)


@pytest.mark.world(1, 2)
@pytest.mark.parametrize("dtype", [torch.float16, torch.int64], ids=["float16", "int64"])
def test_similarity_check_sees_a_dtype_change_alone(world, dtype):
    """Same keys and shapes, one dtype changed: not similar, for torch and the oracle."""
    similar = sdu._check_state_dict_similarity
    first = {"a": {"w": torch.ones(2, 3)}, "b": [torch.zeros(4)]}
    second = {"a": {"w": torch.ones(2, 3, dtype=dtype)}, "b": [torch.zeros(4)]}
    assert similar(first, copy.deepcopy(first))
    assert ri.check_state_dict_similarity(first, first)
    assert not similar(first, second)
    assert not ri.check_state_dict_similarity(first, second)


@pytest.mark.world(1)
def test_similarity_check_leaves_the_compared_state_dict_unchanged(world):
    similar = sdu._check_state_dict_similarity
    compared = {"w": torch.zeros(3)}
    assert similar({"w": torch.ones(3)}, compared)
    assert torch.equal(compared["w"], torch.zeros(3)), (
        f"the compared state dict changed: {compared}"
    )


@pytest.mark.world(1, 2, 4)
def test_flatten_and_unflatten_match_the_oracle(world):
    flatten = sdu._flatten_state_dict
    unflatten = sdu._unflatten_state_dict
    build, _, meshes = setup(world)

    def check(spec: dict[str, Any]) -> None:
        source = build.build(spec)
        try:
            ours, our_mapping = ri.flatten_state_dict(source)
        except ValueError:
            with pytest.raises(ValueError, match="duplicated flatten key"):
                flatten(source)
            return
        theirs, their_mapping = flatten(source)
        assert_trees_identical(theirs, ours)
        assert their_mapping == our_mapping
        assert_trees_identical(
            unflatten(theirs, their_mapping), ri.unflatten_state_dict(ours, our_mapping)
        )

    spmd_property(world.device, tree_specs(meshes), check)


@pytest.mark.world(1)
def test_flatten_then_unflatten_keeps_empty_containers(world):
    flatten = sdu._flatten_state_dict
    unflatten = sdu._unflatten_state_dict
    original = {"optim": {"state": {}, "param_groups": [{"params": []}]}, "w": torch.ones(1)}
    assert unflatten(*flatten(original)) == {**original}


@st.composite
def broadcast_cases(draw: st.DrawFn, meshes: tuple[str, ...], strict_keys: bool) -> dict[str, Any]:
    """A flat full state dict spec and, per key, how the local state dict holds it."""
    names = draw(st.lists(st.sampled_from("abcdefgh"), min_size=1, max_size=5, unique=True))
    full: dict[str, Any] = {}
    local: dict[str, Any] = {}
    for name in names:
        kind = draw(st.sampled_from(["tensor", "zero-dim", "plain", "dtensor"]))
        dtype = draw(st.sampled_from([torch.float32, torch.int64]))
        seed = draw(st.integers(0, 1000))
        if kind == "plain":
            full[name] = draw(st.integers(-3, 3))
            local[name] = 0
            continue
        shape: tuple[int, ...] = (
            ()
            if kind == "zero-dim"
            else tuple(draw(st.lists(st.integers(1, 6), min_size=1, max_size=2)))
        )
        full[name] = TensorSpec(shape, dtype, seed)
        if kind == "dtensor":
            mesh = draw(st.sampled_from(meshes))
            local[name] = DTensorSpec(
                shape,
                dtype,
                seed + 1,
                mesh,
                draw(st.sampled_from(placements_for(mesh, len(shape)))),
            )
        elif strict_keys or draw(st.booleans()):
            local[name] = TensorSpec(shape, dtype, seed + 1)
    if not strict_keys and draw(st.booleans()):
        local["extra"] = TensorSpec((2,), torch.float32, 7)
    return {"full": full, "local": local}


@pytest.mark.world(1, 2, 4)
@pytest.mark.parametrize("strict", [False, True])
@pytest.mark.parametrize("cpu_offload", [False, True])
def test_broadcast_state_dict_matches_the_oracle(world, strict, cpu_offload):
    # Releases before cpu_offload existed are judged without it.
    offload = {"cpu_offload": True} if cpu_offload else {}
    broadcast = with_parameters(sdu._broadcast_state_dict, *offload)
    build, _, meshes = setup(world)

    def check(case: dict[str, Any]) -> None:
        full = build.build(case["full"]) if world.rank == 0 else {}
        theirs, ours = build.build(case["local"]), build.build(case["local"])
        broadcast(full, theirs, world.device, strict=strict, **offload)
        ri.broadcast_state_dict(full, ours, world.device, strict=strict, cpu_offload=cpu_offload)
        assert_trees_identical(theirs, ours)

    spmd_property(world.device, broadcast_cases(meshes, strict_keys=cpu_offload), check)


@pytest.mark.world(1, 2, 4)
def test_distribute_state_dict_matches_the_oracle(world):
    distribute = sdu._distribute_state_dict
    build, _, meshes = setup(world)

    def check(case: dict[str, Any]) -> None:
        full = build.build(case["full"])
        theirs, ours = build.build(case["local"]), build.build(case["local"])
        distribute(full, theirs, world.device)
        ri.distribute_state_dict(full, ours, world.device)
        assert_trees_identical(theirs, ours)

    spmd_property(world.device, broadcast_cases(meshes, strict_keys=False), check)


# ----- bad input ---------------------------------------------------------------


@pytest.mark.world(1, 2)
def test_mismatched_companion_is_refused_by_both(world):
    copy = sdu._copy_state_dict
    source = {"a": {"b": torch.ones(2)}, "c": [torch.ones(1)]}
    for companion, path in (
        ({"a": {"x": torch.ones(2)}, "c": [torch.ones(1)]}, "a"),
        ({"a": {"b": torch.ones(2)}, "c": []}, "c"),
    ):
        with pytest.raises(sdu.CompanionMismatch):
            copy(source, companion)
        with pytest.raises(ri.CompanionMismatch, match=rf"^{path}:"):
            ri.copy_state_dict(source, companion)


@pytest.mark.world(1, 2)
def test_wrong_companion_shape_is_refused_by_both(world):
    copy = sdu._copy_state_dict
    source, companion = {"a": [torch.ones(2, 3)]}, {"a": [torch.zeros(3, 3)]}
    with pytest.raises(RuntimeError):
        copy(source, companion)
    with pytest.raises(ri.CompanionMismatch, match=r"^a\[0\]: torch.float32\[2, 3\] cannot go"):
        ri.copy_state_dict(source, companion)


@pytest.mark.world(1, 2)
def test_wrong_companion_dtype_is_refused_by_the_oracle_and_never_garbled_by_torch(world):
    """Torch's copy may convert silently (``Tensor.copy_`` casts); the oracle refuses.

    Either way the companion must never hold garbage: if torch copies, the
    values are the source's, cast to the companion's dtype.
    """
    copy = sdu._copy_state_dict
    source = {"a": [torch.arange(6, dtype=torch.float32).reshape(2, 3) / 4]}
    companion = {"a": [torch.zeros(2, 3, dtype=torch.float64)]}
    try:
        copied = copy(source, companion)
    except (RuntimeError, ValueError):
        pass
    else:
        assert copied["a"][0].dtype == torch.float64
        assert torch.equal(copied["a"][0], source["a"][0].to(torch.float64))
    with pytest.raises(
        ri.CompanionMismatch, match=r"^a\[0\]: torch.float32\[2, 3\] cannot go .*float64"
    ):
        ri.copy_state_dict(source, companion)


@pytest.mark.world(1, 2)
def test_unsupported_leaf_with_type_check_is_refused_by_both(world):
    gather = sdu._gather_state_dict
    source = {"opt": {"state": [object()]}}
    with pytest.raises(ValueError, match="Unexpected value type"):
        gather(source)
    with pytest.raises(
        ri.UnsupportedValue, match=r"^opt.state\[0\]: unsupported value type object"
    ):
        ri.gather_state_dict(source)


@pytest.mark.world(4)
def test_gather_of_an_fsdp2_tp_model_with_strided_shards(world):
    """FSDP2 over TP shards fc1 as (_StridedShard(0, sf=2), Shard(0)), rows 3+2 per TP half."""

    from conformance.compare import assert_state_dict_equal
    from conformance.models.common import seeded_mlp

    gather = sdu._gather_state_dict
    mesh = world.mesh((2, 2), ("dp", "tp"))
    model = seeded_mlp()
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    tensor_parallel.parallelize_module(
        model,
        mesh["tp"],
        {"fc1": tensor_parallel.ColwiseParallel(), "fc2": tensor_parallel.RowwiseParallel()},
    )
    fully_shard_on(world.device)(model, mesh=mesh["dp"])
    state_dict = model.state_dict()
    assert isinstance(state_dict["fc1.weight"].placements[0], dtensor_placements._StridedShard)
    ours = ri.gather_state_dict(state_dict)
    assert_state_dict_equal(ours, expected)
    assert_trees_identical(gather(state_dict), ours)


@pytest.mark.world(2, 4)  # at one rank FSDP1 does not shard: plain tensors
@pytest.mark.parametrize("cpu_offload", [False, True])
def test_gather_of_fsdp1_sharded_tensors(world, cpu_offload):
    """FSDP1's SHARDED_STATE_DICT holds ShardedTensors, split unevenly over the ranks."""

    from conformance.compare import assert_state_dict_equal
    from conformance.models.common import seeded_mlp

    gather = sdu._gather_state_dict
    model = seeded_mlp()
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    wrapped = fsdp.FullyShardedDataParallel(model, device_id=world.device, use_orig_params=True)
    with (
        quiet_deprecations(),
        fsdp.FullyShardedDataParallel.state_dict_type(
            wrapped, fsdp.StateDictType.SHARDED_STATE_DICT
        ),
    ):
        state_dict = wrapped.state_dict()
    assert isinstance(state_dict["fc1.weight"], sharded_tensor.ShardedTensor)
    ours = ri.gather_state_dict(state_dict, cpu_offload=cpu_offload)
    assert_state_dict_equal(ours, expected)
    assert_trees_identical(gather(state_dict, cpu_offload=cpu_offload), ours)
