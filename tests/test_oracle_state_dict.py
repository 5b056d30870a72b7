"""The oracle's get/set state dict alone, in one process: names, options, optimizers, errors."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

import reference_impl as ri


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(3, 4)
        self.fc2 = nn.Linear(4, 2)
        self.register_buffer("scale", torch.ones(4))
        self.register_buffer("scratch", torch.zeros(1), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.fc1(x) * self.scale)


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(5, 3)
        self.head = nn.Linear(3, 5, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(tokens))


class WithExtraState(nn.Linear):
    def get_extra_state(self) -> dict[str, int]:
        return {"version": 3}

    def set_extra_state(self, state: dict[str, int]) -> None:
        self.loaded = state


class Hider(nn.Module):
    """Hides its ``inner`` level from FQNs through the modifier hook, as its hooks do for keys."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(2, 2)

    def _fqn_modifiers(self) -> dict[str, str]:
        return {"inner": "inner"}


CANONICAL = ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "scale"]


def trained(model: nn.Module, optimizer: torch.optim.Optimizer, steps: int = 2) -> None:
    for step in range(steps):
        optimizer.zero_grad()
        model(torch.full((2, 3), float(step + 1))).sum().backward()
        optimizer.step()


def test_names_skip_checkpoint_and_compile_wrappers() -> None:
    model = Net()
    model.fc1 = checkpoint_wrapper(model.fc1)
    compiled = torch.compile(model, backend="eager")
    assert sorted(ri.get_model_state_dict(compiled)) == sorted(CANONICAL)


def test_names_keep_tied_parameters_under_both_fqns_and_skip_non_persistent_buffers() -> None:
    state = ri.get_model_state_dict(Tied())
    assert sorted(state) == ["embed.weight", "head.weight"]
    assert ri.get_model_state_dict(Net()).keys() == Net().state_dict().keys()


def test_extra_state_is_part_of_the_model_state() -> None:
    model = nn.Sequential(WithExtraState(2, 2))
    state = ri.get_model_state_dict(model)
    assert state["0._extra_state"] == {"version": 3}
    ri.set_model_state_dict(model, state)
    assert model[0].loaded == {"version": 3}


def test_optimizer_state_is_keyed_by_canonical_fqns_and_groups_list_them() -> None:
    model = Net()
    optimizer = torch.optim.Adam(
        [{"params": model.fc1.parameters()}, {"params": model.fc2.parameters(), "lr": 0.5}]
    )
    trained(model, optimizer)
    state = ri.get_optimizer_state_dict(model, optimizer)
    assert sorted(state["state"]) == sorted(CANONICAL[:4])
    assert [g["params"] for g in state["param_groups"]] == [CANONICAL[:2], CANONICAL[2:4]]
    assert [g["lr"] for g in state["param_groups"]] == [0.001, 0.5]


def test_a_shared_parameter_is_named_by_its_first_fqn() -> None:
    model = Tied()
    optimizer = torch.optim.Adam(model.parameters())
    state = ri.get_optimizer_state_dict(model, optimizer)
    assert list(state["state"]) == ["embed.weight"]


def test_missing_optimizer_state_is_created_by_a_zero_lr_step() -> None:
    model = Net()
    before = copy.deepcopy(model.state_dict())
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    state = ri.get_optimizer_state_dict(model, optimizer)
    assert sorted(state["state"]) == sorted(CANONICAL[:4])
    assert all(p.grad is None for p in model.parameters())
    assert optimizer.param_groups[0]["lr"] == 0.1
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key


@pytest.mark.parametrize(
    "make",
    [
        lambda params: torch.optim.Adam(params, lr=0.1),
        lambda params: torch.optim.AdamW(params, lr=0.1, weight_decay=0.1),
        lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9),
        lambda params: torch.optim.Adagrad(params, lr=0.1, initial_accumulator_value=0.5),
    ],
    ids=["adam", "adamw", "sgd_momentum", "adagrad"],
)
def test_creating_optimizer_state_leaves_training_as_it_was(make) -> None:
    """pytorch#164929: the zero-lr step must not count as a step of training."""
    trajectories = []
    for read_first in (False, True):
        torch.manual_seed(0)
        model = Net()
        optimizer = make(model.parameters())
        if read_first:
            ri.get_optimizer_state_dict(model, optimizer)
        for step in range(3):
            optimizer.zero_grad()
            model(torch.full((2, 3), float(step + 1))).pow(2).sum().backward()
            optimizer.step()
        trajectories.append([p.detach().clone() for p in model.parameters()])
    for read, plain in zip(*reversed(trajectories), strict=True):
        assert torch.equal(read, plain)


