"""The oracle's re-keying between parameter IDs and FQNs, on a model without FSDP1."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.fsdp import OptimStateKeyType

import reference_impl as ri
from conformance.models.common import seeded_mlp, train

NAME, ID = OptimStateKeyType.PARAM_NAME, OptimStateKeyType.PARAM_ID


def _two_groups() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """fc2's parameters first: IDs follow the optimizer's order, not the model's."""
    model = seeded_mlp()
    optimizer = torch.optim.Adam(
        [{"params": model.fc2.parameters()}, {"params": model.fc1.parameters(), "lr": 0.5}]
    )
    train(model, optimizer, 1)
    return model, optimizer


def test_ids_become_fqns_in_the_optimizers_order_and_back():
    model, optimizer = _two_groups()
    saved = optimizer.state_dict()
    named = ri.fsdp_rekey_optim_state_dict(saved, NAME, model, optimizer)
    assert list(named["state"]) == ["fc2.weight", "fc2.bias", "fc1.weight", "fc1.bias"]
    assert named["state"]["fc1.bias"] is saved["state"][3]
    assert [g["params"] for g in named["param_groups"]] == [
        ["fc2.bias", "fc2.weight"],
        ["fc1.bias", "fc1.weight"],
    ]
    assert named["param_groups"][1]["lr"] == 0.5
    back = ri.fsdp_rekey_optim_state_dict(named, ID, model, optimizer)
    assert back["state"] == saved["state"]
    assert back["param_groups"] == saved["param_groups"]


def test_without_an_optimizer_ids_follow_the_models_parameters():
    model, optimizer = _two_groups()
    named = ri.fsdp_rekey_optim_state_dict(optimizer.state_dict(), NAME, model, optimizer)
    by_model = ri.fsdp_rekey_optim_state_dict(named, ID, model)
    assert sorted(by_model["state"]) == [0, 1, 2, 3]
    assert by_model["state"][0] is named["state"]["fc1.weight"]


def test_a_dict_already_keyed_as_asked_comes_back_as_it_is():
    model, optimizer = _two_groups()
    saved = optimizer.state_dict()
    assert ri.fsdp_rekey_optim_state_dict(saved, ID, model, optimizer) is saved


def test_mixed_keys_are_refused():
    model, optimizer = _two_groups()
    saved = optimizer.state_dict()
    saved["state"]["fc1.weight"] = saved["state"].pop(2)
    with pytest.raises(ValueError, match=r"all IDs or all names.*'fc1\.weight'"):
        ri.fsdp_rekey_optim_state_dict(saved, NAME, model, optimizer)


def test_a_name_of_no_parameter_is_named_in_the_error():
    model, optimizer = _two_groups()
    named = ri.fsdp_rekey_optim_state_dict(optimizer.state_dict(), NAME, model, optimizer)
    named["state"]["fc3.weight"] = named["state"].pop("fc2.weight")
    with pytest.raises(ValueError, match=r"'fc3\.weight' names no parameter"):
        ri.fsdp_rekey_optim_state_dict(named, ID, model, optimizer)
