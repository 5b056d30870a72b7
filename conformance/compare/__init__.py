"""How checks judge what a build produced: state dicts equal bit for bit, values a computation
produced within a stated tolerance, the parts of a state each rank holds, trees of tensors
built on meshes, and peak memory measured against the oracle's bounds."""

from __future__ import annotations

from conformance.compare._compare import (
    assert_no_state_tensors_overlap,
    assert_state_dict_equal,
    assert_trees_identical,
    local_copy,
    local_part,
    local_tensors_by_path,
    memory_shared_with,
)
from conformance.compare._computed import ULPS_PER_STEP, computed_differences, tolerance
from conformance.compare._held import (
    HELD,
    every_rank,
    held_part,
    holds,
    holds_a_part,
    whole_model_state,
    whole_optimizer_state,
)
from conformance.compare._memory import (
    PEAK_LOG,
    Measured,
    assert_within_bounds,
    measure,
    skip_without_a_probe,
)
from conformance.compare._trees import (
    Builder,
    DTensorSpec,
    TensorSpec,
    full_tensor,
    placements_for,
    tree_specs,
    world_meshes,
)

__all__ = [
    "HELD",
    "PEAK_LOG",
    "ULPS_PER_STEP",
    "Builder",
    "DTensorSpec",
    "Measured",
    "TensorSpec",
    "assert_no_state_tensors_overlap",
    "assert_state_dict_equal",
    "assert_trees_identical",
    "assert_within_bounds",
    "computed_differences",
    "every_rank",
    "full_tensor",
    "held_part",
    "holds",
    "holds_a_part",
    "local_copy",
    "local_part",
    "local_tensors_by_path",
    "measure",
    "memory_shared_with",
    "placements_for",
    "skip_without_a_probe",
    "tolerance",
    "tree_specs",
    "whole_model_state",
    "whole_optimizer_state",
    "world_meshes",
]
