"""Values computed on another machine, held to a record within a tolerance of their dtype.

What is loaded, saved or copied is compared bit for bit on every machine. What is computed is
not: one torch build on another CPU runs other kernels (vector width, the BLAS library's code
path, the split of a reduction over threads), and its training steps round differently in
the last bits. A record of computed values (a golden set's trajectory) is held bit for bit
where the reader has the writer's build and machine signature (``harness.machine``); on any
other, each floating tensor within ``steps x ULPS_PER_STEP`` units of its dtype's precision
of its largest recorded magnitude, every other value exactly.

``ULPS_PER_STEP``: the steps of the golden sets' AdamW on the matrix's models, taken under
``ATEN_CPU_CAPABILITY=default`` and under AVX2 on one machine, differed by at most 9.1 units
of float32's precision of a tensor's largest magnitude after any of their first 8 steps, and
the difference did not grow with the steps; 64 leaves a margin of seven for other CPUs. An
arithmetic change that matters stands far above it: a learning rate 1% off moves the
parameters by about 1.6e-4 of their magnitude in one step, 1,300 times float32's precision.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import torch

ULPS_PER_STEP: Final = 64
_SHOWN: Final = 4  # values shown of a tensor that differs


def tolerance(dtype: torch.dtype, steps: int) -> float:
    """The largest difference allowed, relative to a tensor's largest recorded magnitude,
    after ``steps`` computed steps in ``dtype``."""
    return steps * ULPS_PER_STEP * torch.finfo(dtype).eps


def computed_differences(
    computed: Mapping[str, Any], recorded: Mapping[str, Any], *, steps: int, limit: int = 3
) -> list[str]:
    """Where ``computed`` leaves (key path -> tensor or value) part from ``recorded`` beyond
    what ``steps`` steps on another machine explain (``steps=0``: the same machine, bit for
    bit): each key with both values (the first ``limit``)."""
    found = []
    for key in sorted(set(computed) | set(recorded)):
        if key not in recorded:
            found.append(f"{key}: computed {_shown(computed[key])}, not in the record")
        elif key not in computed:
            found.append(f"{key}: absent, recorded {_shown(recorded[key])}")
        else:
            difference = _difference(computed[key], recorded[key], steps)
            if difference is not None:
                found.append(f"{key}: {difference}")
    return found[:limit]


def _difference(computed: Any, recorded: Any, steps: int) -> str | None:
    both = f"computed {_shown(computed)}, recorded {_shown(recorded)}"
    tensors = isinstance(computed, torch.Tensor), isinstance(recorded, torch.Tensor)
    if tensors == (False, False):
        return None if computed == recorded else both
    if tensors != (True, True):
        return both
    if (computed.dtype, computed.shape) != (recorded.dtype, recorded.shape):
        return both
    if steps == 0 or not recorded.is_floating_point():
        return None if _same_bytes(computed, recorded) else both
    actual, expected = computed.detach().cpu().double(), recorded.detach().cpu().double()
    finite = expected.isfinite()
    same_gaps = torch.equal(actual.isnan(), expected.isnan()) and torch.equal(
        actual[expected.isinf()], expected[expected.isinf()]
    )
    if not same_gaps:
        return both  # a NaN or an infinity where the record has none, or not where it has
    largest = float(expected[finite].abs().max()) if finite.any() else 0.0
    allowed = tolerance(recorded.dtype, steps) * largest
    apart = float((actual[finite] - expected[finite]).abs().max()) if finite.any() else 0.0
    if apart <= allowed:  # NaN apart never is
        return None
    return (
        f"{both}: {apart:.3g} apart, more than {allowed:.3g} ({steps} step(s) x "
        f"{ULPS_PER_STEP} x the precision of {recorded.dtype} x its largest recorded "
        f"magnitude {largest:.3g})"
    )


def _same_bytes(one: torch.Tensor, other: torch.Tensor) -> bool:
    def raw(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8)

    return torch.equal(raw(one), raw(other))


def _shown(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        flat = value.detach().cpu().reshape(-1)[:_SHOWN].tolist()
        return f"{value.dtype} {list(value.shape)} starting {flat}"
    return repr(value)