def test_creating_optimizer_state_while_gradients_are_set_is_refused() -> None:
    model = Net()
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.ones(1, 3)).sum().backward()
    with pytest.raises(RuntimeError, match="parameters have gradients"):
        ri.get_optimizer_state_dict(model, optimizer)


def test_flattened_optimizer_state_round_trips() -> None:
    model = Net()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.2)
    trained(model, optimizer)
    nested = ri.get_optimizer_state_dict(model, optimizer)
    flat = ri.get_optimizer_state_dict(
        model, optimizer, options=ri.StateDictOptions(flatten_optimizer_state_dict=True)
    )
    assert flat["param_groups.fc1.weight.lr"] == 0.2
    assert torch.equal(flat["state.fc2.bias.exp_avg"], nested["state"]["fc2.bias"]["exp_avg"])
    fresh_model = Net()
    fresh = torch.optim.Adam(fresh_model.parameters(), lr=0.9)
    ri.set_optimizer_state_dict(fresh_model, fresh, flat)
    reloaded = ri.get_optimizer_state_dict(fresh_model, fresh)
    assert reloaded["param_groups"] == nested["param_groups"]
    for fqn, entries in nested["state"].items():
        for name, value in entries.items():
            assert torch.equal(reloaded["state"][fqn][name], value), f"{fqn}.{name}"


def test_flattening_refuses_state_it_cannot_flatten() -> None:
    with pytest.raises(TypeError, match=r"^state\.w\.note: .* not str"):
        ri.flatten_optimizer_state_dict({"state": {"w": {"note": "x"}}, "param_groups": []})


def test_flattened_groups_must_agree_within_a_group() -> None:
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    flat = ri.flatten_optimizer_state_dict(ri.get_optimizer_state_dict(model, optimizer))
    flat["param_groups.fc2.bias.lr"] = 0.3
    with pytest.raises(ValueError, match=r"^param_groups\.fc2\.bias\.lr: 0\.3, but fc1\.weight"):
        ri.set_optimizer_state_dict(model, optimizer, flat)


def test_split_takes_each_optimizers_own_parameters() -> None:
    model = Net()
    first = torch.optim.Adam(model.fc1.parameters(), lr=0.1)
    second = torch.optim.SGD(model.fc2.parameters(), lr=0.2, momentum=0.9)
    trained(model, _Both(first, second))
    merged = ri.get_optimizer_state_dict(model, [first, second])
    fresh_model = Net()
    fresh = (
        torch.optim.Adam(fresh_model.fc1.parameters()),
        torch.optim.SGD(fresh_model.fc2.parameters(), lr=0.7, momentum=0.9),
    )
    ri.set_optimizer_state_dict(fresh_model, fresh, merged)
    assert fresh[1].param_groups[0]["lr"] == 0.2
    assert list(ri.get_optimizer_state_dict(fresh_model, fresh[0])["state"]) == CANONICAL[:2]


class _Both(torch.optim.Optimizer):
    """Two optimizers stepped as one, for training."""

    def __init__(self, *optimizers: torch.optim.Optimizer) -> None:
        self.optimizers = optimizers

    def zero_grad(self, set_to_none: bool = True) -> None:
        for optimizer in self.optimizers:
            optimizer.zero_grad(set_to_none)

    def step(self, closure: object = None) -> None:  # type: ignore[override]
        for optimizer in self.optimizers:
            optimizer.step()


def test_frozen_parameters_are_left_out_on_request() -> None:
    model = Net()
    model.fc1.weight.requires_grad_(False)
    options = ri.StateDictOptions(ignore_frozen_params=True)
    assert "fc1.weight" not in ri.get_model_state_dict(model, options=options)


def test_frozen_parameters_keep_their_saved_optimizer_state() -> None:
    model = Net()
    optimizer = torch.optim.Adam(model.parameters())
    trained(model, optimizer)
    model.fc1.weight.requires_grad_(False)
    saved = copy.deepcopy(ri.get_optimizer_state_dict(model, optimizer))
    fresh_model = Net()
    fresh_model.fc1.weight.requires_grad_(False)
    fresh = torch.optim.Adam(fresh_model.parameters())
    ri.set_optimizer_state_dict(fresh_model, fresh, saved)
    assert "fc1.weight" in ri.get_optimizer_state_dict(fresh_model, fresh)["state"]


def _adam_state(flattened: bool = False) -> dict:
    model = Net()
    optimizer = torch.optim.Adam(model.parameters())
    trained(model, optimizer)
    options = ri.StateDictOptions(flatten_optimizer_state_dict=flattened)
    return copy.deepcopy(ri.get_optimizer_state_dict(model, optimizer, options=options))


def _load_into_fresh(state: dict, **options: bool) -> torch.optim.Optimizer:
    model = Net()
    optimizer = torch.optim.Adam(model.parameters())
    ri.set_optimizer_state_dict(model, optimizer, state, options=ri.StateDictOptions(**options))
    return optimizer


