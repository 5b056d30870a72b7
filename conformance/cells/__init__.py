"""The cells of the matrix: one descriptor per parallelism, and what the checks derive from them.

A descriptor (``Parallelism``) holds how a cell wraps a model, the world sizes it runs at,
its family, the roles it takes in checks that try one cell of a kind, the partners that load
what it saved, its memory model, and how it wraps under a mixed-precision policy
(``_precision.py``). ``_parallelisms.py`` declares every cell; the rest of
the suite reads them through this package.
"""

from __future__ import annotations

from conformance.cells._applies import (
    TP_TOLERANCE,
    comparison_tolerance,
    exists_at_size,
    first_size_and_four,
    first_size_only,
    flattened_between,
    whole_model_at_size,
)
from conformance.cells._descriptor import (
    DEFAULT_MODEL,
    SINGLE,
    Family,
    MemoryModel,
    Parallelism,
    Partner,
    Reshard,
    Role,
)
from conformance.cells._experts import from_experts, to_experts
from conformance.cells._parallelisms import (
    PARALLELISMS,
    families,
    loaders_of,
    memory_measured,
    register,
    reshards,
    with_role,
)
from conformance.cells._precision import PRECISIONS, Precision
from conformance.cells._subworld import SubWorld
from conformance.cells._wrappers import replace_submodule, units

__all__ = [
    "DEFAULT_MODEL",
    "PARALLELISMS",
    "PRECISIONS",
    "SINGLE",
    "TP_TOLERANCE",
    "Family",
    "MemoryModel",
    "Parallelism",
    "Partner",
    "Precision",
    "Reshard",
    "Role",
    "SubWorld",
    "comparison_tolerance",
    "exists_at_size",
    "families",
    "first_size_and_four",
    "first_size_only",
    "flattened_between",
    "from_experts",
    "loaders_of",
    "memory_measured",
    "register",
    "replace_submodule",
    "reshards",
    "to_experts",
    "units",
    "whole_model_at_size",
    "with_role",
]
