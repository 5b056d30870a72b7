"""Modules every rank process imports before it joins its world.

``HARNESS_PRELOAD`` names them, comma-separated: a fork's instrumentation,
or a deliberately broken torch (``ci.mutation``) that the unmodified suite
must catch. An import error fails the world's start-up, loudly. Then torch's
own: what a rank's tests would otherwise import inside their first test.
"""

from __future__ import annotations

import contextlib
import importlib
import os

PRELOAD = "HARNESS_PRELOAD"


def import_preloads() -> list[str]:
    """Import each module ``HARNESS_PRELOAD`` names; return their names."""
    names = [name.strip() for name in os.environ.get(PRELOAD, "").split(",") if name.strip()]
    for name in names:
        importlib.import_module(name)
    return names


def import_torch() -> None:
    """Import ``torch.distributed``, and dynamo, which torch imports itself at the first DTensor
    made or model compiled (``torch/_compile.py``): imported at a rank's start (in a template,
    before the fork), it lands in no test's time or memory reading."""
    import torch.distributed

    with contextlib.suppress(ImportError):  # a build without dynamo never imports it
        import torch._dynamo  # noqa: F401
