"""How each cell wraps a model: the wrappers its descriptor names (``_parallelisms.py``).

Every wrapper takes a freshly seeded model of ``conformance.models.common`` and the rank's
world context, and returns the parallelised model. A model names its ``units`` (the
submodules a nested wrapping wraps on their own) and, where tensor parallelism applies to it,
its ``tp_plan()``.
"""

from __future__ import annotations

from typing import Any, Literal

import pytest
from torch import nn

from conformance._upstream import (
    composable,
    ddp,
    fsdp,
    fully_shard_on,
    quiet_deprecations,
    tensor_parallel,
)
from conformance.cells._descriptor import Wrap
from conformance.cells._precision import Precision
from conformance.cells._subworld import SubWorld

# What FSDP1 is given to shard over (``wrap_fsdp1``).
Fsdp1Groups = Literal["as_strategy", "mesh", "process_groups"]


def wrap_ddp(model: nn.Module, world: Any) -> nn.Module:
    return ddp.DistributedDataParallel(model, device_mesh=world.mesh(world.size, ("dp",)))


def wrap_replicate(model: nn.Module, world: Any) -> nn.Module:
    """Composable ``replicate``: DDP applied in place, the model's own class and FQNs kept."""
    return composable.replicate(model, device_mesh=world.mesh(world.size, ("dp",)))


def wrap_fsdp1(
    strategy: str,
    use_orig_params: bool,
    nested: bool,
    precision: Precision | None = None,
    groups: Fsdp1Groups = "as_strategy",
) -> Wrap:
    """FSDP1 under ``strategy``; ``groups`` says what it is given to shard over:

    - ``as_strategy``: HYBRID_SHARD a (replicate, shard) device mesh, the others none (the
      world's group, or a sub-world's);
    - ``mesh``: a device mesh always (1-D but for HYBRID_SHARD): sharded state dicts of
      DTensors;
    - ``process_groups``: process groups always (HYBRID_SHARD the mesh's (shard, replicate)
      pair): sharded state dicts of ShardedTensors.
    """

    def wrap(model: nn.Module, world: Any) -> nn.Module:
        options: dict[str, Any] = {
            "device_id": world.device,
            "use_orig_params": use_orig_params,
            "sharding_strategy": fsdp.ShardingStrategy[strategy],
            **_fsdp1_groups(strategy, groups, world),
        }
        if precision is not None:
            options["mixed_precision"] = precision.fsdp1_policy()
        with quiet_deprecations():
            if nested:
                for unit in units(model):
                    wrapped = fsdp.FullyShardedDataParallel(model.get_submodule(unit), **options)
                    replace_submodule(model, unit, wrapped)
            return fsdp.FullyShardedDataParallel(model, **options)

    return wrap


def _fsdp1_groups(strategy: str, groups: Fsdp1Groups, world: Any) -> dict[str, Any]:
    """FSDP1's ``device_mesh`` or ``process_group`` option for ``wrap_fsdp1``'s ``groups``."""
    hybrid = strategy == "HYBRID_SHARD"
    if groups == "mesh" or (groups == "as_strategy" and hybrid):
        return {"device_mesh": _hybrid_mesh(world) if hybrid else world.mesh(world.size, ("dp",))}
    if hybrid:  # FSDP1 takes the pair as (intra-node: shard, inter-node: replicate)
        mesh = _hybrid_mesh(world)
        return {"process_group": (mesh.get_group("shard"), mesh.get_group("replicate"))}
    if isinstance(world, SubWorld):
        return {"process_group": world.group}
    return {}


def _hybrid_mesh(world: Any) -> Any:
    """Replicas of two-rank shard groups: a (size / 2, 2) mesh of replicate and shard dims."""
    return world.mesh((world.size // 2, 2), ("replicate", "shard"))


def wrap_fsdp2(
    reshard_after_forward: bool, hybrid: bool = False, precision: Precision | None = None
) -> Wrap:
    def wrap(model: nn.Module, world: Any) -> nn.Module:
        shard = fully_shard_on(world.device)
        mesh = _hybrid_mesh(world) if hybrid else world.mesh(world.size, ("dp",))
        options: dict[str, Any] = {"mesh": mesh, "reshard_after_forward": reshard_after_forward}
        if precision is not None:
            options["mp_policy"] = precision.fsdp2_policy()
        for unit in units(model):
            shard(model.get_submodule(unit), **options)
        shard(model, **options)
        return model

    return wrap


def units(model: nn.Module) -> tuple[str, ...]:
    """The submodules of ``model`` that nested wrappings wrap on their own."""
    found: tuple[str, ...] = getattr(model, "units", ())
    return found


def replace_submodule(model: nn.Module, path: str, module: nn.Module) -> None:
    """Put ``module`` where ``model`` holds the submodule at the dotted ``path``."""
    parent, _, name = path.rpartition(".")
    setattr(model.get_submodule(parent), name, module)


def _tensor_parallel(model: nn.Module, mesh: Any) -> nn.Module:
    plan = getattr(model, "tp_plan", None)
    if plan is None:
        pytest.skip(f"{type(model).__name__} has no tensor-parallel plan")
    return tensor_parallel.parallelize_module(model, mesh, plan())


def wrap_tp(model: nn.Module, world: Any) -> nn.Module:
    return _tensor_parallel(model, world.mesh(world.size, ("tp",)))


def wrap_fsdp2_tp(model: nn.Module, world: Any) -> nn.Module:
    """FSDP2 over the ``dp`` dim of a (2, size / 2) mesh, around the model made
    tensor-parallel over its ``tp`` dim."""
    mesh = world.mesh((2, world.size // 2), ("dp", "tp"))
    return _fully_shard_tensor_parallel(model, world, mesh["dp"], mesh["tp"])


def wrap_hsdp2_tp(model: nn.Module, world: Any) -> nn.Module:
    """HSDP (FSDP2 replicated over ``dp_replicate``, sharded over ``dp_shard``) on a
    (2, 2, size / 4) mesh, around the model made tensor-parallel over its ``tp`` dim: a
    parameter sharded on every dim of a 3-D mesh."""
    mesh = world.mesh((2, 2, world.size // 4), ("dp_replicate", "dp_shard", "tp"))
    return _fully_shard_tensor_parallel(model, world, mesh["dp_replicate", "dp_shard"], mesh["tp"])


def _fully_shard_tensor_parallel(
    model: nn.Module, world: Any, data_mesh: Any, tensor_mesh: Any
) -> nn.Module:
    shard = fully_shard_on(world.device)
    model = _tensor_parallel(model, tensor_mesh)
    for unit in units(model):
        shard(model.get_submodule(unit), mesh=data_mesh)
    shard(model, mesh=data_mesh)
    return model


def wrap_fsdp1_tp(model: nn.Module, world: Any) -> nn.Module:
    """FSDP1 (FULL_SHARD, ``use_orig_params``) over the ``dp`` dim of a (2, size / 2) mesh,
    around the model made tensor-parallel over its ``tp`` dim."""
    mesh = world.mesh((2, world.size // 2), ("dp", "tp"))
    model = _tensor_parallel(model, mesh["tp"])
    with quiet_deprecations():
        return fsdp.FullyShardedDataParallel(
            model, device_id=world.device, device_mesh=mesh["dp"], use_orig_params=True
        )
