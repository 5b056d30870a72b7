"""World specs validate on construction and say why a machine cannot host them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from harness import WorldContext, WorldSpec


def test_resolving_defaults_the_device_type_from_the_backend() -> None:
    assert WorldSpec.resolve("gloo", 2).device_type == "cpu"
    assert WorldSpec.resolve("nccl", 2).device_type == "cuda"
    assert WorldSpec.resolve("gloo", 4, "cuda").label == "gloo/cuda x4"


def test_a_spec_takes_names_already_resolved() -> None:
    with pytest.raises(ValueError, match=r"WorldSpec\.resolve resolves auto"):
        WorldSpec("gloo", 2, "auto")


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (("no_such_ccl", 2), "unknown backend 'no_such_ccl'"),
        (("gloo", 0), "world size must be a positive integer"),
        (("gloo", 2, "tpu"), "unknown device type 'tpu'"),
        (("nccl", 2, "cpu"), "cannot run on device type 'cpu'"),
    ],
)
def test_invalid_specs_are_refused(args: tuple[object, ...], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        WorldSpec.resolve(*args)  # type: ignore[arg-type]


def test_gloo_cpu_world_is_available_here() -> None:
    assert WorldSpec("gloo", 4, "cpu").unavailable_reason() is None


@pytest.mark.skipif(torch.cuda.device_count() >= 2, reason="this machine has GPUs")
def test_cuda_world_without_enough_gpus_says_how_many_it_needs() -> None:
    reason = WorldSpec("gloo", 2, "cuda").unavailable_reason()
    assert reason is not None
    assert "gloo/cuda x2 needs 2 cuda devices (one per rank)" in reason


def test_ranks_that_share_devices_are_bound_in_turn() -> None:
    spec = WorldSpec("gloo", 4, "cuda", ranks_per_device=2)
    assert [spec.device_index(rank) for rank in range(4)] == [0, 0, 1, 1]
    assert spec.devices_needed == 2
    assert spec.label == "gloo/cuda x4 (2 per device)"
    shared = WorldContext(spec, rank=3, local_rank=3, shared_dir=Path("."), launcher="spawn")
    assert shared.device == torch.device("cuda", 1)


def test_nccl_ranks_cannot_share_a_device() -> None:
    with pytest.raises(ValueError, match="nccl runs one rank per device"):
        WorldSpec("nccl", 2, "cuda", ranks_per_device=2)


@pytest.mark.skipif(torch.cuda.device_count() >= 1, reason="this machine has a GPU")
def test_a_shared_cuda_world_without_a_gpu_says_how_many_it_needs() -> None:
    reason = WorldSpec("gloo", 4, "cuda", ranks_per_device=4).unavailable_reason()
    assert reason is not None
    assert "gloo/cuda x4 (4 per device) needs 1 cuda device (4 ranks each)" in reason


@pytest.mark.skipif(torch.distributed.is_nccl_available(), reason="this torch has NCCL")
def test_nccl_world_without_nccl_says_so() -> None:
    assert WorldSpec("nccl", 1, "cuda").unavailable_reason() == (
        "this torch build has no nccl backend"
    )


def context(size: int) -> WorldContext:
    return WorldContext(
        WorldSpec("gloo", size, "cpu"), rank=0, local_rank=0, shared_dir=Path("."), launcher="spawn"
    )


def test_mesh_shape_must_cover_the_world() -> None:
    with pytest.raises(ValueError, match=r"mesh shape \(2, 3\) has 6 ranks; this world has 4"):
        context(4).mesh((2, 3))
    with pytest.raises(ValueError, match="has 2 dims but 1 names"):
        context(4).mesh((2, 2), ("dp",))


def test_context_repr_is_short() -> None:
    assert repr(context(2)) == "<world rank 0 of gloo/cpu x2>"
