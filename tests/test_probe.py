"""The capability probe: what the gate will exercise on this torch and machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest
import torch

from ci.gate import probe
from ci.gate.target import SUITE_ROOT
from conformance import _upstream
from tests._inner import INNER_DIR

pytestmark = pytest.mark.slow


def _probe(**env: str) -> dict[str, Any]:
    completed = subprocess.run(
        [sys.executable, "-m", "ci.gate.probe", "--json"],
        cwd=SUITE_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        env={**os.environ, **env},
    )
    caps: dict[str, Any] = json.loads(completed.stdout)
    return caps


@pytest.fixture(scope="module")
def plain_probe() -> dict[str, Any]:
    """What the probe reports in this session's environment (each run costs seconds)."""
    return _probe()


def test_the_probe_lists_every_exercised_api_with_its_signature(
    plain_probe: dict[str, Any],
) -> None:
    caps = plain_probe
    assert caps["torch"] == torch.__version__
    assert caps["backends"]["gloo"] is True
    assert caps["runnable_world_sizes"]["gloo"] == [1, 2, 4, 8]
    assert len(caps["runnable_world_sizes"]["nccl"]) <= torch.cuda.device_count()
    by_name = {row["api"]: row["signature"] for row in caps["apis"]}
    assert list(by_name) == [f"{m}.{n}" for m, n in _upstream.EXERCISED_APIS]
    gather = "torch.distributed._state_dict_utils._gather_state_dict"
    assert by_name[gather].startswith("(state_dict, *, pg=None")


@pytest.mark.skipif(torch.accelerator.is_available(), reason="checks a CPU-only machine's probe")
def test_a_cpu_machine_has_no_accelerator_and_no_devices(plain_probe: dict[str, Any]) -> None:
    caps = plain_probe
    assert (caps["accelerator"], caps["devices"]) == (None, [])
    assert "accelerator: none; devices: none;" in probe.render(caps)


def test_a_backend_registered_by_a_preload_is_probed(plain_probe: dict[str, Any]) -> None:
    caps = _probe(HARNESS_PRELOAD="gloo_relay_backend", PYTHONPATH=str(INNER_DIR))
    assert caps["backends"]["gloo_relay"] is True
    assert caps["runnable_world_sizes"]["gloo_relay"] == [1, 2, 4, 8]
    assert "gloo_relay" not in plain_probe["backends"]


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
