"""The small FSDP1 models of upstream's ``test_fsdp_state_dict.py`` and
``test_fsdp_optim_state.py``, built our way, and the suite's own small FSDP1 cases (``Tiny``,
``OneElement``: shards that run out before the ranks do).

Each builder seeds the generator first, so every rank (and every fresh copy)
starts from the same values, and wraps with ``FullyShardedDataParallel`` on
the rank's device. ``checkpoint`` puts activation-checkpoint wrappers inside
the FSDP wrappers, where upstream puts them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from conformance._upstream import activation_checkpointing, fsdp, quiet_deprecations
from conformance.models import common

SEED = 4321


def half_precision() -> Any:
    """FSDP1 mixed precision that computes, reduces and keeps buffers in float16."""
    return fsdp.MixedPrecision(
        param_dtype=torch.float16, reduce_dtype=torch.float16, buffer_dtype=torch.float16
    )


def fsdp1(module: nn.Module, device: torch.device, **kwargs: Any) -> fsdp.FullyShardedDataParallel:
    """FSDP1 on the rank's device; its deprecation and NO_SHARD warnings are silenced."""
    with quiet_deprecations():
        return fsdp.FullyShardedDataParallel(module, device_id=device, **kwargs)


def _linear(checkpoint: bool = False) -> nn.Module:
    linear = nn.Linear(10, 10, bias=False)
    return activation_checkpointing.checkpoint_wrapper(linear) if checkpoint else linear


def simple(device: torch.device, checkpoint: bool = False, **kwargs: Any) -> nn.Module:
    """One FSDP wrapper around one linear layer."""
    torch.manual_seed(SEED)
    return fsdp1(_linear(checkpoint), device, **kwargs)


def nested(
    device: torch.device, checkpoint: bool = False, wrap: bool = True, **kwargs: Any
) -> nn.Module:
    """``FSDP(Sequential(FSDP(linear), linear))``; plain linears when not ``wrap``."""
    torch.manual_seed(SEED)
    first, second = _linear(checkpoint and wrap), _linear(checkpoint and wrap)
    if not wrap:
        return nn.Sequential(first, second).to(device)
    sequence: nn.Module = nn.Sequential(fsdp1(first, device, **kwargs), second)
    if checkpoint:
        sequence = activation_checkpointing.checkpoint_wrapper(sequence)
    return fsdp1(sequence, device, **kwargs)


