"""The capability probe: what the gate will exercise on this torch and machine."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from ci.gate import probe
from ci.gate.target import SUITE_ROOT
from conformance import _upstream


def test_the_probe_lists_every_exercised_api_with_its_signature() -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "ci.gate.probe", "--json"],
        cwd=SUITE_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    caps = json.loads(completed.stdout)
    assert caps["torch"] == torch.__version__
    assert caps["backends"]["gloo"] is True
    assert caps["runnable_world_sizes"]["gloo"] == [1, 2, 4, 8]
    assert len(caps["runnable_world_sizes"]["nccl"]) <= torch.cuda.device_count()
    by_name = {row["api"]: row["signature"] for row in caps["apis"]}
    assert list(by_name) == [f"{m}.{n}" for m, n in _upstream.EXERCISED_APIS]
    gather = "torch.distributed._state_dict_utils._gather_state_dict"
    assert by_name[gather].startswith("(state_dict, *, pg=None")


def test_a_missing_api_is_named_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    exercised = (("torch.distributed.checkpoint.state_dict", "no_such_function"),)
    monkeypatch.setattr(probe, "EXERCISED_APIS", exercised)
    caps = {**probe.capabilities(), "apis": probe.apis()}
    assert caps["apis"] == [
        {"api": "torch.distributed.checkpoint.state_dict.no_such_function", "signature": None}
    ]
    text = probe.render(caps)
    assert "state_dict.no_such_function: MISSING (its tests skip)" in text
    assert "0 of 1 APIs present" in text


def test_the_suite_looks_up_only_apis_the_probe_lists() -> None:
    with pytest.raises(ValueError, match="_verify_options is not declared"):
        _upstream.dsd.get("_verify_options")
