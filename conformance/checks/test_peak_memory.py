"""Memory is part of the contract: each state-dict operation's peak per rank stays in its bound.

Every parallelism of the matrix at 2 and 4 ranks builds ``conformance.models.sized`` and takes
one step. That model has about 40 MiB of parameters, 120 MiB with Adam's state, per world.
Then it runs these on its state dicts:

- each utility of ``torch/distributed/_state_dict_utils.py``;
- ``get_model_state_dict`` / ``get_optimizer_state_dict`` / ``set_*`` with every combination
  of ``full_state_dict``, ``cpu_offload`` and ``broadcast_from_rank0``;
- ``dcp.save`` and ``dcp.load`` of the sharded state dicts;
- on FSDP1, ``FSDP.optim_state_dict`` under each FULL and SHARDED config, and
  ``FSDP.optim_state_dict_to_load`` of its results.

Every rank's peak is measured over its own baseline (``harness.memory``). The bound of each
call comes from the contract and the tensors' sizes and placements alone
(``reference_impl.peak_memory``). A measured slack is added
(``conformance._memory.SLACK_BYTES``). So a build that returns the right values while holding
one more copy of the model fails here. A failure names the rank, the operation, the measured
peak, the bound, and the bytes of the largest tensor and of the whole state dict. Values are
judged elsewhere (``test_state_dict_utils.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import Any

import pytest
import torch

import reference_impl as ri
from conformance._upstream import dcp, dsd, sdu
from conformance.cells import PARALLELISMS, MemoryModel, Parallelism, memory_measured
from conformance.compare import Measured, assert_within_bounds, measure, skip_without_a_probe
from conformance.training import (
    OPTIM_ORACLE_OPTIONS,
    _fsdp1,
    fsdp1_api,
    sized_model_after_a_step,
    under_optim_settings,
)
from reference_impl import peak_memory as bounds

CELLS = memory_measured()  # the cells with a memory model (conformance/cells/_descriptor.py)


def _memory_model(name: str) -> MemoryModel:
    model = PARALLELISMS[name].memory
    assert model is not None, f"{name} has no memory model"
    return model


def applies(size: int, name: str) -> bool:
    return size in (2, 4) and PARALLELISMS[name].supports(size)


def sized_state(cell: Parallelism, world: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The sized model's state dict in ``cell`` after one Adam step (FSDP1's sharded one)
    and its optimizer's own state dict."""
    model, optimizer = sized_model_after_a_step(cell, world)
    if cell.fsdp1:
        model_state = _fsdp1.torch_model_state_dict(model, "sharded", world.device)
    else:
        model_state = dict(model.state_dict())
    return model_state, optimizer.state_dict()


def measured_gathers_and_offloads(world: Any, state: dict[str, Any]) -> list[Measured]:
    """Gathers everywhere kept on the device, and kept on rank 0 alone offloaded (each
    option both ways); offloads everywhere and to rank 0."""
    found = []
    for ranks_only, cpu_offload in (((), False), ((0,), True)):
        bound = bounds.gather_state_dict_peak(
            state, rank=world.rank, ranks_only=ranks_only, cpu_offload=cpu_offload
        )
        gather = partial(
            sdu._gather_state_dict, state, ranks_only=ranks_only, cpu_offload=cpu_offload
        )
        found.append(measure(world, bound, gather))
    for ranks_only in ((), (0,)):
        bound = bounds.offload_state_dict_to_cpu_peak(state, rank=world.rank, ranks_only=ranks_only)
        offload = partial(sdu._offload_state_dict_to_cpu, state, ranks_only=ranks_only)
        found.append(measure(world, bound, offload))
    return found


def measured_host_copies(world: Any, state: dict[str, Any]) -> list[Measured]:
    companion = ri.create_cpu_state_dict(state)
    ri.copy_state_dict(state, companion)  # buffers in use, as a stager's are: resident
    return [
        measure(
            world,
            bounds.create_cpu_state_dict_peak(state),
            lambda: sdu._create_cpu_state_dict(state),
        ),
        measure(
            world,
            bounds.copy_state_dict_peak(state),
            lambda: sdu._copy_state_dict(state, companion),
        ),
    ]


def measured_broadcast_and_distribution(world: Any, model_state: dict[str, Any]) -> list[Measured]:
    """Rank 0's full model state into every rank's own, broadcast and then distributed (every
    rank holding it); the full dicts come from the oracle's gather, before measuring."""
    full = ri.gather_state_dict(model_state, ranks_only=(0,))
    broadcast_into = dict(model_state)
    found = [
        measure(
            world,
            bounds.broadcast_state_dict_peak(broadcast_into, world.device),
            partial(sdu._broadcast_state_dict, full, broadcast_into, world.device),
        )
    ]
    del full, broadcast_into
    everywhere = ri.gather_state_dict(model_state)
    distribute_into = dict(model_state)
    found.append(
        measure(
            world,
            bounds.distribute_state_dict_peak(distribute_into, world.device),
            partial(sdu._distribute_state_dict, everywhere, distribute_into, world.device),
        )
    )
    return found


