"""Keys renamed by a model's state-dict hooks, through ``get_state_dict`` and
``set_state_dict`` (``conformance/models/renamed_keys.py``).

On every rank of 1 and 2:

- ``get_model_state_dict`` of a model that saves ``embedding.weight`` as ``weight`` gives the
  renamed key: its own state dict, and the oracle's where the model names the rename.
- That state dict loads into a model that renames its keys as it was saved, and that names
  the rename (``_fqn_modifiers``): as given, as a full state dict, and broadcast from rank 0.
  As given it is refused, naming the missing key, by a model that does not rename. Torch and
  the oracle agree on each, and the model loaded holds the saved values.
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


LOADS = {
    "as_given": {},
    "full": {"full_state_dict": True},
    "broadcast": {"full_state_dict": True, "broadcast_from_rank0": True},
}


@pytest.mark.world(1, 2)
@pytest.mark.parametrize("load", sorted(LOADS))
def test_a_renamed_key_loads_where_the_rename_is_named_and_is_missing_where_it_is_not(world, load):
    """Loaded as given, as a full state dict, and broadcast from rank 0 (the others given
    ``{}``): a full load places each key by the model's own names, so only a model that names
    its renames can take the renamed key."""
    saved = dsd.get_model_state_dict(_on(world, RenamingKeys))
    given = dict(saved) if world.rank == 0 or load != "broadcast" else {}
    loads = (
        lambda model: dsd.set_model_state_dict(
            model, dict(given), options=dsd.StateDictOptions(**LOADS[load])
        ),
        lambda model: ri.set_model_state_dict(
            model, dict(given), options=ri.StateDictOptions(**LOADS[load])
        ),
    )
    for set_state in loads:
        if load == "as_given":
            with pytest.raises(RuntimeError, match=r"(?i)missing key.*embedding\.weight"):
                set_state(_on(world, FusedEmbedding, seed=7))
        model = _on(world, NamingItsRenames, seed=7)
        set_state(model)
        assert_trees_identical(model.embedding.weight.detach(), saved["weight"])
        assert_trees_identical(model.fusion.weight.detach(), saved["fusion.weight"])
