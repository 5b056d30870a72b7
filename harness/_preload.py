"""Modules every rank process imports before it joins its world.

``HARNESS_PRELOAD`` names them, comma-separated: a fork's instrumentation,
or a deliberately broken torch (``ci.mutation``) that the unmodified suite
must catch. An import error fails the world's start-up, loudly.
"""

from __future__ import annotations

import importlib
import os

PRELOAD = "HARNESS_PRELOAD"


def import_preloads() -> list[str]:
    """Import each module ``HARNESS_PRELOAD`` names; return their names."""
    names = [name.strip() for name in os.environ.get(PRELOAD, "").split(",") if name.strip()]
    for name in names:
        importlib.import_module(name)
    return names
