"""FSDP1 optimizer state in the corners upstream's ``test_fsdp_optim_state.py`` covers.

Each case builds an optimizer over an FSDP1 cell in an unusual way. Every FSDP1 cell runs each
case at its smallest world size, full and sharded. The cases:

- no step taken yet (empty state);
- a parameter order that differs between ranks (reversed on odd ranks);
- user values (``2.74``, ``None``) in each parameter's state, of Adam, and of SGD without
  momentum, which holds nothing else;
- a ``_NamedOptimizer`` keyed by names.

Each case holds torch to the oracle in ``FSDP.optim_state_dict`` under the full and the
sharded config, and in ``FSDP.optim_state_dict_to_load`` of that. A fresh optimizer loaded
with it must give the saved state back, and the round trip must equal the oracle's. The order
of names within one parameter's state is not compared here: FSDP1 returns NO_SHARD's entries
in the optimizer's own order, user values last.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch

import reference_impl as ri
from conformance._upstream import dist_optim, fsdp
from conformance.cells import PARALLELISMS, first_size_only
from conformance.compare import assert_trees_identical
from conformance.models.common import batch, seeded_mlp, train
from conformance.models.optimizers import adam
from conformance.training import FSDP1_CELLS, state_names_sorted, under_optim_settings

LR = 0.01

Build = Callable[[torch.nn.Module, int], torch.optim.Optimizer]


def _adam(model: torch.nn.Module, rank: int) -> torch.optim.Optimizer:
    return adam(model)


def _stateless_sgd(model: torch.nn.Module, rank: int) -> torch.optim.Optimizer:
    """SGD without momentum holds no tensor state: only what the user puts there."""
    return torch.optim.SGD(model.parameters(), lr=LR)


def _adam_reversed_on_odd_ranks(model: torch.nn.Module, rank: int) -> torch.optim.Optimizer:
    """Parameter IDs then name different parameters on different ranks."""
    params = list(model.parameters())
    return torch.optim.Adam(params[::-1] if rank % 2 else params, lr=LR)


def _named_adam(model: torch.nn.Module, rank: int) -> torch.optim.Optimizer:
    """A NamedOptimizer: its state dict is keyed by the wrapped model's parameter names."""

    return dist_optim._NamedOptimizer(
        model.named_parameters(), torch.optim.Adam, lr=LR, module=model
    )


def _no_steps(model: Any, optimizer: torch.optim.Optimizer) -> None:
    """Nothing to train: the state is empty, the param groups are not."""


def _two_steps(model: Any, optimizer: torch.optim.Optimizer) -> None:
    train(model, optimizer, 2)


def _two_steps_clearing_grads_by_the_model(model: Any, optimizer: torch.optim.Optimizer) -> None:
    """``_NamedOptimizer.zero_grad`` is ``Optimizer``'s, which needs the ``defaults`` it lacks."""
    for step in range(2):
        model.zero_grad()
        model(batch(step)).pow(2).mean().backward()
        optimizer.step()


def _two_steps_then_user_values(model: Any, optimizer: torch.optim.Optimizer) -> None:
    """Non-tensor values in every parameter's state travel as they are."""
    train(model, optimizer, 2)
    for state in optimizer.state.values():
        state["user_float"] = 2.74
        state["user_none"] = None


# case: (optimizer builder, what happens before the save, NamedOptimizer?)
CASES: dict[str, tuple[Build, Callable[[Any, torch.optim.Optimizer], None], bool]] = {
    "no_step_yet": (_adam, _no_steps, False),
    "reversed_order_on_odd_ranks": (_adam_reversed_on_odd_ranks, _two_steps, False),
    "user_values_in_state": (_adam, _two_steps_then_user_values, False),
    "named_optimizer": (_named_adam, _two_steps_clearing_grads_by_the_model, True),
    "user_values_in_stateless_sgd": (_stateless_sgd, _two_steps_then_user_values, False),
}


@pytest.mark.world(2, 4, applies=first_size_only())
@pytest.mark.parametrize("kind", ["full", "sharded"])
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("name", FSDP1_CELLS)
def test_save_load_and_round_trip_match_the_oracle(world, name, case, kind):
    cell = PARALLELISMS[name]
    cell.require(world.size)
    build, before_save, named = CASES[case]
    model = cell.parallelise(seeded_mlp(), world)
    optimizer = build(model, world.rank)
    before_save(model, optimizer)
    sharded = kind == "sharded"
    save = fsdp.FullyShardedDataParallel.optim_state_dict
    theirs = under_optim_settings(model, kind, lambda: save(model, optimizer))
    saved = ri.fsdp_optim_state_dict(model, optimizer, shard_state=sharded)
    assert_trees_identical(state_names_sorted(theirs), state_names_sorted(saved))

    fresh = build(model, world.rank)
    if named:
        fresh.init_state()  # a NamedOptimizer loads in place: its state must exist
    theirs_to_load = under_optim_settings(
        model,
        kind,
        lambda: fsdp.FullyShardedDataParallel.optim_state_dict_to_load(
            model, fresh, copy.deepcopy(saved), is_named_optimizer=named
        ),
    )
    ours_to_load = ri.fsdp_optim_state_dict_to_load(
        model, fresh, copy.deepcopy(saved), is_named_optimizer=named
    )
    assert_trees_identical(state_names_sorted(theirs_to_load), state_names_sorted(ours_to_load))
    # A NamedOptimizer over an FSDP1 model converts FQN-keyed state itself when loading.
    fresh.load_state_dict(copy.deepcopy(saved) if named else ours_to_load)
    loaded = ri.fsdp_optim_state_dict(model, fresh, shard_state=sharded)
    assert_trees_identical(state_names_sorted(loaded), state_names_sorted(saved))
