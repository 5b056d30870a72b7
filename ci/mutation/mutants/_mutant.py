"""What a mutant is: one broken replacement of one function of one upstream module, and the
modules mutants may break. Shared by the catalogue modules and the package that applies them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

STATE_DICT_UTILS = "torch.distributed._state_dict_utils"
CHECKPOINT_STATE_DICT = "torch.distributed.checkpoint.state_dict"
FSDP_OPTIM_UTILS = "torch.distributed.fsdp._optim_utils"
FSDP_STATE_DICT_UTILS = "torch.distributed.fsdp._state_dict_utils"
MODELLED_MODULES = (
    STATE_DICT_UTILS,
    CHECKPOINT_STATE_DICT,
    FSDP_OPTIM_UTILS,
    FSDP_STATE_DICT_UTILS,
)
# Asynchronous checkpointing, built on the modelled utilities: its stagers and checkpointers.
STAGER = "torch.distributed.checkpoint._state_dict_stager"
STAGING = "torch.distributed.checkpoint.staging"
THREAD_CHECKPOINTER = "torch.distributed.checkpoint._async_thread_executor"
PROCESS_CHECKPOINTER = "torch.distributed.checkpoint._async_process_executor"
ASYNC_MODULES = (STAGER, STAGING, THREAD_CHECKPOINTER, PROCESS_CHECKPOINTER)
# DCP's load planning: which keys a load reads, and how it reshards a checkpoint into the
# placements the load asks for.
DEFAULT_PLANNER = "torch.distributed.checkpoint.default_planner"
PLANNER_HELPERS = "torch.distributed.checkpoint.planner_helpers"
# DCP's conversions to and from torch.save files, its Hugging Face safetensors writer, and its
# reader of fp8 safetensors published with block scales.
FORMAT_UTILS = "torch.distributed.checkpoint.format_utils"
HF_STORAGE = "torch.distributed.checkpoint.hf_storage"
QUANTIZED_HF_STORAGE = "torch.distributed.checkpoint.quantized_hf_storage"
# DCP's file storage, as it reads checkpoints that other releases wrote and as it writes them
# to a store that fails; its fsspec storage, for stores besides a local folder.
FILESYSTEM = "torch.distributed.checkpoint.filesystem"
FSSPEC = "torch.distributed.checkpoint._fsspec_filesystem"
# DCP's experimental checkpointer: its reader of each rank's file.
EXPERIMENTAL_READER = "torch.distributed.checkpoint._experimental.checkpoint_reader"
# What a run keeps beside its model and optimizer: schedules, the loss scaler, and the
# position of torchdata's StatefulDataLoader (its batch sampler).
LR_SCHEDULER = "torch.optim.lr_scheduler"
GRAD_SCALER = "torch.amp.grad_scaler"
DATA_LOADER_SAMPLER = "torchdata.stateful_dataloader.sampler"
RUN_STATE_MODULES = (LR_SCHEDULER, GRAD_SCALER, DATA_LOADER_SAMPLER)
UPSTREAM_MODULES = (
    *MODELLED_MODULES,
    *ASYNC_MODULES,
    DEFAULT_PLANNER,
    PLANNER_HELPERS,
    FORMAT_UTILS,
    HF_STORAGE,
    QUANTIZED_HF_STORAGE,
    FILESYSTEM,
    FSSPEC,
    EXPERIMENTAL_READER,
    *RUN_STATE_MODULES,
)

Mutate = Callable[[Callable[..., Any]], Callable[..., Any]]


@dataclass(frozen=True)
class Mutant:
    """One bug: ``mutate`` turns ``upstream.target`` into its broken replacement.

    ``target`` is a function of the module, or ``Class.method``; ``tests`` are tried first
    (the tests most likely to see the bug);
    ``everywhere`` False patches ``upstream`` alone, for a helper other
    modules also use for other purposes. ``equivalent`` says why no test
    can observe the bug on the worlds the gate runs, where that is so.
    """

    name: str
    upstream: str
    target: str
    bug: str
    mutate: Mutate
    tests: tuple[str, ...] = ()
    everywhere: bool = True
    equivalent: str | None = None

    def __post_init__(self) -> None:
        if self.upstream not in UPSTREAM_MODULES:
            raise ValueError(f"{self.name}: {self.upstream} is not a module the suite judges")
        if not self.name.isidentifier():
            raise ValueError(f"mutant name {self.name!r} must be an identifier")


def mutant_maker(upstream: str, *default_tests: str) -> Callable[..., Mutant]:
    """The constructor of ``upstream``'s mutants: ``make(name, target, bug, mutate, *tests,
    **options)``; a mutant's own ``tests`` run before the module's ``default_tests``."""

    def make(
        name: str, target: str, bug: str, mutate: Mutate, *tests: str, **options: Any
    ) -> Mutant:
        return Mutant(name, upstream, target, bug, mutate, (*tests, *default_tests), **options)

    return make
