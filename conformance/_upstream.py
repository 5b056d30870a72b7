"""The one path from the suite to the torch build under test.

Every torch API the suite judges (all of ``torch.distributed`` below its core of process
groups and collectives, and ``torch.nn.parallel``) is reached through a namespace of this
module, looked up when a test calls it, never imported at module top or inline:

    from conformance._upstream import dsd
    dsd.get_model_state_dict(model, options=dsd.StateDictOptions(full_state_dict=True))

A name the build lacks is a skip of the calling test that names it, never a collection error;
``python -m ci.gate.probe`` lists every declared name with its signature or ``MISSING``.
``tests/test_one_path_to_torch.py`` holds the suite to this.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import torch


def lookup(module: str, name: str) -> Any:
    """``module.name`` (``name`` may be dotted) from the torch under test; raises
    ``ImportError`` or ``AttributeError`` when the build lacks it."""
    found: Any = importlib.import_module(module)
    for part in name.split("."):
        found = getattr(found, part)
    return found


@contextlib.contextmanager
def quiet_deprecations() -> Iterator[None]:
    """Torch APIs that announce their own deprecation (FSDP1's legacy optimizer APIs and
    configs, NO_SHARD, ShardedTensor) called without their FutureWarning: the suite judges
    them for as long as a release ships them."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        yield


@dataclass(frozen=True)
class TorchModule:
    """One torch module under judgement and the names the suite uses from it.

    Attribute access (``dsd.get_state_dict``) and ``get`` (dotted names such as
    ``FullyShardedDataParallel.optim_state_dict``) look the name up in the torch under test at
    call time; a missing one skips the calling test, naming it. Undeclared names are refused,
    so the probe's list stays complete.
    """

    path: str
    names: tuple[str, ...]

    def get(self, name: str) -> Any:
        if name not in self.names:
            raise ValueError(
                f"{self.path}.{name} is not declared in conformance._upstream: add it, "
                "for the probe"
            )
        try:
            return lookup(self.path, name)
        except (ImportError, AttributeError):
            pytest.skip(f"torch {torch.__version__} has no {self.path}.{name}")

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # copy, pickle and inspect probe dunders
            raise AttributeError(name)
        return self.get(name)


def full_options(**options: Any) -> Any:
    """``StateDictOptions(full_state_dict=True, **options)`` of the torch under test."""
    return dsd.StateDictOptions(full_state_dict=True, **options)


def with_parameters(function: Any, *names: str) -> Any:
    """``function`` of the torch under test, or a skip naming the parameters among ``names``
    its release lacks (an option added in a later release)."""
    missing = [name for name in names if name not in inspect.signature(function).parameters]
    if missing:
        pytest.skip(
            f"torch {torch.__version__}'s {function.__qualname__} has no parameter "
            + ", ".join(missing)
        )
    return function


def fully_shard_on(device: torch.device) -> Any:
    """``fully_shard`` of the torch under test, or a skip where its release cannot run FSDP2 on
    ``device`` (``fully_shard_missing``)."""
    shard = fsdp.fully_shard
    missing = fully_shard_missing(device)
    if missing is not None:
        pytest.skip(missing)
    return shard


def fully_shard_missing(device: torch.device) -> str | None:
    """Why this release cannot run FSDP2 on ``device``, or None: FSDP2's all-gather records an
    event on the device's stream, which CPU streams cannot do in releases whose
    ``torch.cpu.Stream`` lacks ``record_event`` (torch 2.6 among them)."""
    if device.type == "cpu" and not hasattr(torch.cpu.Stream, "record_event"):
        return (
            f"torch {torch.__version__} cannot run fully_shard on CPU devices: "
            "torch.cpu.Stream has no record_event"
        )
    return None


_FSDP1 = "FullyShardedDataParallel"