class NonFsdpRoot(nn.Module):
    """A plain root holding a linear layer of its own and two nested FSDP models."""

    def __init__(self, device: torch.device, wrap: bool = True, **kwargs: Any) -> None:
        super().__init__()
        torch.manual_seed(SEED)
        self.non_fsdp_lin = nn.Linear(10, 10, bias=False).to(device)  # FSDP1 moves only its own
        self.fsdp_1 = nested(device, wrap=wrap, **kwargs)
        self.fsdp_2 = nested(device, wrap=wrap, **kwargs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fsdp_2(self.fsdp_1(self.non_fsdp_lin(x)))


def multi_buffer(
    device: torch.device, mixed_precision: fsdp.MixedPrecision | None = None, **kwargs: Any
) -> nn.Module:
    """Linear, BatchNorm (buffers, kept in float32), linear; the norm wrapped on its own.

    Under ``mixed_precision`` both inner units cast their inputs, so a forward pass runs.
    """
    torch.manual_seed(SEED)
    norm_precision = None
    if mixed_precision:
        mixed_precision = dataclasses.replace(mixed_precision, cast_forward_inputs=True)
        norm_precision = fsdp.MixedPrecision(*(torch.float32,) * 3, cast_forward_inputs=True)
    sequence = nn.Sequential(
        fsdp1(nn.Linear(10, 10, bias=False), device, mixed_precision=mixed_precision, **kwargs),
        fsdp1(nn.BatchNorm1d(10), device, mixed_precision=norm_precision, **kwargs),
        nn.Linear(10, 10, bias=False),
    )
    return fsdp1(sequence, device, **kwargs)


class Offset(nn.Module):
    """A linear layer that adds a persistent buffer, in the input's dtype, to its output."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(10, 10, bias=False)
        self.register_buffer("offset", torch.arange(10, dtype=torch.float32) / 7)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) + self.offset.to(x.dtype)


def buffer_half_precision() -> Any:
    """FSDP1 mixed precision that casts buffers alone to float16."""
    return fsdp.MixedPrecision(buffer_dtype=torch.float16)


def buffer_casting_units(device: torch.device, casting: str) -> nn.Module:
    """``FSDP(Sequential(FSDP(Offset), Offset))`` whose buffers mixed precision casts to
    float16 in the units ``casting`` names: ``"root"``, ``"child"`` or ``"both"``."""
    torch.manual_seed(SEED)
    child = buffer_half_precision() if casting in ("child", "both") else None
    root = buffer_half_precision() if casting in ("root", "both") else None
    sequence = nn.Sequential(fsdp1(Offset(), device, mixed_precision=child), Offset())
    return fsdp1(sequence, device, mixed_precision=root)


def apply_checkpointing(model: nn.Module, around: type[nn.Module] = nn.Linear) -> None:
    """Non-reentrant activation checkpointing around every ``around`` module, after wrapping."""
    activation_checkpointing.apply_activation_checkpointing(
        model,
        checkpoint_wrapper_fn=lambda module: activation_checkpointing.checkpoint_wrapper(
            module, checkpoint_impl=activation_checkpointing.CheckpointImpl.NO_REENTRANT
        ),
        check_fn=lambda module: isinstance(module, around),
    )


class InnerOuter(nn.Module):
    """Upstream's two-linear ``Model``: ``inner`` (4 → 4, applied twice) and ``outer`` (4 → 5).

    ``buffers`` adds a persistent and a non-persistent buffer to each;
    ``inner_fsdp`` wraps ``inner`` on its own (ignoring it when ``ignore_inner``).
    """

    def __init__(
        self,
        device: torch.device,
        inner_fsdp: bool = False,
        buffers: bool = False,
        ignore_inner: bool = False,
        mixed_precision: bool = False,
        group: Any = None,
    ) -> None:
        super().__init__()
        torch.manual_seed(SEED)
        self.inner: nn.Module = nn.Linear(4, 4)
        self.outer = nn.Linear(4, 5)
        if buffers:
            for layer in (self.inner, self.outer):
                layer.register_buffer("buffer", torch.randn(5, 5))
                layer.register_buffer("non_persistent_buffer", torch.randn(5, 5), persistent=False)
        if inner_fsdp:
            self.inner = fsdp1(
                self.inner,
                device,
                ignored_modules=[self.inner] if ignore_inner else [],
                mixed_precision=half_precision() if mixed_precision else None,
                process_group=group,
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.outer(self.inner(x) + self.inner(x))


class SharedModuleAndParameter(nn.Module):
    """``net3`` is ``net2``; ``shared_parameter`` is ``random_parameter``."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(SEED)
        self.net1 = nn.Sequential(nn.Linear(8, 16), nn.ReLU())
        self.net2 = nn.Sequential(nn.Linear(16, 16), nn.ReLU())
        self.net3 = self.net2
        self.random_parameter = nn.Parameter(torch.randn(10))
        self.shared_parameter = self.random_parameter

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net3(self.net2(self.net1(x)))


class WithSkippedModule(nn.Module):
    """A linear layer, a nested FSDP-wrapped sequence, and ``linear_skip`` left out of FSDP."""

    def __init__(self, device: torch.device, wrap: bool = True) -> None:
        super().__init__()
        torch.manual_seed(SEED)
        self.linear = nn.Linear(10, 10, bias=False)
        inner = nn.Sequential(nn.Linear(10, 10, bias=False), nn.Linear(10, 10, bias=False))
        self.nested_linear = fsdp1(inner, device) if wrap else inner
        self.linear_skip = nn.Linear(10, 10, bias=False).to(device)  # left out of FSDP1's move
        if not wrap:
            self.to(device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_skip(self.nested_linear(self.linear(x)))


def with_skipped_module(device: torch.device) -> nn.Module:
    """FSDP over ``WithSkippedModule`` with ``linear_skip`` detached while wrapping."""
    module = WithSkippedModule(device)
    skipped = module.linear_skip
    del module.linear_skip
    wrapped = fsdp1(module, device)
    module.linear_skip = skipped
    return wrapped


class Shift(nn.Module):
    """Adds a learned vector: a module of one parameter, for wrapping on its own."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.randn(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.bias


class ShiftedBlock(nn.Module):
    """``relu(x @ weight + shift0) + shift1``: the two shifts get different gradients."""

    def __init__(self, in_dim: int, out_dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(in_dim, out_dim))
        self.shift0 = Shift(out_dim)
        self.shift1 = Shift(out_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.shift1(torch.relu(self.shift0(x @ self.weight)))


class Blocks(nn.Module):
    """Upstream's nested optimizer-state model, our way: five blocks and a root ``bias``.

    Parameter sizes (15, 21, 63, 81, 45 and the shifts) rarely divide by 2 or 4.
    """

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(SEED)
        self.block0 = ShiftedBlock(5, 3)
        self.block1 = ShiftedBlock(3, 7)
        self.bias = nn.Parameter(torch.randn(5))
        self.block2 = nn.Sequential(ShiftedBlock(7, 9), ShiftedBlock(9, 9), ShiftedBlock(9, 5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in (self.block0, self.block1, self.block2):
            x = torch.relu(block(x))
        return x + self.bias

    def two_param_groups(self) -> list[dict[str, Any]]:
        """Groups out of ``parameters()`` order that leave the root ``bias`` out."""
        return [
            {"params": list(self.block1.parameters())},
            {
                "params": list(self.block2.parameters()) + list(self.block0.parameters()),
                "weight_decay": 0.9,
            },
        ]


def seeded_batch(width: int) -> Callable[[int], torch.Tensor]:
    """Each step's batch of eight ``width``-feature inputs, the same on every rank."""

    def batch(step: int) -> torch.Tensor:
        return torch.randn(8, width, generator=torch.Generator().manual_seed(SEED + step))

    return batch


class FirstUnused(nn.Module):
    """Two linear layers of which only the second computes: the first gets no optimizer state."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(SEED)
        self.lin1 = nn.Linear(5, 5)
        self.lin2 = nn.Linear(5, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.lin2(x))


def first_unused(device: torch.device) -> nn.Module:
    """``FirstUnused`` with each linear wrapped, then the whole."""
    model = FirstUnused()
    model.lin1 = fsdp1(model.lin1, device)
    model.lin2 = fsdp1(model.lin2, device)
    return fsdp1(model, device)


def four_linears() -> nn.Sequential:
    """Upstream's dummy model (8 → 16 → 32 → 64 → 8), whose first layer may be frozen."""
    torch.manual_seed(SEED)
    return nn.Sequential(
        nn.Linear(8, 16),
        nn.ReLU(),
        nn.Linear(16, 32),
        nn.ReLU(),
        nn.Linear(32, 64),
        nn.Linear(64, 8),
    )


def wrap_blocks(
    blocks: Blocks,
    device: torch.device,
    *,
    alternative: bool = False,
    ignore_a_shift: bool = False,
    **kwargs: Any,
) -> Blocks:
    """Wrap some of ``blocks`` in FSDP1, leaving the root unwrapped.

    The usual wrapping nests shifts inside ``block1`` and ``block2[1]`` and
    wraps ``block2[2]`` whole (ignoring its ``shift0`` when
    ``ignore_a_shift``); the ``alternative`` wraps ``block0`` and its
    ``shift0`` only, so the same parameters land in other flat parameters.
    """
    if alternative:
        blocks.block0.shift0 = fsdp1(blocks.block0.shift0, device, **kwargs)
        blocks.block0 = fsdp1(blocks.block0, device, **kwargs)
        return blocks
    blocks.block1.shift0 = fsdp1(blocks.block1.shift0, device, **kwargs)
    blocks.block1 = fsdp1(blocks.block1, device, **kwargs)
    middle = blocks.block2[1]
    middle.shift0 = fsdp1(middle.shift0, device, **kwargs)
    middle.shift1 = fsdp1(middle.shift1, device, **kwargs)
    blocks.block2[1] = fsdp1(middle, device, **kwargs)
    last = blocks.block2[2]
    ignored = [last.shift0] if ignore_a_shift else []
    blocks.block2[2] = fsdp1(last, device, ignored_modules=ignored, **kwargs)
    return blocks


class Tiny(nn.Module):
    """Six parameter elements in all: at 4 ranks some shards hold nothing."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(1, 1)
        self.fc2 = nn.Linear(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.fc1(x))


def seeded_tiny() -> Tiny:
    torch.manual_seed(common.SEED)
    return Tiny()


class RankDependent(nn.Module):
    """An FSDP1 dense part behind a plain layer whose name depends on the rank (``sparse0`` on
    rank 0, ``sparse1`` elsewhere), as model-parallel embeddings sit beside FSDP1."""

    def __init__(self, rank: int, device: torch.device, **dense_options: Any) -> None:
        """``dense_options``: FSDP1's besides ``use_orig_params`` for the dense part."""
        super().__init__()
        torch.manual_seed(SEED)
        self.dense = fsdp1(four_linears(), device, use_orig_params=True, **dense_options)
        self.add_module(f"sparse{min(rank, 1)}", nn.Linear(8, 8).to(device))
        self.sparse = getattr(self, f"sparse{min(rank, 1)}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dense(torch.relu(self.sparse(x)))


class OneElement(nn.Module):
    """A single-element parameter: every rank but rank 0 holds an empty shard."""

    def __init__(self) -> None:
        super().__init__()
        self.my_parameter = nn.Parameter(torch.full((1,), 3.1415926))

    def forward(self, _: Any) -> torch.Tensor:
        return self.my_parameter
