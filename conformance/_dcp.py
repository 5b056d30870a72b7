"""Checkpoints through ``torch.distributed.checkpoint``, as a training loop takes them.

The torch build's ``get_state_dict`` gives what DCP saves and the shapes DCP
loads into; ``set_state_dict`` then puts the loaded state back.
"""

from __future__ import annotations

from typing import Any

import torch

from conformance._upstream import dcp, dsd


def _dcp_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    model_state, optim_state = dsd.get_state_dict(model, optimizer)
    return {"model": model_state, "optim": optim_state}


def save_checkpoint(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, path: str, **kwargs: Any
) -> None:
    """Save the model's and optimizer's state under ``path`` (``kwargs`` go to ``dcp.save``)."""
    dcp.save(_dcp_state(model, optimizer), checkpoint_id=path, **kwargs)


def load_checkpoint(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, path: str, **kwargs: Any
) -> None:
    """Load ``path`` into the model and optimizer (``kwargs`` go to ``dcp.load``)."""
    state = _dcp_state(model, optimizer)
    dcp.load(state, checkpoint_id=path, **kwargs)
    dsd.set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
    )
