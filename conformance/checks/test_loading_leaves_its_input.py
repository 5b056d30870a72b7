"""Loads do not touch their inputs, and loading twice is loading once.

Judged against a copy of the input taken before the load and against the state the first
load left, not against the oracle. Every set and load API reads the state dict it is given.
After the load that dict is as the caller made it: the same keys and containers, every value
bit for bit. Loading the same dict again leaves the model (each parameter's local values, the
buffers) and the optimizer (state and hyper-parameters) exactly as the first load did. The
second load is given an identical copy, so that it is judged apart from what the first did to
its input.

The loads, by family (one test per cell and family, each load of the family in turn):

- ``set_model_state_dict`` and ``set_optimizer_state_dict`` with each option: sharded, full,
  not strict for the model, flattened for the optimizer, and ``broadcast_from_rank0`` (rank 0
  alone passes the full dict, the others an empty one);
- ``set_state_dict`` sharded, and with not strict, full and flattened at once;
- ``set_state_dict`` broadcast from rank 0, as a family of its own;
- ``nn.Module.load_state_dict``;
- on FSDP1 cells, ``load_state_dict`` under each state-dict type every rank loads, and
  ``optim_state_dict_to_load`` under each. LOCAL is not loaded on ``use_orig_params`` cells,
  which refuse their own local state dict (see test_fsdp1_model_state's manifest entries);
- on FSDP1 cells, the legacy ``shard_full_optim_state_dict``,
  ``scatter_full_optim_state_dict`` and ``flatten_sharded_optim_state_dict``.

Each cell runs at its smallest world size above one and at 4. Each input is read after two
Adam steps, and one more step comes before each load.

A failure names every load of the family that broke the contract. For each, it gives the
first key paths where its input changed, with both values. Or it gives those where its second
load left another state than the first.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from conformance._upstream import dsd, fsdp, quiet_deprecations
from conformance.cells import PARALLELISMS, Parallelism, first_size_and_four
from conformance.compare import whole_model_state, whole_optimizer_state
from conformance.models.common import train
from conformance.models.optimizers import adam
from conformance.models.zoo import model_of
from conformance.training import (
    differences,
    fsdp1_api,
    snapshot,
    torch_model_load,
    torch_model_state_dict,
    tree_leaves,
    under_optim_settings,
)

Model = torch.nn.Module
Optimizer = torch.optim.Optimizer
Read = Callable[[Model, Optimizer, int], Any]  # (model, optimizer, rank) -> the input


@dataclass(frozen=True)
class Load:
    """One load: ``read`` makes its input from the trained objects (what a caller would hold),
    ``load`` applies it."""

    name: str
    read: Read
    load: Callable[[Model, Optimizer, Any], None]


_DSD_OPTIONS: dict[str, dict[str, bool]] = {
    "sharded": {},
    "full": {"full_state_dict": True},
    "not_strict": {"strict": False},
    "flattened": {"flatten_optimizer_state_dict": True},
    "broadcast": {"full_state_dict": True, "broadcast_from_rank0": True},
    "every_option": {
        "full_state_dict": True,
        "strict": False,
        "flatten_optimizer_state_dict": True,
    },
}


def _dsd_options(label: str, *, reading: bool = False) -> Any:
    """The options of ``label``; a read leaves out ``broadcast_from_rank0``, which only loads
    take."""
    options = dict(_DSD_OPTIONS[label])
    if reading:
        options.pop("broadcast_from_rank0", None)
    return dsd.StateDictOptions(**options)


def _dsd_family(
    name: str,
    labels: tuple[str, ...],
    read: Callable[..., Any],
    load: Callable[..., Any],
    nothing: Any,
    whole: Callable[[Any], Any],
) -> Callable[[Parallelism], list[Load]]:
    """A setter of ``torch.distributed.checkpoint.state_dict`` under each option set of
    ``labels``: its input is what the matching getter gives with the same options, and under
    ``broadcast`` on rank 0 alone (the others pass ``nothing``, empty, as a user would) the
    whole model's (``whole`` of the full read: every stage's, on a pipeline).
    ``read(model, optimizer, options)``; ``load(model, optimizer, given, options)``."""

    def held(label: str, rank: int, read_now: Callable[[], Any]) -> Any:
        given = read_now()  # on every rank: a full read is a collective
        if label != "broadcast":
            return given
        given = whole(given)
        return given if rank == 0 else nothing

    def loads(_: Parallelism) -> list[Load]:
        return [
            Load(
                f"{name}({label})",
                lambda m, opt, rank, label=label: held(
                    label, rank, lambda: read(m, opt, _dsd_options(label, reading=True))
                ),
                lambda m, opt, given, label=label: load(m, opt, given, _dsd_options(label)),
            )
            for label in labels
        ]

    return loads


_model_loads = _dsd_family(
    "set_model_state_dict",
    ("sharded", "full", "not_strict", "broadcast"),
    lambda m, _, o: dsd.get_model_state_dict(m, options=o),
    lambda m, _, given, o: dsd.set_model_state_dict(m, given, options=o),
    nothing={},
    whole=whole_model_state,
)
_optimizer_loads = _dsd_family(
    "set_optimizer_state_dict",
    ("sharded", "full", "flattened", "broadcast"),
    lambda m, opt, o: dsd.get_optimizer_state_dict(m, opt, options=o),
    lambda m, opt, given, o: dsd.set_optimizer_state_dict(m, opt, given, options=o),
    nothing={},
    whole=whole_optimizer_state,
)


def _state_family(labels: tuple[str, ...]) -> Callable[[Parallelism], list[Load]]:
    return _dsd_family(
        "set_state_dict",
        labels,
        lambda m, opt, o: dsd.get_state_dict(m, opt, options=o),
        lambda m, opt, given, o: dsd.set_state_dict(
            m, opt, model_state_dict=given[0], optim_state_dict=given[1], options=o
        ),
        nothing=({}, {}),
        whole=lambda both: (whole_model_state(both[0]), whole_optimizer_state(both[1])),
    )


_state_loads = _state_family(("sharded", "every_option"))
# A family of its own: releases where its empty dicts hang (test_upstream_failures's
# test_broadcast_from_rank0_with_empty_dicts_on_other_ranks) skip it alone.
_state_broadcast_loads = _state_family(("broadcast",))


def _module_loads(_: Parallelism) -> list[Load]:
    return [
        Load(
            "nn.Module.load_state_dict",
            lambda m, _, __: m.state_dict(),
            lambda m, _, given: m.load_state_dict(given),
        )
    ]


def _fsdp1_model_loads(cell: Parallelism) -> list[Load]:
    kinds = ["full", "sharded", "sharded_offloaded"]
    if cell.flat_params and not cell.fsdp1_mesh:  # see the module's docstring
        kinds += ["local", "local_offloaded"]
    return [
        Load(
            f"FSDP1 load_state_dict ({kind})",
            lambda m, _, __, kind=kind: torch_model_state_dict(m, kind),
            lambda m, _, given, kind=kind: torch_model_load(m, given, kind),
        )
        for kind in kinds
    ]


def _fsdp1_optimizer_loads(_: Parallelism) -> list[Load]:
    fsdp1 = fsdp.FullyShardedDataParallel
    return [
        Load(
            f"FSDP1 optim_state_dict_to_load ({kind})",
            lambda m, opt, _, kind=kind: under_optim_settings(
                m, kind, lambda: fsdp1.optim_state_dict(m, opt)
            ),
            lambda m, opt, given, kind=kind: opt.load_state_dict(
                under_optim_settings(m, kind, lambda: fsdp1.optim_state_dict_to_load(m, opt, given))
            ),
        )
        for kind in ("full", "full_offloaded", "sharded")
    ]


def _legacy(save: str, load: str, **save_options: Any) -> Load:
    """A legacy FSDP1 load: its input is what ``save`` gives (on rank 0 alone for
    ``scatter_full_optim_state_dict``), and what ``load`` returns goes into the optimizer."""
    scatter = load == "scatter_full_optim_state_dict"

    def read(model: Model, optim: Optimizer, rank: int) -> Any:
        saved = fsdp1_api(save)(model, optim, **save_options)
        return saved if rank == 0 or not scatter else None

    def apply(model: Model, optim: Optimizer, given: Any) -> None:
        optim.load_state_dict(fsdp1_api(load)(given, model, optim=optim))

    return Load(load, read, apply)


def _legacy_loads(_: Parallelism) -> list[Load]:
    return [
        _legacy("full_optim_state_dict", "shard_full_optim_state_dict", rank0_only=False),
        _legacy("full_optim_state_dict", "scatter_full_optim_state_dict"),
        _legacy("sharded_optim_state_dict", "flatten_sharded_optim_state_dict"),
    ]


Family = Callable[[Parallelism], list[Load]]
EVERY_CELL: dict[str, Family] = {
    "set_model_state_dict": _model_loads,
    "set_optimizer_state_dict": _optimizer_loads,
    "set_state_dict": _state_loads,
    "set_state_dict_broadcast": _state_broadcast_loads,
}
FAMILIES: dict[str, tuple[Family, Callable[[Parallelism], bool]]] = {
    **{name: (family, lambda _: True) for name, family in EVERY_CELL.items()},
    "nn.Module.load_state_dict": (_module_loads, lambda cell: not cell.fsdp1),
    "fsdp1_load_state_dict": (_fsdp1_model_loads, lambda cell: cell.fsdp1),
    "fsdp1_optim_state_dict_to_load": (_fsdp1_optimizer_loads, lambda cell: cell.fsdp1),
    "fsdp1_legacy_optim_loads": (_legacy_loads, lambda cell: cell.fsdp1),
}


def _applies(size: int, **params: Any) -> bool:
    cell = PARALLELISMS[params["cell"]]
    return FAMILIES[params["family"]][1](cell) and first_size_and_four("cell")(size, **params)


def _broken(load: Load, model: Model, optimizer: Optimizer, rank: int, step: int) -> list[str]:
    """What ``load`` broke: it reads an input taken now, one more step is trained, it loads
    the input, then an identical copy of it again. The second load takes the copy so that it
    judges idempotence alone: a load that changed its input is reported for that, not also
    for what the changed input then does (a broadcast load whose input became DTensors would
    hang in its second broadcast, pytorch#164843). Every rank makes both loads whatever it
    finds, as their collectives need."""
    # A copy, as a checkpoint holds it: what a read gives may alias the model's own tensors.
    given = copy.deepcopy(load.read(model, optimizer, rank))
    again = copy.deepcopy(given)
    as_given = tree_leaves(given)
    train(model, optimizer, steps=1, start=step)
    with quiet_deprecations():
        load.load(model, optimizer, given)
    once = snapshot(model, optimizer, None)
    changed = differences(tree_leaves(given), as_given, ("after the load", "as given"))
    with quiet_deprecations():
        load.load(model, optimizer, again)
    twice = differences(snapshot(model, optimizer, None), once, ("loaded twice", "loaded once"))
    broken = []
    if changed:
        broken.append(f"{load.name} changed its input: " + "; ".join(changed))
    if twice:
        broken.append(
            f"{load.name} a second time changed what the first load left: " + "; ".join(twice)
        )
    return broken


@pytest.mark.world(2, 4, applies=_applies)
@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("cell", sorted(PARALLELISMS))
def test_loading_leaves_its_input_and_loading_twice_is_loading_once(world, cell, family):
    parallelism = PARALLELISMS[cell]
    model = model_of(parallelism, world)
    optimizer = adam(model)
    train(model, optimizer, steps=2)
    broken = []
    for step, load in enumerate(FAMILIES[family][0](parallelism), start=2):
        broken += _broken(load, model, optimizer, world.rank, step)
    assert not broken, "\n".join(broken)
