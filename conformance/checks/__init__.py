"""The check modules: each judges one contract of torch's state dicts over the cells it
applies to (``conformance/CATALOGUE.md`` lists them).

``CONTRACTS`` groups the modules by the contract they judge; the gate's quick tier keeps a
test of each contract in each family of cells (``ci/gate/tier.py``).
"""

from __future__ import annotations

CONTRACTS: dict[str, tuple[str, ...]] = {
    "observing": ("test_observing_is_free",),
    "resuming": ("test_resuming_commutes_with_training",),
    "loads": ("test_loading_leaves_its_input", "test_meta_device_loads", "test_golden_checkpoints"),
    "malformed loads": ("test_malformed_loads_name_the_key", "test_bad_checkpoints_are_refused"),
    "async": ("test_async_saves", "test_async_save_failures", "test_async_staging"),
    "memory": ("test_peak_memory",),
}

__all__ = ["CONTRACTS"]
