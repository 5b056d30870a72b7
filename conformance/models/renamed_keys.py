"""Models whose state-dict hooks rename a key, as models that fuse new rows into a pretrained
embedding do to keep the pretrained checkpoint's names.

``FusedEmbedding`` holds a pretrained ``embedding`` and the ``fusion`` rows added to it; its
state dict names them as its attributes do. ``RenamingKeys`` saves ``embedding.weight`` as
``weight`` and loads ``weight`` back into ``embedding``; ``NamingItsRenames`` also tells
``torch.distributed.checkpoint.state_dict`` of the rename through ``_fqn_modifiers``, the
documented way (in that module's ``_get_fqns``) for a module to say which attribute a renamed
key lives in.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from conformance.models.common import SEED

VOCABULARY = 6
FUSED = 3
WIDTH = 4


class FusedEmbedding(nn.Module):
    """Token ids below ``VOCABULARY`` look up ``embedding``, the rest ``fusion``."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(VOCABULARY, WIDTH)
        self.fusion = nn.Embedding(FUSED, WIDTH)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        table = torch.cat([self.embedding.weight, self.fusion.weight])
        return table[tokens]


class RenamingKeys(FusedEmbedding):
    """``embedding.weight`` is ``weight`` in the state dict, both ways."""

    def __init__(self) -> None:
        super().__init__()
        self._register_state_dict_hook(_saved_as_weight)
        self._register_load_state_dict_pre_hook(_loaded_into_embedding, with_module=True)


class NamingItsRenames(RenamingKeys):
    def _fqn_modifiers(self) -> dict[str, str]:
        """The state dict's ``weight`` is the ``weight`` of the ``embedding`` attribute."""
        return {"weight": "embedding"}


def _saved_as_weight(module: nn.Module, state_dict: dict[str, Any], prefix: str, *_: Any) -> None:
    state_dict[prefix + "weight"] = state_dict.pop(prefix + "embedding.weight")


def _loaded_into_embedding(
    module: nn.Module, state_dict: dict[str, Any], prefix: str, *_: Any
) -> None:
    if prefix + "weight" in state_dict:
        state_dict[prefix + "embedding.weight"] = state_dict.pop(prefix + "weight")


def seeded(kind: type[FusedEmbedding], seed: int = SEED) -> FusedEmbedding:
    torch.manual_seed(seed)
    return kind()
