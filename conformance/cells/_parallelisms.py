"""The parallelisms of the matrix: how each wraps a model, and at which world sizes it exists.

Every wrapper takes a freshly seeded model of ``conformance.models.common`` and the
rank's world context, and returns the parallelised model. A model names its
``units`` (the submodules a nested wrapping wraps on their own) and, where
tensor parallelism applies to it, its ``tp_plan()``. Each wrapper is a cell a
user can name in a test id.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

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
from conformance.cells._experts import split_experts
from conformance.cells._pipeline import split_into_stages
from conformance.cells._subworld import SubWorld

Wrap = Callable[[nn.Module, Any], nn.Module]
DEFAULT_MODEL = "mlp"  # the zoo's model (conformance/models/zoo.py) that every cell trains


@dataclass(frozen=True)
class Parallelism:
    """A named way to parallelise the model; ``sizes`` are the world sizes it runs at.

    ``exact``: its full state dicts equal the single-process ones bit for bit
    (data parallelism averages identical gradients); tensor parallelism sums
    partial products in another order, so it is compared within tolerances.
    """

    name: str
    wrap: Wrap
    sizes: tuple[int, ...]
    exact: bool = True
    fsdp1: bool = False
    flat_params: bool = False  # FSDP1 without use_orig_params: one flat parameter per wrap
    nested: bool = False  # the model's units are wrapped on their own, inside the root
    fsdp1_mesh: bool = False  # FSDP1 given a device mesh, which refuses LOCAL_STATE_DICT
    fsdp2: bool = False  # built with fully_shard, which some releases cannot run on CPU
    # Each rank holds a part of the model alone at more than one rank: a pipeline stage's
    # layers, its experts (conformance/compare/_held.py).
    partial: bool = False
    model_id: str = (
        DEFAULT_MODEL  # the zoo's model the cell trains (DEFAULT_MODEL, or one it needs)
    )
    # The oracle models the cell's state dicts; tests that compare with the oracle (their
    # names say so) skip a cell it does not, naming it (conformance/conftest.py).
    oracle_models: bool = True

    def __post_init__(self) -> None:
        if not self.sizes or any(size < 1 for size in self.sizes):
            raise ValueError(f"{self.name}: world sizes must be positive, got {self.sizes}")

    def parallelise(self, model: nn.Module, world: Any) -> nn.Module:
        """``model`` moved to the rank's device (a CUDA device under NCCL), then wrapped."""
        return self.wrap(model.to(world.device), world)

    def supports(self, world_size: int) -> bool:
        return world_size in self.sizes

    @property
    def first_size(self) -> int:
        """The smallest world size above one rank at which the cell runs: where tests that
        need not run at every size cover it."""
        return min(size for size in self.sizes if size >= 2)

    def skip_unless_runnable(self, device: Any) -> None:
        """Skip, naming why, where this release cannot build the cell on ``device``. Tests
        that build a cell on some ranks only call it on every rank first: a skip on some
        ranks would leave the others waiting in a collective."""
        if self.fsdp2:
            fully_shard_on(device)

    def require(self, world_size: int) -> None:
        """Refuse a world size the cell lacks: the test's ``applies`` should have left it out."""
        if not self.supports(world_size):
            raise ValueError(
                f"{self.name} runs at world sizes {self.sizes}, not {world_size}: give the "
                "test's world marker applies=exists_at_size(...) or first_size_only(...)"
            )


Applies = Callable[..., bool]  # the world marker's ``applies(size, **params)``


def exists_at_size(param: str = "name") -> Applies:
    """``applies`` for the world marker: the cell named by the parametrize argument ``param``
    runs at the world size. Ids of cells that do not are not collected."""

    def applies(size: int, **params: Any) -> bool:
        return PARALLELISMS[params[param]].supports(size)

    return applies


def whole_model_at_size(param: str = "name") -> Applies:
    """``applies`` for the world marker: the cell runs at the world size and every rank holds
    the whole model there (a partial cell is whole at one rank only): for checks of a
    submodule every rank must have."""

    def applies(size: int, **params: Any) -> bool:
        cell = PARALLELISMS[params[param]]
        return cell.supports(size) and not (cell.partial and size > 1)

    return applies


def first_size_only(param: str = "name", every_size_if: dict[str, Any] | None = None) -> Applies:
    """``applies`` for the world marker: only the cell's ``first_size``, or every size it has
    where the parameters match ``every_size_if`` (e.g. ``{"recipe": "adam"}``)."""

    def applies(size: int, **params: Any) -> bool:
        cell = PARALLELISMS[params[param]]
        everywhere = every_size_if is not None and all(
            params[key] == value for key, value in every_size_if.items()
        )
        return cell.supports(size) and (everywhere or size == cell.first_size)

    return applies


def first_size_and_four(param: str = "name") -> Applies:
    """``applies`` for the world marker: the cell's ``first_size``, and 4 ranks where it
    runs there."""

    def applies(size: int, **params: Any) -> bool:
        cell = PARALLELISMS[params[param]]
        return cell.supports(size) and size in (cell.first_size, 4)

    return applies


def flattened_between(*names: str) -> bool | None:
    """The optimizer state's form for a checkpoint that passes between the cells ``names``
    (``conformance._dcp.training_state``): flattened where one is partial (a pipeline, experts),
    so that both sides read and write the form parts need; else each model's own (None)."""
    return True if any(PARALLELISMS[n].partial for n in names if n in PARALLELISMS) else None


TP_TOLERANCE = {"rtol": 1e-5, "atol": 1e-7}


def comparison_tolerance(*cells: Parallelism) -> dict[str, float]:
    """Exact when every cell is; else TP's tolerances (see test_full_state_dict's docstring)."""
    return {} if all(cell.exact for cell in cells) else TP_TOLERANCE


