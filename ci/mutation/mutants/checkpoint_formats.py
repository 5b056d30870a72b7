"""Mutants of DCP's format conversions (``torch/distributed/checkpoint/format_utils.py``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ci.mutation.mutants import FORMAT_UTILS, mutant_maker

Fn = Callable[..., Any]
CONVERSIONS = "conformance/test_format_conversions.py"


def _tensors_only(tree: Any) -> Any:
    """``tree`` with every leaf that is not a tensor left out, and containers left empty."""
    if isinstance(tree, torch.Tensor):
        return tree
    if isinstance(tree, dict):
        kept = {key: _tensors_only(value) for key, value in tree.items()}
        return {key: value for key, value in kept.items() if value is not None}
    if isinstance(tree, (list, tuple)):
        kept_items = [item for item in map(_tensors_only, tree) if item is not None]
        return kept_items or None
    return None


def _drops_non_tensor_state(original: Fn) -> Fn:
    def convert(dcp_checkpoint_dir: Any, torch_save_path: Any) -> None:
        original(dcp_checkpoint_dir, torch_save_path)
        state = torch.load(torch_save_path, weights_only=False)
        torch.save(_tensors_only(state), torch_save_path)

    return convert


MUTANTS = [
    mutant_maker(FORMAT_UTILS, CONVERSIONS)(
        "dcp_to_torch_save_drops_non_tensor_state",
        "dcp_to_torch_save",
        "converting a DCP checkpoint to a torch.save file keeps its tensors and drops the "
        "rest (an optimizer's param groups and hyper-parameters)",
        _drops_non_tensor_state,
    ),
]
