"""Environment variables that carry the harness's state into rank processes."""

from __future__ import annotations

ROLE = "HARNESS_ROLE"  # "rank" inside a spawned rank process
RANK_ROLE = "rank"
CONTROLLER_ADDRESS = "HARNESS_CONTROLLER"  # host:port of the controller's listener
RANK = "HARNESS_RANK"
WORLD_DIR = "HARNESS_WORLD_DIR"  # the world's scratch directory (stack dumps, logs)
TORCHRUN_MARKERS = ("TORCHELASTIC_RUN_ID", "GROUP_RANK")
# Spawned rank r runs with PYTHONHASHSEED = the session's hash seed (--world-hash-seed) + r.
DEFAULT_HASH_SEED = 1