def _ddp(model: nn.Module, world: Any) -> nn.Module:
    return ddp.DistributedDataParallel(model, device_mesh=world.mesh(world.size, ("dp",)))


def _replicate(model: nn.Module, world: Any) -> nn.Module:
    """Composable ``replicate``: DDP applied in place, the model's own class and FQNs kept."""
    return composable.replicate(model, device_mesh=world.mesh(world.size, ("dp",)))


def _fsdp1(strategy: str, use_orig_params: bool, nested: bool) -> Wrap:
    def wrap(model: nn.Module, world: Any) -> nn.Module:
        hybrid = strategy == "HYBRID_SHARD"
        options: dict[str, Any] = {
            "device_id": world.device,
            "use_orig_params": use_orig_params,
            "sharding_strategy": fsdp.ShardingStrategy[strategy],
        }
        mesh = _hybrid_mesh(world) if hybrid else None
        if isinstance(world, SubWorld):
            options["process_group"] = world.group
        with quiet_deprecations():
            if nested:
                for unit in units(model):
                    wrapped = fsdp.FullyShardedDataParallel(
                        model.get_submodule(unit), device_mesh=mesh, **options
                    )
                    _replace_submodule(model, unit, wrapped)
            return fsdp.FullyShardedDataParallel(model, device_mesh=mesh, **options)

    return wrap


def _hybrid_mesh(world: Any) -> Any:
    """Replicas of two-rank shard groups: a (size / 2, 2) mesh of replicate and shard dims."""
    return world.mesh((world.size // 2, 2), ("replicate", "shard"))


def _fsdp2(reshard_after_forward: bool, hybrid: bool = False) -> Wrap:
    def wrap(model: nn.Module, world: Any) -> nn.Module:
        shard = fully_shard_on(world.device)
        mesh = _hybrid_mesh(world) if hybrid else world.mesh(world.size, ("dp",))
        for unit in units(model):
            shard(model.get_submodule(unit), mesh=mesh, reshard_after_forward=reshard_after_forward)
        shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward)
        return model

    return wrap


def units(model: nn.Module) -> tuple[str, ...]:
    """The submodules of ``model`` that nested wrappings wrap on their own."""
    found: tuple[str, ...] = getattr(model, "units", ())
    return found


def _replace_submodule(model: nn.Module, path: str, module: nn.Module) -> None:
    parent, _, name = path.rpartition(".")
    setattr(model.get_submodule(parent), name, module)


def _tensor_parallel(model: nn.Module, mesh: Any) -> nn.Module:
    plan = getattr(model, "tp_plan", None)
    if plan is None:
        pytest.skip(f"{type(model).__name__} has no tensor-parallel plan")
    return tensor_parallel.parallelize_module(model, mesh, plan())


def _tp(model: nn.Module, world: Any) -> nn.Module:
    return _tensor_parallel(model, world.mesh(world.size, ("tp",)))


def _fsdp2_tp(model: nn.Module, world: Any) -> nn.Module:
    shard = fully_shard_on(world.device)
    mesh = world.mesh((2, world.size // 2), ("dp", "tp"))
    model = _tensor_parallel(model, mesh["tp"])
    for unit in units(model):
        shard(model.get_submodule(unit), mesh=mesh["dp"])
    shard(model, mesh=mesh["dp"])
    return model


def _fsdp1_tp(model: nn.Module, world: Any) -> nn.Module:
    """FSDP1 (FULL_SHARD, ``use_orig_params``) over the ``dp`` dim of a (2, size / 2) mesh,
    around the model made tensor-parallel over its ``tp`` dim."""
    mesh = world.mesh((2, world.size // 2), ("dp", "tp"))
    model = _tensor_parallel(model, mesh["tp"])
    with quiet_deprecations():
        return fsdp.FullyShardedDataParallel(
            model, device_id=world.device, device_mesh=mesh["dp"], use_orig_params=True
        )


def _catalogue() -> dict[str, Parallelism]:
    cells = [
        Parallelism("ddp", _ddp, (1, 2, 4)),
        Parallelism("replicate", _replicate, (1, 2, 4)),
        Parallelism("pp", split_into_stages, (1, 2, 4), partial=True),
        Parallelism("ep", split_experts, (1, 2, 4), fsdp2=True, partial=True, model_id="moe"),
        Parallelism("fsdp2", _fsdp2(reshard_after_forward=True), (1, 2, 4), fsdp2=True),
        Parallelism(
            "fsdp2_keep_unsharded", _fsdp2(reshard_after_forward=False), (2, 4), fsdp2=True
        ),
        Parallelism("hsdp2", _fsdp2(True, hybrid=True), (4,), fsdp2=True),
        Parallelism("tp", _tp, (2, 4), exact=False),
        Parallelism("fsdp2_tp", _fsdp2_tp, (4,), exact=False, fsdp2=True),
        Parallelism(
            "fsdp1_tp",
            _fsdp1_tp,
            (4,),
            exact=False,
            fsdp1=True,
            fsdp1_mesh=True,
            oracle_models=False,
        ),
    ]
    for strategy in ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD"):
        for orig in (True, False):
            for nested in (False, True):
                name = f"fsdp1_{strategy.lower()}_{'orig' if orig else 'flat'}"
                name += "_nested" if nested else ""
                sizes = (4,) if strategy == "HYBRID_SHARD" else (2, 4)
                wrap = _fsdp1(strategy, orig, nested)
                cells.append(
                    Parallelism(
                        name,
                        wrap,
                        sizes,
                        fsdp1=True,
                        flat_params=not orig,
                        nested=nested,
                        fsdp1_mesh=strategy == "HYBRID_SHARD",
                    )
                )
    return {cell.name: cell for cell in cells}


PARALLELISMS = _catalogue()