def test_strict_optimizer_load_names_state_of_a_parameter_the_model_lacks() -> None:
    nested, flattened = _adam_state(), _adam_state(flattened=True)
    nested["state"]["fc3.weight"] = nested["state"]["fc1.weight"]
    flattened["state.fc3.weight.exp_avg"] = flattened["state.fc1.weight.exp_avg"]
    for state in (nested, flattened):
        with pytest.raises(RuntimeError, match=r"optimizer state for fc3\.weight: no such param"):
            _load_into_fresh(state, flatten_optimizer_state_dict=state is flattened)
        _load_into_fresh(state, strict=False, flatten_optimizer_state_dict=state is flattened)


def test_strict_optimizer_load_names_a_missing_entry_by_its_key_path() -> None:
    state = _adam_state()
    del state["state"]["fc1.weight"]["exp_avg_sq"]
    with pytest.raises(KeyError, match=r"state\.fc1\.weight\.exp_avg_sq: missing"):
        _load_into_fresh(state)


def test_optimizer_load_names_a_tensor_of_another_shape_by_its_key_path() -> None:
    state = _adam_state()
    state["state"]["fc2.bias"]["exp_avg"] = torch.zeros(3)
    with pytest.raises(
        ValueError, match=r"state\.fc2\.bias\.exp_avg: shape \[3\], the optimizer keeps \[2\]"
    ):
        _load_into_fresh(state, strict=False)


def test_strict_load_names_the_missing_keys_and_loads_nothing() -> None:
    model = Net()
    before = copy.deepcopy(model.state_dict())
    state = {k: torch.zeros_like(v) for k, v in before.items() if k != "scale"}
    with pytest.raises(RuntimeError, match=r"missing keys in the model state dict: \['scale'\]"):
        ri.set_model_state_dict(model, state)
    assert torch.equal(model.fc1.weight, before["fc1.weight"])
    keys = ri.set_model_state_dict(model, state, options=ri.StateDictOptions(strict=False))
    assert keys == ri.IncompatibleKeys(["scale"], [])
    assert torch.equal(model.fc1.weight, torch.zeros(4, 3))


def test_the_callers_state_dict_is_not_changed_by_a_load() -> None:
    model = Net()
    state = ri.get_model_state_dict(model)
    given = dict(state)
    ri.set_model_state_dict(model, given, options=ri.StateDictOptions(full_state_dict=True))
    assert list(given) == list(state)
    assert all(given[k] is state[k] for k in state)


def test_empty_state_dicts_are_refused_where_the_options_need_them() -> None:
    model = Net()
    with pytest.raises(RuntimeError, match="model state dict is empty"):
        ri.set_model_state_dict(model, {})
    with pytest.raises(RuntimeError, match="optimizer state dict is empty"):
        ri.set_optimizer_state_dict(model, torch.optim.SGD(model.parameters(), lr=0.1), {})
    with pytest.raises(RuntimeError, match="no optimizer given"):
        ri.get_optimizer_state_dict(model, [])


def test_options_are_validated_on_construction() -> None:
    with pytest.raises(ValueError, match="broadcast_from_rank0 needs full_state_dict"):
        ri.StateDictOptions(broadcast_from_rank0=True)


def test_a_key_that_names_nothing_in_the_model_is_reported_by_name() -> None:
    model = Net()
    keys = ri.set_model_state_dict(
        model,
        {**ri.get_model_state_dict(model), "fc3.weight": torch.zeros(1)},
        options=ri.StateDictOptions(strict=False),
    )
    assert keys.unexpected_keys == ["fc3.weight"]


def test_modifier_hooks_hide_their_level_from_fqns() -> None:
    from reference_impl._fqn import ModelNames

    names = ModelNames(nn.Sequential(Hider()))
    assert [e.fqn for e in names.entries] == ["0.weight", "0.bias"]


def test_submodules_select_their_state_with_the_prefix_kept_or_cut() -> None:
    model = checkpoint_wrapper(Net())
    fc2 = model.get_submodule("_checkpoint_wrapped_module.fc2")
    kept = ri.get_model_state_dict(model, submodules={fc2})
    assert sorted(kept) == ["fc2.bias", "fc2.weight"]
    assert kept["fc2.weight"].data_ptr() == fc2.weight.data_ptr()  # the model's own values
    cut = ri.StateDictOptions(keep_submodule_prefixes=False)
    assert sorted(ri.get_model_state_dict(model, submodules={fc2}, options=cut)) == [
        "bias",
        "weight",
    ]
    with pytest.raises(KeyError, match="Linear is not a module of the model"):
        ri.get_model_state_dict(model, submodules={nn.Linear(1, 1)})