@pytest.mark.world(2, 4, applies=applies)
@pytest.mark.parametrize("name", CELLS)
def test_state_dict_utilities_stay_within_their_memory_bounds(world, name):
    skip_without_a_probe()
    model_state, optimizer_state = sized_state(PARALLELISMS[name], world)
    state = {"model": model_state, "optim": optimizer_state}
    measured = [
        *measured_gathers_and_offloads(world, state),
        *measured_host_copies(world, state),
        *measured_broadcast_and_distribution(world, model_state),
    ]
    assert_within_bounds(world, f"w{world.size}-{name}", measured)


FULL_OFFLOAD = {"full_state_dict": True, "cpu_offload": True}
GET_OPTIONS = [
    {"full_state_dict": full, "cpu_offload": offload}
    for full in (False, True)
    for offload in (False, True)
]


def _words(options: dict[str, bool]) -> str:
    return ", ".join(f"{key}={value}" for key, value in options.items())


def state_getters(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> dict[str, Callable[..., dict[str, Any]]]:
    """``get_model_state_dict`` and ``get_optimizer_state_dict`` of the pair, by part; called
    without options, what the model and optimizer hold (their sharded state dicts)."""
    return {
        "model": partial(dsd.get_model_state_dict, model),
        "optim": partial(dsd.get_optimizer_state_dict, model, optimizer),
    }


def fsdp1_unit_bytes(cell: Parallelism, state: Any) -> int | None:
    """FSDP1's largest unit's full state: the whole model's, in the cells measured here
    (they wrap the model as one unit); None where the state dict is the model's tensors."""
    return bounds.unsharded_unit_bytes(state) if cell.fsdp1 else None


@pytest.mark.world(2, 4, applies=applies)
@pytest.mark.parametrize("name", CELLS)
def test_get_state_dict_stays_within_its_memory_bound(world, name):
    """``get_model_state_dict`` and ``get_optimizer_state_dict`` with each combination of
    ``full_state_dict`` and ``cpu_offload``, bounded by the state the model and optimizer
    hold (their sharded state dicts, taken before measuring)."""
    skip_without_a_probe()
    cell = PARALLELISMS[name]
    model, optimizer = sized_model_after_a_step(cell, world)
    getters = state_getters(model, optimizer)
    held = {part: get() for part, get in getters.items()}
    measured = []
    for part, get in getters.items():
        unit = fsdp1_unit_bytes(cell, held[part])
        for options in GET_OPTIONS:
            if cell.fsdp1 and options == FULL_OFFLOAD:
                continue  # crashes FSDP1: test_upstream_failures.py holds it
            bound = bounds.get_state_dict_peak(
                held[part], rank=world.rank, fsdp1_unit_bytes=unit, **options
            )
            bound = replace(bound, operation=f"get_{part}_state_dict({_words(options)})")
            call = partial(get, options=dsd.StateDictOptions(**options))
            measured.append(measure(world, bound, call))
    assert_within_bounds(world, f"w{world.size}-{name}-get", measured)


SET_CELLS = [name for name in CELLS if _memory_model(name).full_loads]


@pytest.mark.world(2, 4, applies=applies)
@pytest.mark.parametrize("name", SET_CELLS)
def test_set_state_dict_stays_within_its_memory_bound(world, name):
    """``set_model_state_dict`` and ``set_optimizer_state_dict`` from full state dicts held
    by every rank, and broadcast from rank 0's (the others pass ``{}``), bounded by the
    state the model and optimizer hold."""
    skip_without_a_probe()
    cell = PARALLELISMS[name]
    model, optimizer = sized_model_after_a_step(cell, world)
    getters = state_getters(model, optimizer)
    held = {part: get() for part, get in getters.items()}
    setters = {
        "model": lambda state, options: dsd.set_model_state_dict(model, state, options=options),
        "optim": lambda state, options: dsd.set_optimizer_state_dict(
            model, optimizer, state, options=options
        ),
    }
    measured = []
    for part, set_state in setters.items():
        bound = bounds.set_state_dict_peak(
            held[part], device=world.device, fsdp1_unit_bytes=fsdp1_unit_bytes(cell, held[part])
        )
        everywhere = getters[part](options=dsd.StateDictOptions(full_state_dict=True))
        options = {"full_state_dict": True}
        named = replace(bound, operation=f"set_{part}_state_dict({_words(options)})")
        load = partial(set_state, everywhere, dsd.StateDictOptions(**options))
        measured.append(measure(world, named, load))
        del everywhere, load
        source = getters[part](options=dsd.StateDictOptions(full_state_dict=True))
        if world.rank != 0:
            source = {}
        options = {"full_state_dict": True, "broadcast_from_rank0": True}
        named = replace(bound, operation=f"set_{part}_state_dict({_words(options)})")
        load = partial(set_state, source, dsd.StateDictOptions(**options))
        measured.append(measure(world, named, load))
        del source, load
    assert_within_bounds(world, f"w{world.size}-{name}-set", measured)


def dcp_state(world: Any, name: str) -> dict[str, Any]:
    """What a training loop hands DCP: the sized model's and optimizer's sharded state dicts."""
    model, optimizer = sized_model_after_a_step(PARALLELISMS[name], world)
    return {part: get() for part, get in state_getters(model, optimizer).items()}


# A process's first DCP calls build what later calls reuse (a fresh world's first save of the
# sized state peaked 1.4 to 3.7 MiB higher than the steady state on 2.13.0): each check
# measures the second of two calls, as a training loop that checkpoints again would see.


@pytest.mark.world(2, 4, applies=applies)
@pytest.mark.parametrize("name", CELLS)
def test_dcp_save_stays_within_its_memory_bound(world, name):
    """``dcp.save`` of the sharded state dicts through the file system, saved once before."""
    skip_without_a_probe()
    if world.device_type != "cpu":
        pytest.skip(
            "FileSystemWriter keeps every item it staged until the rank's file is written "
            "(pytorch/pytorch#195982): on an accelerator, the rank's whole state on the host; "
            "the manifest cannot yet hold a divergence of one device kind"
        )
    state = dcp_state(world, name)
    dcp.save(state, checkpoint_id=str(world.tmp_path / "first"))
    bound = bounds.dcp_save_peak(state, rank=world.rank, world_size=world.size)
    save = partial(dcp.save, state, checkpoint_id=str(world.tmp_path / "second"))
    assert_within_bounds(world, f"w{world.size}-{name}-dcp", [measure(world, bound, save)])


@pytest.mark.world(2, 4, applies=applies)
@pytest.mark.parametrize("name", CELLS)
def test_dcp_load_stays_within_its_memory_bound(world, name):
    """``dcp.load`` into the sharded state dicts of the checkpoint they were saved to, loaded
    once before."""
    skip_without_a_probe()
    state = dcp_state(world, name)
    path = str(world.tmp_path / "checkpoint")
    dcp.save(state, checkpoint_id=path)
    dcp.load(state, checkpoint_id=path)
    bound = bounds.dcp_load_peak(state, world_size=world.size)
    load = partial(dcp.load, state, checkpoint_id=path)
    assert_within_bounds(world, f"w{world.size}-{name}-dcp", [measure(world, bound, load)])


FSDP1_CELLS = [name for name in CELLS if PARALLELISMS[name].fsdp1]


@pytest.mark.world(2, 4, applies=applies)
@pytest.mark.parametrize("name", FSDP1_CELLS)
def test_fsdp1_optimizer_conversions_stay_within_their_memory_bounds(world, name):
    """``FSDP.optim_state_dict`` under each FULL and SHARDED optimizer config, and
    ``FSDP.optim_state_dict_to_load`` of its full and sharded results held by every rank."""
    skip_without_a_probe()
    model, optimizer = sized_model_after_a_step(PARALLELISMS[name], world)
    held = dsd.get_optimizer_state_dict(model, optimizer)
    unit = bounds.unsharded_unit_bytes(held)
    to_save, to_load = fsdp1_api("optim_state_dict"), fsdp1_api("optim_state_dict_to_load")
    measured = []
    for config, options in OPTIM_ORACLE_OPTIONS.items():
        if config in _memory_model(name).unconvertible:
            continue
        bound = bounds.fsdp1_optim_state_dict_peak(
            held, rank=world.rank, unit_bytes=unit, **options
        )
        save = partial(to_save, model, optimizer)
        measured.append(measure(world, bound, partial(under_optim_settings, model, config, save)))
    for config in () if "to_load" in _memory_model(name).unconvertible else ("full", "sharded"):
        source = under_optim_settings(model, config, partial(to_save, model, optimizer))
        bound = bounds.fsdp1_optim_load_peak(held, unit_bytes=unit, shard_state=config == "sharded")
        load = partial(to_load, model, optimizer, source)
        measured.append(measure(world, bound, partial(under_optim_settings, model, config, load)))
        del source, load
    assert_within_bounds(world, f"w{world.size}-{name}-fsdp1-optim", measured)
