"""Golden sets: the committed ones agree with their records and cover the recorded releases;
a set the build writes itself loads back into it through the gate's checks, on this CPU and
on another (``ATEN_CPU_CAPABILITY=default`` stands in for one); a tampered tensor is named by
the record and by the load, one ulp off in a loaded value on any machine, in a computed step
on the writer's; a missing release or set is named."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from ci.gate.golden import INDEX, index_text
from ci.gate.target import SUITE_ROOT
from conformance import UPSTREAM_MANIFEST
from conformance._golden import (
    GOLDEN_DIR,
    RECORD,
    SETS_VARIABLE,
    TRAJECTORY,
    GoldenError,
    golden_set,
    leaf_records,
    recorded_releases,
    value_differences,
)
from conformance._upstream import fully_shard_missing
from conformance.cells import PARALLELISMS, with_role
from conformance.compare import tolerance
from conformance.divergences import load, release_of
from harness.machine import rank_threads, this_machine
from tests._inner import Case, read_junit

pytestmark = pytest.mark.slow

THIS_RELEASE = str(release_of(torch.__version__))
COMMITTED = recorded_releases(GOLDEN_DIR)
READER = "conformance/checks/test_golden_checkpoints.py"


def test_every_recorded_release_has_a_committed_set():
    recorded = {str(release) for release in load(UPSTREAM_MANIFEST).recorded}
    assert recorded <= set(COMMITTED), f"no golden set of {sorted(recorded - set(COMMITTED))}"


@pytest.mark.parametrize("release", COMMITTED)
def test_a_committed_set_agrees_with_its_record(release):
    assert golden_set(release, GOLDEN_DIR).disagreements() == []


def test_the_index_of_the_committed_sets_is_fresh():
    assert (GOLDEN_DIR / INDEX).read_text() == index_text(GOLDEN_DIR), (
        "conformance/golden/README.md is stale: python -m ci.gate.golden --out "
        "conformance/golden --index"
    )


def test_a_missing_release_is_named_with_the_sets_there_are(tmp_path):
    (tmp_path / "2.13.0").mkdir()
    (tmp_path / "2.13.0" / "record.json").write_text("{}")
    with pytest.raises(
        GoldenError, match=r"no golden set of torch 9\.9\.9 under .* \(sets: 2\.13\.0\)"
    ):
        golden_set("9.9.9", tmp_path)
    with pytest.raises(GoldenError, match=r"2\.13\.0/record\.json: not a golden record"):
        golden_set("2.13.0", tmp_path)


def test_leaf_records_hold_values_not_containers():
    """A tuple and a list of the same values are the same leaves (a load may turn one into the
    other); a tensor's dtype and every bit count."""
    as_tuple = leaf_records({"betas": (0.9, 0.999), "w": torch.zeros(2)})
    as_list = leaf_records({"betas": [0.9, 0.999], "w": torch.zeros(2)})
    assert as_tuple == as_list
    assert set(as_tuple) == {"betas[0]", "betas[1]", "w"}
    negative_zero = leaf_records({"w": torch.tensor([0.0, -0.0])})
    assert negative_zero["w"]["sha256"] != as_tuple["w"]["sha256"]
    as_double = leaf_records({"w": torch.zeros(2, dtype=torch.float64)})
    assert value_differences(as_double, as_tuple, whole=False) == [
        "w: loaded torch.float64 [2] starting [0.0, 0.0], recorded torch.float32 [2] starting "
        "[0.0, 0.0]"
    ]


def test_a_hyper_parameter_a_later_release_adds_is_no_difference():
    recorded = leaf_records({"lr": 0.1, "w": torch.ones(1)})
    loaded = leaf_records({"lr": 0.1, "w": torch.ones(1), "foreach": None, "extra": torch.ones(1)})
    assert value_differences(loaded, recorded, whole=True) == [
        "extra: loaded torch.float32 [1] starting [1.0], not in the record"
    ]
    assert value_differences({"w": loaded["w"]}, recorded, whole=True) == [
        "lr: absent after the load, recorded 0.1"
    ]


