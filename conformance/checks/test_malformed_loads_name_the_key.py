"""Errors name the key: a malformed optimizer state dict is refused by its key path.

Judged against what a user can act on, not against the oracle. A cell trains two Adam steps
and reads its optimizer state dict with ``get_optimizer_state_dict``: sharded or full, nested
or flattened. It reads once per world and keeps the dict for every spoil, each spoiling a
copy. The dict is spoiled in one way, alike on every rank. It is then loaded with
``set_optimizer_state_dict`` (strict, the default) into a fresh model and optimizer of the
same cell, which trains one step. On a pipeline, the stage holding ``fc1.weight`` is given
the spoiled dict, and the other stage its own, unspoiled: it must load it. What is spoiled,
in ``fc1.weight``'s state:

- ``missing_state``: the parameter's whole state is left out;
- ``missing_entry``: its ``exp_avg_sq`` is left out;
- ``unknown_key``: state for ``fc3.weight``, a parameter the model does not have (the dict
  may hold several optimizers' state, but none of a parameter that is not in the model);
- ``wrong_shape``: its ``exp_avg`` has one more row;
- ``wrong_dtype``: its ``exp_avg`` is ``float64``.

The control, ``none``, loads the dict as read: it must load, and the next step must run.
The shape and dtype spoils are made on the full dicts, whose values are plain tensors on
every cell. The load, or the step after it, must raise an error on every rank. Its message
names the parameter, and the entry where one entry is spoiled. The one exception is a dtype
that can be converted. A load may instead convert it as
``torch.optim.Optimizer.load_state_dict`` converts state (to the parameter's dtype). Then the
loaded values must equal the given ones.

Each of these is a failure that says which rank saw what:

- an error that does not name the key, such as pytorch#192224's ``TypeError`` for a
  flattened dict missing a parameter's state;
- a spoil accepted silently;
- ranks that disagree on whether the load failed.

Each cell runs at its smallest world size above one and at 4. The oracle is held to the same
contract by its own test here. It refuses each spoil by key path before loading anything
(``reference_impl/_optim_input.py``). The FSDP1 + TP cell, which the oracle does not model, is
skipped there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch
import torch.distributed as dist

import reference_impl as ri
from conformance._upstream import dsd, quiet_deprecations
from conformance.cells import PARALLELISMS, Parallelism, first_size_and_four
from conformance.compare import holds
from conformance.models.common import train
from conformance.models.optimizers import adam
from conformance.models.zoo import model_of

PARAM = "fc1.weight"
UNKNOWN = "fc3.weight"
PATHS: dict[str, dict[str, bool]] = {
    "nested": {},
    "flattened": {"flatten_optimizer_state_dict": True},
    "full_nested": {"full_state_dict": True},
    "full_flattened": {"full_state_dict": True, "flatten_optimizer_state_dict": True},
}


class Editable:
    """A nested or a flattened optimizer state dict, read and edited one parameter's state at
    a time (``entries``: that state as a nested dict would hold it)."""

    def __init__(self, given: dict[str, Any], flattened: bool) -> None:
        self.given = given
        self.flattened = flattened

    def entries(self, fqn: str) -> dict[str, Any]:
        if not self.flattened:
            return dict(self.given["state"][fqn])
        prefix = f"state.{fqn}."
        return {key[len(prefix) :]: v for key, v in self.given.items() if key.startswith(prefix)}

    def drop(self, fqn: str, entry: str | None = None) -> None:
        if not self.flattened:
            if entry is None:
                del self.given["state"][fqn]
            else:
                self.given["state"][fqn] = {
                    k: v for k, v in self.given["state"][fqn].items() if k != entry
                }
            return
        for name in list(self.entries(fqn)):
            if entry is None or name == entry:
                del self.given[f"state.{fqn}.{name}"]

    def put(self, fqn: str, entry: str, value: Any) -> None:
        if self.flattened:
            self.given[f"state.{fqn}.{entry}"] = value
        else:
            self.given["state"][fqn] = {**self.given["state"].get(fqn, {}), entry: value}


@dataclass(frozen=True)
class Spoil:
    """One way to spoil ``PARAM``'s state: ``apply`` changes the dict (never a tensor in
    place), ``names`` are what an error about it must say; ``full_only``: it changes values,
    which are plain tensors on every cell only in full state dicts; ``convertible``: a load
    may convert it as ``torch.optim`` converts state instead of refusing it."""

    description: str
    apply: Callable[[Editable], None]
    names: tuple[str, ...]
    full_only: bool = False
    convertible: bool = False


def _unknown(state: Editable) -> None:
    for entry, value in state.entries(PARAM).items():
        state.put(UNKNOWN, entry, value)


def _nothing(_: Editable) -> None:
    """The control: the dict as it was read."""


def _one_more_row(state: Editable) -> None:
    exp_avg = state.entries(PARAM)["exp_avg"]
    state.put(PARAM, "exp_avg", torch.cat([exp_avg, exp_avg[:1]]))


SPOILS: dict[str, Spoil] = {
    "none": Spoil("the dict as read, unspoiled (the control: it must load)", _nothing, ()),
    "missing_state": Spoil(f"no state for {PARAM}", lambda s: s.drop(PARAM), (PARAM,)),
    "missing_entry": Spoil(
        f"no exp_avg_sq for {PARAM}", lambda s: s.drop(PARAM, "exp_avg_sq"), (PARAM, "exp_avg_sq")
    ),
    "unknown_key": Spoil(f"state for {UNKNOWN}, not in the model", _unknown, (UNKNOWN,)),
    "wrong_shape": Spoil(
        f"{PARAM}'s exp_avg one row longer", _one_more_row, (PARAM, "exp_avg"), full_only=True
    ),
    "wrong_dtype": Spoil(
        f"{PARAM}'s exp_avg in float64",
        lambda s: s.put(PARAM, "exp_avg", s.entries(PARAM)["exp_avg"].double()),
        (PARAM, "exp_avg"),
        full_only=True,
        convertible=True,
    ),
}


def _applies(size: int, **params: Any) -> bool:
    full_path = params["path"].startswith("full")
    return (full_path or not SPOILS[params["spoil"]].full_only) and first_size_and_four("cell")(
        size, **params
    )


def _trained(cell: Parallelism, world: Any, steps: int) -> tuple[Any, Any]:
    model = model_of(cell, world)
    optimizer = adam(model)
    train(model, optimizer, steps=steps)
    return model, optimizer


def _attempt(action: Callable[[], None]) -> str | None:
    """``None`` if ``action`` raised nothing, else the error as a user reads it."""
    try:
        with quiet_deprecations():
            action()
    except Exception as error:  # any error is judged below by what it names
        return f"{type(error).__name__}: {error}"
    return None


def _everyone(outcome: Any) -> list[Any]:
    outcomes: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(outcomes, outcome)
    return outcomes


def _converted_as_given(
    api: Any, model: Any, optimizer: Any, given: Any, options: Any
) -> str | None:
    """Where a convertible spoil loaded: how the loaded ``exp_avg`` differs from the given."""
    full = api.StateDictOptions(full_state_dict=True)
    loaded = api.get_optimizer_state_dict(model, optimizer, options=full)["state"][PARAM]
    expected = Editable(given, options.flatten_optimizer_state_dict).entries(PARAM)["exp_avg"]
    got = loaded["exp_avg"]
    if got.dtype != torch.float32 or not torch.equal(got, expected.to(torch.float32)):
        return (
            f"loaded {PARAM}'s exp_avg as {got.dtype} {got.flatten()[:6].tolist()}, given "
            f"{expected.dtype} {expected.flatten()[:6].tolist()}"
        )
    return None


def _verdict(spoil: Spoil, outcomes: list[str | None], spoiled: list[bool]) -> list[str]:
    """What each rank got wrong, given every rank's error (``None``: none raised) and whether
    its input was spoiled (a pipeline's stage that does not hold ``PARAM`` loads its own
    part, unspoiled)."""
    wrong = []
    for rank, outcome in enumerate(outcomes):
        if not spoil.names or not spoiled[rank]:
            if outcome is not None:
                wrong.append(f"rank {rank}: refused it: {outcome}")
        elif outcome is None:
            wrong.append(f"rank {rank}: accepted it silently, and trained a step")
        elif not all(name in outcome for name in spoil.names):
            wrong.append(f"rank {rank}: raised an error that names no {spoil.names}: {outcome}")
    return wrong


def _copied(tree: Any) -> Any:
    """``tree`` with its containers and tensors copied (a DTensor or ShardedTensor by its
    own ``clone``; ``copy.deepcopy`` took a tenth longer per case): a case spoils and loads
    a copy of the kept read."""
    if isinstance(tree, dict):
        return {key: _copied(value) for key, value in tree.items()}
    if isinstance(tree, list):
        return [_copied(value) for value in tree]
    if isinstance(tree, torch.Tensor):
        return tree.clone()
    return tree


def _read_after_two_steps(api: Any, world: Any, cell: Parallelism, path: str) -> Any:
    """``api``'s optimizer state dict of ``cell`` read by ``path`` after two steps, copied:
    the read is the same for every spoil, so one is made per world and kept
    (``world.kept``)."""

    def read() -> Any:
        model, optimizer = _trained(cell, world, steps=2)
        options = api.StateDictOptions(**PATHS[path])
        return api.get_optimizer_state_dict(model, optimizer, options=options)

    api_name = "oracle" if api is ri else "torch"
    return _copied(world.kept((__name__, api_name, cell.name, path), read))


def _judge(api: Any, world: Any, cell: str, path: str, spoil: str) -> None:
    """``api``'s optimizer state dict, read after two steps and spoiled, loaded into fresh
    objects of ``cell``: fails naming each rank that accepted it, or refused it by no key."""
    parallelism, bad = PARALLELISMS[cell], SPOILS[spoil]
    options = api.StateDictOptions(**PATHS[path])
    given = _read_after_two_steps(api, world, parallelism, path)
    fresh, fresh_optimizer = _trained(parallelism, world, steps=0)
    spoiled_here = holds(fresh)(PARAM)  # a pipeline's other stages hold no state of it
    if spoiled_here:
        bad.apply(Editable(given, options.flatten_optimizer_state_dict))
    spoiled = _everyone(spoiled_here)

    outcomes = _everyone(
        _attempt(
            lambda: api.set_optimizer_state_dict(fresh, fresh_optimizer, given, options=options)
        )
    )
    if not any(outcomes) and bad.convertible:
        wrong = None
        if spoiled_here:
            wrong = _converted_as_given(api, fresh, fresh_optimizer, given, options)
        assert wrong is None, f"rank {world.rank}: {path} load of {bad.description}: {wrong}"
        return
    if not any(outcomes):
        outcomes = _everyone(_attempt(lambda: train(fresh, fresh_optimizer, steps=1)))
    wrong = _verdict(bad, outcomes, spoiled)
    assert not wrong, f"{path} load of {bad.description}:\n" + "\n".join(wrong)


def _every_case(test: Callable[..., None]) -> Callable[..., None]:
    """The cases both tests judge: each cell at its first size and 4, each path, each spoil."""
    test = pytest.mark.parametrize("cell", sorted(PARALLELISMS))(test)
    test = pytest.mark.parametrize("path", sorted(PATHS))(test)
    test = pytest.mark.parametrize("spoil", sorted(SPOILS))(test)
    return pytest.mark.world(2, 4, applies=_applies)(test)


@_every_case
def test_a_malformed_optimizer_load_names_the_key(world, cell, path, spoil):
    _judge(dsd, world, cell, path, spoil)


@_every_case
def test_the_oracle_names_the_key_of_a_malformed_optimizer_load(world, cell, path, spoil):
    _judge(ri, world, cell, path, spoil)
