"""The cells of the matrix: one descriptor per parallelism (how it wraps a model, the world
sizes it runs at, its family and the checks it takes part in), and sub-worlds of some ranks."""

from __future__ import annotations

from conformance.cells._experts import from_experts, to_experts
from conformance.cells._parallelisms import (
    DEFAULT_MODEL,
    PARALLELISMS,
    Parallelism,
    comparison_tolerance,
    exists_at_size,
    first_size_and_four,
    first_size_only,
    flattened_between,
    units,
    whole_model_at_size,
)
from conformance.cells._subworld import SubWorld

__all__ = [
    "DEFAULT_MODEL",
    "PARALLELISMS",
    "Parallelism",
    "SubWorld",
    "comparison_tolerance",
    "exists_at_size",
    "first_size_and_four",
    "first_size_only",
    "flattened_between",
    "from_experts",
    "to_experts",
    "units",
    "whole_model_at_size",
]