def test_a_value_the_readers_release_never_keeps_is_no_difference():
    """A later release's scheduler records ``_is_initial``; an earlier one loads without it."""
    recorded = leaf_records({"scheduler": {"_is_initial": False, "last_epoch": 2}})
    loaded = leaf_records({"scheduler": {"last_epoch": 2}})
    assert value_differences(loaded, recorded, whole=True, known={"last_epoch"}) == []
    assert value_differences(loaded, recorded, whole=True, known={"last_epoch", "_is_initial"}) == [
        "scheduler._is_initial: absent after the load, recorded False"
    ]


# The golden cells at one rank; those built with fully_shard where this release runs it on CPUs.
_ONE_RANK = [PARALLELISMS[name] for name in with_role("golden") if PARALLELISMS[name].supports(1)]
_FSDP2_FAMILIES = tuple(cell.name for cell in _ONE_RANK if cell.fsdp2)
_ONE_RANK_FAMILIES = tuple(cell.name for cell in _ONE_RANK if not cell.fsdp2) + (
    _FSDP2_FAMILIES if fully_shard_missing(torch.device("cpu")) is None else ()
)


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sets directory holding the set this build writes at one rank."""
    root = tmp_path_factory.mktemp("sets")
    command = [sys.executable, "-m", "ci.gate.golden", "--out", str(root), "--world-sizes", "1"]
    completed = subprocess.run(command, cwd=SUITE_ROOT, capture_output=True, text=True)
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    return root


def test_the_writer_records_every_checkpoint_file_and_value(written):
    golden = golden_set(THIS_RELEASE, written)
    assert golden.disagreements() == []
    assert golden.torch_version == torch.__version__
    assert golden.torch_git == torch.version.git_version
    assert golden.device == "cpu"  # the writer's default worlds: its trajectory holds there
    written_paths = {checkpoint.path for checkpoint in golden.checkpoints}
    modes = ("sync", "async")
    expected = {f"dcp/{cell}-w1-{mode}" for cell in _ONE_RANK_FAMILIES for mode in modes}
    assert written_paths == expected | {"single/mlp", "single/moe"}
    weight = golden.single("mlp").values["model.fc1.weight"]
    assert (weight["dtype"], weight["shape"]) == ("torch.float32", [10, 7])
    trajectory = golden.trajectory("mlp")
    assert len(trajectory) == golden.steps + 2
    assert leaf_records(trajectory[golden.steps - 1]) == golden.single("mlp").values
    # Written by a rank of the harness: its threads, this machine.
    assert golden.machine == this_machine(threads=rank_threads())
    assert (written / INDEX).read_text() == index_text(written)


def _gate_loads(
    root: Path, workdir: Path, *args: str, env: dict[str, str] | None = None
) -> tuple[int, str, dict[str, Case]]:
    """The gate's golden checks at one rank on the sets under ``root`` (``env`` added to the
    session's environment)."""
    junit = workdir / "junit.xml"
    command = [sys.executable, "-m", "pytest", READER, "-p", "harness.plugin", "-q"]
    command += ["-p", "no:cacheprovider", "--world-sizes", "1", f"--junitxml={junit}", *args]
    env = dict(os.environ, **{SETS_VARIABLE: str(root)}, **(env or {}))
    env.pop("PYTEST_ADDOPTS", None)
    completed = subprocess.run(
        command, cwd=SUITE_ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    cases = read_junit(junit) if junit.is_file() else {}
    return completed.returncode, completed.stdout + completed.stderr, cases


def test_the_gate_loads_a_set_its_own_build_wrote(written, tmp_path):
    status, output, cases = _gate_loads(written, tmp_path)
    assert status == 0, output[-4000:]
    outcomes = {name: case.outcome for name, case in cases.items()}
    expected = {
        f"test_golden_dcp_checkpoints_load_as_recorded[w1-{THIS_RELEASE}-{reader}]": "passed"
        for reader in ("single", *_ONE_RANK_FAMILIES)
    }
    expected |= {
        f"test_golden_dcp_checkpoints_load_as_recorded[w1-{THIS_RELEASE}-{reader}]": "skipped"
        for reader in _FSDP2_FAMILIES
        if reader not in _ONE_RANK_FAMILIES
    }
    expected |= {
        f"{test}[w1-{THIS_RELEASE}-{model}]": "passed"
        for model in ("mlp", "moe")
        for test in (
            "test_golden_single_process_state_loads_as_recorded",
            "test_golden_single_process_steps_continue_as_recorded",
        )
    }
    # FSDP1 writes at 2 and 4 ranks only: a set written at one rank has no FULL state dict.
    expected[f"test_golden_fsdp1_state_dicts_load_as_recorded[w1-{THIS_RELEASE}-full]"] = "skipped"
    assert outcomes == expected


def _tamper_torch_save(path: Path) -> None:
    state = torch.load(path, weights_only=True)
    state["fc1.weight"][0, 0] += 1.0
    torch.save(state, path)


def _tamper_dcp(path: Path, scratch: Path) -> None:
    """One value of ``model.fc1.weight`` changed in a DCP checkpoint, rewritten as DCP."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save, torch_save_to_dcp

    dcp_to_torch_save(path, scratch)
    state = torch.load(scratch, weights_only=False)
    state["model"]["fc1.weight"][0, 0] += 1.0
    torch.save(state, scratch)
    shutil.rmtree(path)
    torch_save_to_dcp(scratch, path)


def test_a_tampered_tensor_is_named_by_the_record_and_by_the_load(written, tmp_path):
    tampered = tmp_path / "sets"
    shutil.copytree(written, tampered)
    release_dir = tampered / THIS_RELEASE
    _tamper_torch_save(release_dir / "single/mlp/model.pt")
    _tamper_dcp(release_dir / "dcp/ddp-w1-sync", tmp_path / "ddp.pt")
    disagreements = golden_set(THIS_RELEASE, tampered).disagreements()
    assert f"{THIS_RELEASE}/single/mlp/model.pt: its bytes differ from the record" in disagreements
    assert any("dcp/ddp-w1-sync/" in found for found in disagreements), disagreements

    status, output, cases = _gate_loads(tampered, tmp_path, "-k", "single or ddp")
    assert status == 1, output[-4000:]
    single = cases[f"test_golden_single_process_state_loads_as_recorded[w1-{THIS_RELEASE}-mlp]"]
    assert single.outcome == "failed"
    assert f"single/mlp of the set torch {torch.__version__} wrote: model.fc1.weight: " in (
        single.message
    )
    ddp = cases[f"test_golden_dcp_checkpoints_load_as_recorded[w1-{THIS_RELEASE}-ddp]"]
    assert ddp.outcome == "failed"
    assert "dcp/ddp-w1-sync of the set" in ddp.message
    assert "model.fc1.weight: loaded torch.float32 [10, 7] starting" in ddp.message
    untouched = cases[f"test_golden_single_process_state_loads_as_recorded[w1-{THIS_RELEASE}-moe]"]
    assert untouched.outcome == "passed"


ANOTHER_CPU = {"ATEN_CPU_CAPABILITY": "default"}  # other kernels, as another runner's CPU
SINGLE_TESTS = "single_process and mlp"
needs_other_kernels = pytest.mark.skipif(
    this_machine().capability == "DEFAULT",
    reason="this CPU runs ATen's default kernels already: nothing stands in for another CPU",
)


def _copy_with(written: Path, tmp_path: Path, change: Callable[[Path], None]) -> Path:
    """A copy of the sets under ``written`` whose set of this release ``change`` altered."""
    copied = tmp_path / "sets"
    shutil.copytree(written, copied)
    change(copied / THIS_RELEASE)
    return copied


def _one_ulp_up(tensor: torch.Tensor) -> None:
    tensor.view(-1)[0] = torch.nextafter(tensor.view(-1)[0], torch.tensor(float("inf")))


def _change_trajectory(set_dir: Path, change: Callable[[torch.Tensor], None]) -> None:
    """``change`` one computed weight of the mlp's first step after the checkpoint, the
    record's hash of the file made to match (a set written so, not a file rotted)."""
    path = set_dir / "single/mlp" / TRAJECTORY
    trajectory = torch.load(path, weights_only=True)
    change(trajectory[golden_set(THIS_RELEASE, set_dir.parent).steps]["model.fc1.weight"])
    torch.save(trajectory, path)
    record = json.loads((set_dir / RECORD).read_text())
    for checkpoint in record["checkpoints"]:
        if checkpoint["path"] == "single/mlp":
            checkpoint["files"][TRAJECTORY] = hashlib.sha256(path.read_bytes()).hexdigest()
    (set_dir / RECORD).write_text(json.dumps(record))


def _outcomes(cases: dict[str, Case], model: str = "mlp") -> dict[str, str]:
    return {
        name.split("[")[0]: case.outcome for name, case in cases.items() if f"-{model}]" in name
    }


@needs_other_kernels
def test_steps_on_another_cpu_are_held_within_the_tolerance(written, tmp_path):
    """Under other kernels one ulp of a computed step is no difference, and values loaded
    stay bit for bit; on the writer's machine the same ulp fails."""
    one_ulp = _copy_with(written, tmp_path, lambda d: _change_trajectory(d, _one_ulp_up))
    status, output, cases = _gate_loads(one_ulp, tmp_path, "-k", SINGLE_TESTS, env=ANOTHER_CPU)
    assert status == 0, output[-4000:]
    status, output, cases = _gate_loads(one_ulp, tmp_path, "-k", SINGLE_TESTS)
    assert status == 1, output[-4000:]
    assert _outcomes(cases)["test_golden_single_process_steps_continue_as_recorded"] == "failed"
    message = cases[f"test_golden_single_process_steps_continue_as_recorded[w1-{THIS_RELEASE}-mlp]"]
    assert "after step 3 (bit for bit: written on this machine's signature" in message.message


@needs_other_kernels
def test_a_step_beyond_the_tolerance_fails_on_another_cpu(written, tmp_path):
    steps = 1

    def beyond(weight: torch.Tensor) -> None:
        weight.view(-1)[0] += 2 * tolerance(weight.dtype, steps) * weight.abs().max()

    moved = _copy_with(written, tmp_path, lambda d: _change_trajectory(d, beyond))
    status, output, cases = _gate_loads(moved, tmp_path, "-k", SINGLE_TESTS, env=ANOTHER_CPU)
    assert status == 1, output[-4000:]
    assert _outcomes(cases) == {
        "test_golden_single_process_state_loads_as_recorded": "passed",
        "test_golden_single_process_steps_continue_as_recorded": "failed",
    }
    message = cases[f"test_golden_single_process_steps_continue_as_recorded[w1-{THIS_RELEASE}-mlp]"]
    assert "after step 3 (within a tolerance: written on " in message.message
    assert f"capability: {this_machine().capability!r} vs 'DEFAULT'" in message.message
    assert "model.fc1.weight: computed torch.float32 [10, 7]" in message.message


def test_a_loaded_value_one_ulp_off_fails_on_another_cpu(written, tmp_path):
    def spoil(set_dir: Path) -> None:
        path = set_dir / "single/mlp/model.pt"
        state = torch.load(path, weights_only=True)
        _one_ulp_up(state["fc2.bias"])
        torch.save(state, path)

    spoiled = _copy_with(written, tmp_path, spoil)
    status, output, cases = _gate_loads(spoiled, tmp_path, "-k", SINGLE_TESTS, env=ANOTHER_CPU)
    assert status == 1, output[-4000:]
    loaded = cases[f"test_golden_single_process_state_loads_as_recorded[w1-{THIS_RELEASE}-mlp]"]
    assert loaded.outcome == "failed"
    assert "model.fc2.bias: loaded torch.float32 [5]" in loaded.message


def test_a_set_that_keeps_no_trajectory_still_loads_and_its_steps_skip(written, tmp_path):
    """A set written before sets kept trajectories (no machine in its record) is no broken
    set: its values load as before, and only the check of its steps skips, naming why."""

    def forget_the_machine(set_dir: Path) -> None:
        record = json.loads((set_dir / RECORD).read_text())
        del record["machine"]
        (set_dir / RECORD).write_text(json.dumps(record))

    older = _copy_with(written, tmp_path, forget_the_machine)
    status, output, cases = _gate_loads(older, tmp_path, "-k", SINGLE_TESTS)
    assert status == 0, output[-4000:]
    assert _outcomes(cases) == {
        "test_golden_single_process_state_loads_as_recorded": "passed",
        "test_golden_single_process_steps_continue_as_recorded": "skipped",
    }
    steps = cases[f"test_golden_single_process_steps_continue_as_recorded[w1-{THIS_RELEASE}-mlp]"]
    assert "keeps no trajectory: write it again with python -m ci.gate.golden" in steps.message


def test_the_gate_refuses_a_directory_without_sets(tmp_path):
    status, output, _ = _gate_loads(tmp_path / "none", tmp_path)
    assert status != 0
    assert f"{SETS_VARIABLE}={tmp_path / 'none'} holds no golden set" in output