sdu = TorchModule(
    "torch.distributed._state_dict_utils",
    (
        "_iterate_state_dict",
        "_gather_state_dict",
        "_offload_state_dict_to_cpu",
        "_copy_state_dict",
        "_create_cpu_state_dict",
        "_check_state_dict_similarity",
        "_broadcast_state_dict",
        "_distribute_state_dict",
        "_flatten_state_dict",
        "_unflatten_state_dict",
        "CompanionMismatch",
    ),
)
dsd = TorchModule(
    "torch.distributed.checkpoint.state_dict",
    (
        "StateDictOptions",
        "get_model_state_dict",
        "get_optimizer_state_dict",
        "get_state_dict",
        "set_model_state_dict",
        "set_optimizer_state_dict",
        "set_state_dict",
        "_patch_model_state_dict",
        "_patch_optimizer_state_dict",
    ),
)
dcp = TorchModule(
    "torch.distributed.checkpoint",
    (
        "save",
        "load",
        "async_save",
        "FileSystemWriter",
        "FileSystemReader",
        "DefaultLoadPlanner",
        "DefaultSavePlanner",
        "HuggingFaceStorageWriter",
        "HuggingFaceStorageReader",
        "QuantizedHuggingFaceStorageReader",
        "CheckpointException",
        "save_state_dict",
        "load_state_dict",
    ),
)
# DCP's experimental checkpointer, judged on what its docstrings promise.
dcp_experimental = TorchModule(
    "torch.distributed.checkpoint._experimental",
    (
        "make_sync_checkpointer",
        "make_async_checkpointer",
        "SyncCheckpointer",
        "AsyncCheckpointer",
        "CheckpointerConfig",
        "BarrierConfig",
        "CheckpointStagerConfig",
        "DefaultStager",
    ),
)
dcp_metadata = TorchModule(
    "torch.distributed.checkpoint.metadata",
    (
        "MetadataIndex",
        "Metadata",
        "ChunkStorageMetadata",
        "TensorStorageMetadata",
        "BytesStorageMetadata",
        "TensorProperties",
    ),
)
# DCP's public helpers for custom planners (each in its module's ``__all__``).
dcp_default_planner = TorchModule(
    "torch.distributed.checkpoint.default_planner", ("create_default_local_save_plan",)
)
dcp_planner_helpers = TorchModule(
    "torch.distributed.checkpoint.planner_helpers", ("create_read_items_for_chunk_list",)
)
# Joins a ``sharded`` Hugging Face save's files, each rank writing its share (what recipes
# call after training; its module is private, its function the one upstream documents).
dcp_consolidate = TorchModule(
    "torch.distributed.checkpoint._consolidate_hf_safetensors",
    ("consolidate_safetensors_files_on_every_rank",),
)
# Reads a checkpoint's keys into an empty dict, no template needed (private, what recipes
# call to read a published model whole).
dcp_loader = TorchModule(
    "torch.distributed.checkpoint.state_dict_loader", ("_load_state_dict_from_keys",)
)
# The older way to read FSDP1's sharded optimizer state back from a DCP checkpoint.
dcp_optimizer = TorchModule(
    "torch.distributed.checkpoint.optimizer", ("load_sharded_optimizer_state_dict",)
)
dcp_utils = TorchModule("torch.distributed.checkpoint.utils", ("find_state_dict_object",))
dcp_filesystem = TorchModule("torch.distributed.checkpoint.filesystem", ("CURRENT_DCP_VERSION",))
# DCP's writer and reader of fsspec's stores (object stores, memory, file URLs).
dcp_fsspec = TorchModule(
    "torch.distributed.checkpoint._fsspec_filesystem", ("FsspecWriter", "FsspecReader")
)
dcp_saver = TorchModule(
    "torch.distributed.checkpoint.state_dict_saver", ("AsyncCheckpointerType", "AsyncSaveResponse")
)
dcp_staging = TorchModule(
    "torch.distributed.checkpoint.staging",
    ("BlockingAsyncStager", "DefaultStager", "StagingOptions"),
)
# The copier behind DefaultStager: the suite reads how small a storage it leaves unpinned.
dcp_state_dict_stager = TorchModule(
    "torch.distributed.checkpoint._state_dict_stager", ("StateDictStager",)
)
dcp_formats = TorchModule(
    "torch.distributed.checkpoint.format_utils",
    (
        "dcp_to_torch_save",
        "torch_save_to_dcp",
        "BroadcastingTorchSaveReader",
        "DynamicMetaLoadPlanner",
    ),
)
fsdp = TorchModule(
    "torch.distributed.fsdp",
    (
        _FSDP1,
        *(
            f"{_FSDP1}.{name}"
            for name in (
                "state_dict_type",
                "optim_state_dict",
                "optim_state_dict_to_load",
                "full_optim_state_dict",
                "sharded_optim_state_dict",
                "shard_full_optim_state_dict",
                "scatter_full_optim_state_dict",
                "flatten_sharded_optim_state_dict",
                "rekey_optim_state_dict",
            )
        ),
        "fully_shard",
        "ShardingStrategy",
        "StateDictType",
        "StateDictConfig",
        "OptimStateKeyType",
        "FullStateDictConfig",
        "ShardedStateDictConfig",
        "LocalStateDictConfig",
        "FullOptimStateDictConfig",
        "ShardedOptimStateDictConfig",
        "MixedPrecision",
        "MixedPrecisionPolicy",
        "CPUOffload",
        "CPUOffloadPolicy",
    ),
)
fsdp_wrap = TorchModule("torch.distributed.fsdp.wrap", ("ModuleWrapPolicy",))
# FSDP1's loss scaler, which agrees on overflows across the ranks that shard the gradients.
fsdp_grad_scaler = TorchModule("torch.distributed.fsdp.sharded_grad_scaler", ("ShardedGradScaler",))
dtensor = TorchModule(
    "torch.distributed.tensor",
    ("DTensor", "Placement", "Replicate", "Shard", "distribute_tensor"),
)
dtensor_placements = TorchModule("torch.distributed.tensor.placement_types", ("_StridedShard",))
tensor_parallel = TorchModule(
    "torch.distributed.tensor.parallel",
    ("parallelize_module", "ColwiseParallel", "RowwiseParallel"),
)
device_mesh = TorchModule("torch.distributed.device_mesh", ("DeviceMesh",))
sharded_tensor = TorchModule(
    "torch.distributed._shard.sharded_tensor",
    ("ShardedTensor", "Shard", "ShardMetadata", "init_from_local_shards"),
)
# What a pickled ShardedTensor names besides its own module's classes: a weights-only load
# must allow them (``torch.serialization.safe_globals``).
sharded_tensor_metadata = TorchModule(
    "torch.distributed._shard.sharded_tensor.metadata",
    ("ShardedTensorMetadata", "TensorProperties", "MEM_FORMAT_ENCODING"),
)
sharding_spec = TorchModule("torch.distributed._shard.sharding_spec", ("ChunkShardingSpec",))
remote_device = TorchModule("torch.distributed.remote_device", ("_remote_device",))
ddp = TorchModule("torch.nn.parallel", ("DistributedDataParallel",))
composable = TorchModule("torch.distributed._composable", ("replicate",))
activation_checkpointing = TorchModule(
    "torch.distributed.algorithms._checkpoint.checkpoint_wrapper",
    ("apply_activation_checkpointing", "checkpoint_wrapper", "CheckpointImpl"),
)
dist_optim = TorchModule("torch.distributed.optim", ("_NamedOptimizer",))

MODULES: tuple[TorchModule, ...] = (
    sdu,
    dsd,
    dcp,
    dcp_experimental,
    dcp_metadata,
    dcp_filesystem,
    dcp_default_planner,
    dcp_planner_helpers,
    dcp_utils,
    dcp_optimizer,
    dcp_loader,
    dcp_consolidate,
    dcp_fsspec,
    dcp_saver,
    dcp_staging,
    dcp_state_dict_stager,
    dcp_formats,
    fsdp,
    fsdp_wrap,
    fsdp_grad_scaler,
    dtensor,
    dtensor_placements,
    tensor_parallel,
    device_mesh,
    sharded_tensor,
    sharded_tensor_metadata,
    sharding_spec,
    remote_device,
    ddp,
    composable,
    activation_checkpointing,
    dist_optim,
)
# The torch APIs the gate exercises, as (module, dotted name): what the probe looks up.
EXERCISED_APIS: tuple[tuple[str, str], ...] = tuple(
    (module.path, name) for module in MODULES for name in module.names
)
