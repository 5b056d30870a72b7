"""Imported at a rank's start-up (``HARNESS_PRELOAD=ci.mutation.mutants.activate``): applies the
mutant ``GATE_MUTANT`` names, or fails the start-up naming the unknown mutant."""

from __future__ import annotations

import os

from ci.mutation.mutants import apply, catalogue

MUTANT = "GATE_MUTANT"

_name = os.environ.get(MUTANT, "")
if _name:
    _mutants = catalogue()
    if _name not in _mutants:
        raise LookupError(f"{MUTANT}={_name!r} names no mutant; known: {sorted(_mutants)}")
    apply(_mutants[_name])
