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
from types import ModuleType

from ci.mutation.mutants import (
    checkpoint_async,
    checkpoint_experimental,
    checkpoint_files,
    checkpoint_formats,
    checkpoint_planning,
    checkpoint_state_dict,
    fsdp_optim_utils,
    fsdp_state_dict_utils,
    run_state,
    state_dict_utils,
)
from ci.mutation.mutants._mutant import (
    MODELLED_MODULES,
    UPSTREAM_MODULES,
    Mutant,
)

__all__ = [
    "MODELLED_MODULES",
    "UPSTREAM_MODULES",
    "Mutant",
    "apply",
    "catalogue",
    "missing_target",
]


def missing_target(mutant: Mutant) -> str | None:
    """Why the torch under test has no ``mutant.target`` to break (its module or the function is
    not in this release, as DCP's stagers are not in 2.6), or None where it has one. A module
    that is there but fails to import is no absence: its error propagates."""
    import torch

    try:
        home = importlib.import_module(mutant.upstream)
    except ModuleNotFoundError as error:
        if error.name is None or not mutant.upstream.startswith(error.name):
            raise
        return f"torch {torch.__version__} has no module {mutant.upstream}"
    try:
        owner, attribute = _owner_of(home, mutant.target)
        getattr(owner, attribute)
    except AttributeError:
        return f"torch {torch.__version__}'s {mutant.upstream} has no {mutant.target}"
    return None


def _owner_of(home: ModuleType, target: str) -> tuple[object, str]:
    """What holds ``target`` in ``home`` (the module, or the class of ``Class.method``), and
    the attribute's name there."""
    owner_name, _, attribute = target.rpartition(".")
    return (getattr(home, owner_name) if owner_name else home), attribute


def apply(mutant: Mutant) -> list[str]:
    """Install ``mutant``; return the modules whose attribute was replaced."""
    for name in (*MODELLED_MODULES, "torch.distributed.fsdp", mutant.upstream):
        importlib.import_module(name)
    home = sys.modules[mutant.upstream]
    owner, attribute = _owner_of(home, mutant.target)
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
    mutants: dict[str, Mutant] = {}
    for module in (
        state_dict_utils,
        checkpoint_state_dict,
        fsdp_optim_utils,
        fsdp_state_dict_utils,
        checkpoint_async,
        checkpoint_planning,
        checkpoint_formats,
        checkpoint_files,
        checkpoint_experimental,
        run_state,
    ):
        for mutant in module.MUTANTS:
            if mutant.name in mutants:
                raise ValueError(f"two mutants are named {mutant.name}")
            mutants[mutant.name] = mutant
    return mutants
