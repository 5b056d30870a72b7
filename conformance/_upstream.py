"""The torch build's functions under test, found by introspection.

A function missing from the build under test is a skip that says which
function and which torch, never an error.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import pytest
import torch

STATE_DICT_UTILS = "torch.distributed._state_dict_utils"


def upstream(module: str, name: str) -> Callable[..., Any]:
    """``module.name`` from the torch under test, or skip naming what is missing."""
    try:
        found = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        pytest.skip(f"torch {torch.__version__} has no {module}.{name}")
    return found  # type: ignore[no-any-return]
