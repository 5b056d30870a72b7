"""Mixed precision: a cell that computes in a low dtype and keeps fp32 masters.

A ``Precision`` names FSDP's policy: parameters gathered and computed in ``param_dtype``,
gradients reduced in ``reduce_dtype``, the sharded parameters (the masters) kept in fp32.
FSDP1 also casts its buffers to ``param_dtype`` for compute; FSDP2 leaves them alone and
casts each unit's inputs. A cell that has such a policy says how it wraps under one
(``Parallelism.in_precision``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from conformance._upstream import fsdp


@dataclass(frozen=True)
class Precision:
    """A mixed-precision policy, by name."""

    name: str
    param_dtype: torch.dtype
    reduce_dtype: torch.dtype

    def fsdp1_policy(self) -> object:
        """FSDP1's ``MixedPrecision``: buffers compute in ``param_dtype`` too."""
        return fsdp.MixedPrecision(
            param_dtype=self.param_dtype,
            reduce_dtype=self.reduce_dtype,
            buffer_dtype=self.param_dtype,
        )

    def fsdp2_policy(self) -> object:
        """FSDP2's ``MixedPrecisionPolicy``."""
        return fsdp.MixedPrecisionPolicy(
            param_dtype=self.param_dtype, reduce_dtype=self.reduce_dtype
        )


PRECISIONS: dict[str, Precision] = {
    precision.name: precision
    for precision in (
        Precision("bf16_reduce_fp32", torch.bfloat16, torch.float32),
        Precision("bf16_reduce_bf16", torch.bfloat16, torch.bfloat16),
    )
}
