"""Memory is part of the contract: each state-dict utility's peak per rank stays in its bound.

Every parallelism of the matrix at 2 and 4 ranks builds ``conformance.models.sized`` (about
40 MiB of parameters, 120 MiB with Adam's state, per world), takes one step, and runs each
utility of ``torch/distributed/_state_dict_utils.py`` on its state dicts, measuring every
rank's peak over its own baseline (``harness.memory``). The bound of each call comes from
the contract and the tensors' sizes and placements alone (``reference_impl.peak_memory``),
plus a measured slack (``conformance._memory.SLACK_BYTES``): a build that returns the right
values while holding one more copy of the model fails here. A failure names the rank, the
operation, the measured peak, the bound, and the bytes of the largest tensor and of the
whole state dict. Values are judged elsewhere (``test_state_dict_utils.py``).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest
import torch

import reference_impl as ri
from conformance import _fsdp1
from conformance._memory import Measured, assert_within_bounds, measure, skip_without_a_probe
from conformance._parallelisms import PARALLELISMS, Parallelism
from conformance._upstream import sdu
from conformance.models.sized import seeded_wide_and_narrow, wide_batch
from reference_impl import peak_memory as bounds

# FSDP1's strategies with the original parameters, and with flat parameters once (its
# optimizer state is one flat tensor per rank); nested wrappings hold the same tensors.
CELLS = [
    name
    for name, cell in PARALLELISMS.items()
    if not cell.nested and (not cell.flat_params or name == "fsdp1_full_shard_flat")
]


def applies(size: int, name: str) -> bool:
    return size in (2, 4) and PARALLELISMS[name].supports(size)


def sized_state(cell: Parallelism, world: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The sized model in ``cell`` after one Adam step: its model state dict (FSDP1's
    sharded one) and its optimizer's own state dict."""
    cell.skip_unless_runnable(world.device)
    model = cell.parallelise(seeded_wide_and_narrow(), world)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    model(wide_batch(0).to(world.device)).pow(2).mean().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
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
