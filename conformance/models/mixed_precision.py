"""One process training as FSDP's mixed precision does: the truth a mixed-precision cell must
equal.

The masters (the MLP's fp32 parameters) stay with Adam. Each step computes on a copy whose
parameters are cast to the policy's ``param_dtype``, as FSDP gathers them. FSDP1 casts the
buffers too and the root's inputs; FSDP2 leaves buffers alone and casts the inputs of every
module it wraps (the root and each unit). FSDP1 keeps its buffers in ``buffer_dtype`` from
the first forward on and gives them back upcast in a state dict, as its documentation says:
their values are the low dtype's, so here too. The copy's gradients are cast to the
``reduce_dtype``, which is all a reduction of equal gradients changes, then to the masters'
dtype, and Adam steps the masters.
"""

from __future__ import annotations

import copy
from typing import Any, Literal

import torch
from torch import nn

from conformance.cells import Precision, units
from conformance.models.common import GroundTruth, batch, seeded_mlp
from conformance.models.optimizers import adam

Casts = Literal["fsdp1", "fsdp2"]


def mixed_precision_truth(
    steps: int, precision: Precision, casts: Casts, device: torch.device
) -> GroundTruth:
    """The MLP's state after ``steps`` Adam steps computed in ``precision`` as ``casts``
    casts, on ``device``; the state comes back on the CPU."""
    masters = seeded_mlp().to(device)
    if casts == "fsdp1":  # FSDP1 keeps buffers in the compute dtype from the first forward on
        for buffer in masters.buffers():
            buffer.data = buffer.data.to(precision.param_dtype).to(buffer.dtype)
    optimizer = adam(masters)
    for step in range(steps):
        optimizer.zero_grad()
        compute = _compute_copy(masters, precision, casts)
        compute(batch(step).to(device)).pow(2).mean().backward()
        for master, low in zip(masters.parameters(), compute.parameters(), strict=True):
            master.grad = low.grad.to(precision.reduce_dtype).to(master.dtype)
        optimizer.step()
    return GroundTruth.of(masters, optimizer)


def _compute_copy(masters: nn.Module, precision: Precision, casts: Casts) -> nn.Module:
    compute = copy.deepcopy(masters)
    for parameter in compute.parameters():
        parameter.data = parameter.data.to(precision.param_dtype)
    if casts == "fsdp1":
        for buffer in compute.buffers():
            buffer.data = buffer.data.to(precision.param_dtype)
        wrapped = [compute]
    else:
        wrapped = [compute, *(compute.get_submodule(unit) for unit in units(compute))]
    for module in wrapped:
        module.register_forward_pre_hook(_cast_inputs(precision.param_dtype))
    return compute


def _cast_inputs(dtype: torch.dtype) -> Any:
    def hook(_: nn.Module, inputs: tuple[Any, ...]) -> tuple[Any, ...]:
        return tuple(
            value.to(dtype)
            if isinstance(value, torch.Tensor) and value.is_floating_point()
            else value
            for value in inputs
        )

    return hook
