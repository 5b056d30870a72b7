"""Keys renamed by a model's state-dict hooks, through ``get_state_dict`` and
``set_state_dict`` (``conformance/models/renamed_keys.py``).

On every rank of 1 and 2:

- ``get_model_state_dict`` of a model that saves ``embedding.weight`` as ``weight`` gives the
  renamed key: its own state dict, and the oracle's where the model names the rename.
- That state dict loads into a model that renames its keys as it was saved, and that names
  the rename (``_fqn_modifiers``); it is refused, naming the missing key, by one that does not
  rename. Torch and the oracle agree on each, and the model loaded holds the saved values.
"""

from __future__ import annotations

from typing import Any

import pytest

import reference_impl as ri
from conformance._upstream import dsd
from conformance.compare import assert_trees_identical
from conformance.models.common import SEED
from conformance.models.renamed_keys import (
    FusedEmbedding,
    NamingItsRenames,
    RenamingKeys,
    seeded,
)


def _on(world: Any, kind: type[FusedEmbedding], seed: int = SEED) -> Any:
    return seeded(kind, seed).to(world.device)


@pytest.mark.world(1, 2)
def test_a_renamed_key_is_saved_as_its_hooks_name_it(world):
    """Without parallelism ``get_model_state_dict`` is the model's own state dict; where the
    model names its renames, the oracle's too."""
    for kind in (RenamingKeys, NamingItsRenames):
        model = _on(world, kind)
        theirs = dsd.get_model_state_dict(model)
        assert sorted(theirs) == ["fusion.weight", "weight"], kind.__name__
        assert_trees_identical(theirs, model.state_dict(), kind.__name__)
    assert_trees_identical(theirs, ri.get_model_state_dict(model), "NamingItsRenames")


@pytest.mark.world(1, 2)
def test_a_renamed_key_loads_where_the_rename_is_named_and_is_missing_where_it_is_not(world):
    saved = dsd.get_model_state_dict(_on(world, RenamingKeys))
    for set_state in (dsd.set_model_state_dict, ri.set_model_state_dict):
        with pytest.raises(RuntimeError, match=r"(?i)missing key.*embedding\.weight"):
            set_state(_on(world, FusedEmbedding, seed=7), dict(saved))
        model = _on(world, NamingItsRenames, seed=7)
        set_state(model, dict(saved))
        assert_trees_identical(model.embedding.weight.detach(), saved["weight"])
        assert_trees_identical(model.fusion.weight.detach(), saved["fusion.weight"])
