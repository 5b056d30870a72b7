"""The check modules: each judges one contract of torch's state dicts over the cells it
applies to (``conformance/CATALOGUE.md`` lists them).

``FAMILIES`` puts every check module in one family of checks, by the contract it judges. The
gate's quick tier holds an id of every pair of a family of checks and a family of cells
(``ci/gate/tier.py``); ``tests/test_cells.py`` holds every module to one family.
"""

from __future__ import annotations

FAMILIES: dict[str, tuple[str, ...]] = {
    "state dicts": (
        "test_full_state_dict",
        "test_get_set_state_dict",
        "test_model_matrix",
        "test_observing_is_free",
        "test_renamed_keys",
        "test_fsdp2_state_dict_storage",
        "test_upstream_failures",
    ),
    "resuming": (
        "test_resuming_commutes_with_training",
        "test_app_state_loads",
        "test_dcp_round_trips",
        "test_run_state",
        "test_mixed_precision",
        "test_compiled_models",
        "test_float8_training",
    ),
    "loads": (
        "test_loading_leaves_its_input",
        "test_meta_device_loads",
        "test_golden_checkpoints",
        "_golden_writer",  # the release's golden checkpoints (python -m ci.gate.golden)
        "test_dtype_loads",
        "test_low_precision",
        "test_quantized_checkpoints",
    ),
    "resharding": (
        "test_dcp_placements",
        "test_fsdp1_reshard_loads",
        "test_pipeline_stages",
        "test_expert_parallel",
        "test_process_groups",
    ),
    "malformed loads": (
        "test_malformed_loads_name_the_key",
        "test_bad_checkpoints_are_refused",
        "test_rotten_checkpoints",
    ),
    "async": (
        "test_async_saves",
        "test_async_save_failures",
        "test_async_staging",
        "test_experimental_checkpointer",
    ),
    "stores": (
        "test_object_stores",
        "test_store_faults",
        "test_killed_saves",
        "test_many_saves",
        "test_save_plans",
    ),
    "formats": ("test_format_conversions", "test_safetensors", "test_checkpoint_helpers"),
    "memory": ("test_peak_memory",),
    "fsdp1 apis": (
        "test_fsdp1_dtensor_state",
        "test_fsdp1_layout",
        "test_fsdp1_legacy_optim_apis",
        "test_fsdp1_model_state",
        "test_fsdp1_optim_corner_cases",
        "test_fsdp1_optim_state",
        "test_fsdp1_optim_upstream_cases",
        "test_fsdp1_state_dict_upstream_cases",
    ),
    "utilities": ("test_state_dict_utils", "test_state_dict_utils_upstream_cases"),
}


__all__ = ["FAMILIES"]
