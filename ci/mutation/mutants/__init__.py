"""A catalogue of small, plausible bugs in torch's state-dict code, and how to apply one.

A mutant replaces one function (or one method of a class) of one upstream module with a
wrapper that misbehaves in one named way. ``apply`` installs it wherever torch's modules
hold the original (``from x import f`` copies included), so the suite runs
unchanged against the broken build. ``ci.mutation.mutants.activate`` applies the
mutant ``GATE_MUTANT`` names at a rank's start-up; ``ci.mutation`` runs the
suite against each mutant and reports which test killed it.
"""

from __future__ import annotations

import functools
import importlib
import sys
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
ASYNC_MODULES = (STAGER, STAGING, THREAD_CHECKPOINTER)
# DCP's load planning: which keys a load reads, and how it reshards a checkpoint into the
# placements the load asks for.
DEFAULT_PLANNER = "torch.distributed.checkpoint.default_planner"
PLANNER_HELPERS = "torch.distributed.checkpoint.planner_helpers"
# DCP's conversions to and from torch.save files, and its Hugging Face safetensors writer.
FORMAT_UTILS = "torch.distributed.checkpoint.format_utils"
HF_STORAGE = "torch.distributed.checkpoint.hf_storage"
UPSTREAM_MODULES = (
    *MODELLED_MODULES,
    *ASYNC_MODULES,
    DEFAULT_PLANNER,
    PLANNER_HELPERS,
    FORMAT_UTILS,
    HF_STORAGE,
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


def apply(mutant: Mutant) -> list[str]:
    """Install ``mutant``; return the modules whose attribute was replaced."""
    for name in (*MODELLED_MODULES, "torch.distributed.fsdp", mutant.upstream):
        importlib.import_module(name)
    home = sys.modules[mutant.upstream]
    owner_name, _, attribute = mutant.target.rpartition(".")
    owner = getattr(home, owner_name) if owner_name else home
    original = getattr(owner, attribute)
    replacement = functools.wraps(original)(mutant.mutate(original))
    if owner is not home:  # a method: its class is the one holder
        setattr(owner, attribute, replacement)
        return [mutant.upstream]
    holders = [home]
    if mutant.everywhere:
        holders = [
            module
            for name, module in list(sys.modules.items())
            if name.startswith("torch") and getattr(module, mutant.target, None) is original
        ]
    for module in holders:
        setattr(module, mutant.target, replacement)
    return sorted(module.__name__ for module in holders)


def catalogue() -> dict[str, Mutant]:
    """Every mutant, by name, from the catalogue module of each upstream module."""
    from ci.mutation.mutants import (
        checkpoint_async,
        checkpoint_formats,
        checkpoint_planning,
        checkpoint_state_dict,
        fsdp_optim_utils,
        fsdp_state_dict_utils,
        state_dict_utils,
    )

    mutants: dict[str, Mutant] = {}
    for module in (
        state_dict_utils,
        checkpoint_state_dict,
        fsdp_optim_utils,
        fsdp_state_dict_utils,
        checkpoint_async,
        checkpoint_planning,
        checkpoint_formats,
    ):
        for mutant in module.MUTANTS:
            if mutant.name in mutants:
                raise ValueError(f"two mutants are named {mutant.name}")
            mutants[mutant.name] = mutant
    return mutants
