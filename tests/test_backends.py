"""Worlds on any backend and device type the torch build has: ``auto`` resolution, names it
lacks refused with what it has, and a backend registered out of tree (as a vendor's
extension does) running worlds, meshes and DTensors."""

from __future__ import annotations

import os

import pytest

from harness import devices
from harness._preload import PRELOAD
from tests._inner import INNER_DIR, run_inner, start_session

pytestmark = pytest.mark.slow

no_accelerator = pytest.mark.skipif(
    devices.accelerator() is not None, reason="this machine has an accelerator"
)


@no_accelerator
def test_auto_is_cpu_and_gloo_without_an_accelerator() -> None:
    assert devices.resolve("auto", "auto") == ("gloo", "cpu")
    assert devices.resolve("gloo", "auto") == ("gloo", "cpu")


def test_a_backend_brings_the_device_type_it_declared() -> None:
    assert devices.resolve("nccl", "auto") == ("nccl", "cuda")
    assert devices.resolve("auto", "cuda") == ("nccl", "cuda")


@pytest.mark.parametrize(
    ("backend", "device_type", "error"),
    [
        ("no_such_ccl", "cpu", r"unknown backend 'no_such_ccl'; this torch build has: .*gloo"),
        ("gloo", "tpu", "unknown device type 'tpu'; this build has cpu"),
        ("nccl", "cpu", "backend 'nccl' cannot run on device type 'cpu'; it supports cuda"),
    ],
)
def test_names_the_build_lacks_are_refused(backend: str, device_type: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        devices.resolve(backend, device_type)


def test_an_unknown_backend_is_a_usage_error_before_any_test(tmp_path) -> None:
    completed = start_session(tmp_path, "--world-backend", "no_such_ccl")
    assert completed.returncode == pytest.ExitCode.USAGE_ERROR, completed.stdout
    assert (
        "--world-backend/--world-device: unknown backend 'no_such_ccl'; this torch build has:"
        in (completed.stderr)
    )


def test_worlds_run_on_a_backend_registered_out_of_tree(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(PRELOAD, "gloo_relay_backend")
    run = run_inner(
        "inner_backend.py", tmp_path / "run", "--world-backend", "gloo_relay", pythonpath=INNER_DIR
    )
    assert run.outcome("test_the_world_runs_on_the_registered_backend[w2]") == "passed", run.output
    assert run.outcome("test_meshes_and_dtensors_use_it_too[w4]") == "passed", run.output


def test_without_its_preload_the_registered_name_is_unknown(tmp_path) -> None:
    env = {key: value for key, value in os.environ.items() if key != PRELOAD}
    completed = start_session(tmp_path, "--world-backend", "gloo_relay", env=env)
    assert completed.returncode == pytest.ExitCode.USAGE_ERROR
    assert "unknown backend 'gloo_relay'" in completed.stderr
