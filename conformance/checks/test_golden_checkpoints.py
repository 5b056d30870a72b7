"""Checkpoints written by other releases load into this build: every golden set, every value.

A golden set lies in ``conformance/golden/<release>/``, written by ``python -m ci.gate.golden``
under that release; ``GATE_GOLDEN_SETS`` names another directory of sets. A set holds
checkpoints of the matrix's model, AdamW and a StepLR scheduler after two steps. It also holds
the record of every value each checkpoint holds. Loaded into fresh objects of this build:

- each DCP checkpoint saved by every parallelism family at 1, 2 and 4 ranks, loaded by every
  family at every world size it has: at the writer's own size and resharded to the others;
- each asynchronously saved one, by its writer at its size and by one process;
- FSDP1's FULL state dicts, at every size and into one process;
- FSDP1's SHARDED and LOCAL state dicts (model and optimizer, LOCAL the model alone), at the
  size that wrote them;
- one process's ``torch.save`` of its model, optimizer and scheduler state.

Every loaded value equals the record bit for bit (the part a rank holds, where ranks hold
parts). Two more steps then equal one process's two steps from the set's ``torch.save`` state,
in this build, wherever the checkpoint holds that state. Where a writer or reader is
tensor-parallel, that holds within the tensor-parallel tolerances. A writer whose release
trained a cell apart from one process (a known divergence of its own) is judged by values
alone.

Loaded by the release that wrote it, one process's steps equal the recorded trajectory too.
Across releases an optimizer's arithmetic may change, which is no incompatibility of the
checkpoint. The trajectory must match bit for bit where this build and machine signature are
the writer's. On any other machine it must match within a tolerance of the dtype and the steps
(``conformance.compare._computed``). A failure names the release that wrote the checkpoint, its path
in the set, the key and both values. A trajectory's failure names both machines.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch

from conformance._golden import (
    GoldenCheckpoint,
    GoldenSet,
    full_state,
    full_state_leaves,
    golden_set,
    read_dcp,
    releases_to_load,
    state_leaves,
    value_differences,
)
from conformance._upstream import dsd, fsdp, full_options, quiet_deprecations
from conformance.cells import PARALLELISMS, SINGLE, comparison_tolerance, with_role
from conformance.compare import computed_differences, holds_a_part
from conformance.divergences import release_of
from conformance.models.common import GroundTruth, computed_on, train
from conformance.models.optimizers import OPTIMIZERS
from conformance.models.zoo import MODELS
from conformance.training import (
    MORE_STEPS,
    Training,
    assert_state_is,
    fsdp1_api,
    load_checkpoint,
    optim_settings,
    torch_model_load,
    training_in,
)
from harness.machine import this_machine

RELEASES = releases_to_load()
DCP_READERS = (SINGLE, *with_role("golden"))
FSDP1_KINDS = ("full", "sharded", "local")
SINGLE_MODELS = ("mlp", "moe")


def _reads_at(size: int, **params: Any) -> bool:
    """``applies`` for the world marker: one process reads alone, a cell at its sizes."""
    reader = params["reader"]
    return size == 1 if reader == "single" else PARALLELISMS[reader].supports(size)


def _holds_whole_model(reader: str, size: int) -> bool:
    return reader == "single" or not (PARALLELISMS[reader].partial and size > 1)


def _where(golden: GoldenSet, checkpoint: GoldenCheckpoint) -> str:
    return f"{checkpoint.path} of the set torch {golden.torch_version} wrote"


def _values_differ(
    golden: GoldenSet, checkpoint: GoldenCheckpoint, training: Training, keys: str = ""
) -> list[str]:
    """How the state ``training`` holds after loading ``checkpoint`` differs from its record
    (only key paths starting with ``keys``, where given)."""
    model, optimizer, scheduler = training
    loaded = full_state_leaves(model, optimizer, scheduler, flatten=checkpoint.flattened)
    loaded = {key: leaf for key, leaf in loaded.items() if key.startswith(keys)}
    recorded = {key: leaf for key, leaf in checkpoint.values.items() if key.startswith(keys)}
    known = _names_this_release_has(golden.recipe)
    found = value_differences(loaded, recorded, whole=not holds_a_part(model), known=known)
    return [f"{_where(golden, checkpoint)}: {difference}" for difference in found]


@functools.cache
def _names_this_release_has(recipe: str) -> set[str]:
    """The names of the non-tensor state ``recipe``'s optimizer and scheduler have in this
    build, fresh: a recorded value of another name is one this release does not keep."""
    model = MODELS["mlp"].build()
    optimizer, scheduler = OPTIMIZERS[recipe].build(model)
    names = {name for group in optimizer.param_groups for name in group}
    return names | set(scheduler.state_dict() if scheduler is not None else {})


def _single_state(golden: GoldenSet, model_id: str, device: torch.device) -> Training:
    """One process's objects loaded from the set's ``torch.save`` state of ``model_id``, as
    users load it (``weights_only``)."""
    model = MODELS[model_id].build().to(device)
    optimizer, scheduler = OPTIMIZERS[golden.recipe].build(model)
    directory = golden.directory / golden.single(model_id).path

    def read(name: str) -> Any:
        return torch.load(directory / name, map_location=device, weights_only=True)

    model.load_state_dict(read("model.pt"))
    optimizer.load_state_dict(read("optim.pt"))
    if scheduler is not None:
        scheduler.load_state_dict(read("scheduler.pt"))
    return model, optimizer, scheduler


def _continue(training: Training, golden: GoldenSet, model_id: str) -> None:
    model, optimizer, scheduler = training
    inputs = MODELS[model_id].inputs
    train(model, optimizer, MORE_STEPS, scheduler, start=golden.steps, inputs=inputs)


_CONTINUATIONS: dict[tuple[str, str, str], GroundTruth] = {}


def _continuation(golden: GoldenSet, model_id: str, device: torch.device) -> GroundTruth:
    """One process's state ``MORE_STEPS`` after the set's ``torch.save`` state, in this
    build: what every load of the set must continue to. Computed once per rank process."""
    key = (str(golden.directory), model_id, str(device))
    if key not in _CONTINUATIONS:
        training = _single_state(golden, model_id, device)
        _continue(training, golden, model_id)
        _CONTINUATIONS[key] = GroundTruth.of(training[0], training[1])
    return _CONTINUATIONS[key]


def _continues_as_one_process(
    golden: GoldenSet, checkpoint: GoldenCheckpoint, training: Training, reader: str
) -> list[str]:
    """Train ``MORE_STEPS`` after the load; how the full state differs from one process's."""
    model, optimizer, _ = training
    _continue(training, golden, checkpoint.model)
    flat = {"flatten_optimizer_state_dict": True} if checkpoint.flattened else {}
    model_state, optim_state = dsd.get_state_dict(model, optimizer, options=full_options(**flat))
    cells = [PARALLELISMS[name] for name in (checkpoint.cell, reader) if name in PARALLELISMS]
    expected = _continuation(golden, checkpoint.model, computed_on(model))
    try:
        assert_state_is(
            model_state,
            optim_state,
            expected,
            full_load=True,
            held_by=model,
            **comparison_tolerance(*cells),
        )
    except AssertionError as error:
        return [f"{_where(golden, checkpoint)}, {MORE_STEPS} steps after the load: {error}"]
    return []


_ONE_PROCESS_STATE: dict[tuple[str, str], bool] = {}


def _starts_as_one_process(golden: GoldenSet, checkpoint: GoldenCheckpoint) -> bool:
    """``_holds_one_process_state``, once per checkpoint and rank process."""
    key = (str(golden.directory), checkpoint.path)
    if key not in _ONE_PROCESS_STATE:
        _ONE_PROCESS_STATE[key] = _holds_one_process_state(golden, checkpoint)
    return _ONE_PROCESS_STATE[key]


def _holds_one_process_state(golden: GoldenSet, checkpoint: GoldenCheckpoint) -> bool:
    """Whether ``checkpoint`` holds one process's model after the set's steps, as the set's
    ``torch.save`` state does: bit for bit, or within the tensor-parallel tolerances for a
    writer that is not exact (a DCP checkpoint read back whole in this process). Where the
    writer trained apart from one process (a bug of its release, in its manifest), its load is
    judged by values alone: no continuation from one process's state could match."""
    single = golden.single(checkpoint.model)
    cell = PARALLELISMS.get(checkpoint.cell)
    tolerance = comparison_tolerance(cell) if cell is not None else {}
    if not tolerance:
        return all(
            leaf == single.values[key]
            for key, leaf in checkpoint.values.items()
            if key.startswith("model.") and isinstance(leaf, dict) and key in single.values
        )
    saved = read_dcp(golden.directory / checkpoint.path)["model"]
    expected = torch.load(golden.directory / single.path / "model.pt", weights_only=True)
    return all(
        torch.allclose(saved[key].cpu(), value.cpu(), **tolerance)
        for key, value in expected.items()
        if key in saved
    )


def _dcp_checkpoints_for(golden: GoldenSet, reader: str, size: int) -> list[GoldenCheckpoint]:
    """The set's DCP checkpoints ``reader`` loads at ``size`` ranks: those of the model it
    trains (one process trains any) in a form it reads (a cell whose ranks hold parts reads
    flattened optimizer state alone; see ``conformance._dcp.training_state``); an asynchronously
    saved one only by its writer at its size and by one process (its files are a saved one's,
    saved by another path)."""
    cell = PARALLELISMS.get(reader)
    return [
        checkpoint
        for checkpoint in golden.of_kind("dcp")
        if (cell is None or checkpoint.model == cell.model_id)
        and (cell is None or checkpoint.flattened or _holds_whole_model(reader, size))
        and (
            checkpoint.form == "sync"
            or cell is None
            or (checkpoint.cell, checkpoint.size) == (reader, size)
        )
    ]


@pytest.mark.world(1, 2, 4, applies=_reads_at)
@pytest.mark.parametrize("reader", DCP_READERS)
@pytest.mark.parametrize("release", RELEASES)
def test_golden_dcp_checkpoints_load_as_recorded(world, release, reader):
    """Every DCP checkpoint of ``release``'s set that ``reader`` holds, loaded at this size."""
    golden = golden_set(release)
    if reader in PARALLELISMS:
        PARALLELISMS[reader].skip_unless_runnable(world.device)
    checkpoints = _dcp_checkpoints_for(golden, reader, world.size)
    if not checkpoints:
        pytest.skip(
            f"the set of torch {golden.torch_version} holds no DCP checkpoint {reader} reads"
        )
    found: list[str] = []
    for checkpoint in checkpoints:
        training = training_in(reader, world, golden.recipe, checkpoint.model)
        model, optimizer, scheduler = training
        path = str(golden.directory / checkpoint.path)
        load_checkpoint(model, optimizer, path, scheduler=scheduler, flatten=checkpoint.flattened)
        found += _values_differ(golden, checkpoint, training) or _continuation_differs(
            golden, checkpoint, training, reader
        )
    assert not found, "\n".join(found)


def _continuation_differs(
    golden: GoldenSet, checkpoint: GoldenCheckpoint, training: Training, reader: str
) -> list[str]:
    """How training after the load parts from one process's, where the checkpoint holds one
    process's state (``_starts_as_one_process``)."""
    if not _starts_as_one_process(golden, checkpoint):
        return []
    return _continues_as_one_process(golden, checkpoint, training, reader)


def _fsdp1_loaded(golden: GoldenSet, checkpoint: GoldenCheckpoint, world: Any) -> Training:
    """Fresh FSDP1 objects (one process's at one rank) loaded from ``checkpoint``'s files:
    rank 0's whole state for FULL, each rank's own else."""
    rank_file = "rank0.pt" if checkpoint.form == "full" else f"rank{world.rank}.pt"
    state = torch.load(
        golden.directory / checkpoint.path / rank_file,
        map_location=world.device,
        weights_only=False,
    )
    reader = "single" if world.size == 1 else checkpoint.cell
    model, optimizer, scheduler = training = training_in(reader, world, golden.recipe, "mlp")
    if world.size == 1:
        model.load_state_dict(state["model"])
        dsd.set_optimizer_state_dict(model, optimizer, state["optim"], options=full_options())
    else:
        torch_model_load(model, state["model"], checkpoint.form)
        if "optim" in state:
            to_load = fsdp1_api("optim_state_dict_to_load")
            with (
                quiet_deprecations(),
                fsdp.FullyShardedDataParallel.state_dict_type(
                    model, *optim_settings(checkpoint.form)
                ),
            ):
                optimizer.load_state_dict(to_load(model, optimizer, state["optim"]))
    scheduler.load_state_dict(state["scheduler"])
    return training


@pytest.mark.world(1, 2, 4, applies=lambda size, kind, **_: size > 1 or kind == "full")
@pytest.mark.parametrize("kind", FSDP1_KINDS)
@pytest.mark.parametrize("release", RELEASES)
def test_golden_fsdp1_state_dicts_load_as_recorded(world, release, kind):
    """``release``'s FSDP1 state dicts of ``kind`` loaded at this size: FULL from any size,
    SHARDED and LOCAL from this size. LOCAL holds no optimizer state: its model alone is held
    to the record, and no training follows."""
    golden = golden_set(release)
    checkpoints = [
        checkpoint
        for checkpoint in golden.of_kind("fsdp1")
        if checkpoint.form == kind and (kind == "full" or checkpoint.size == world.size)
    ]
    if not checkpoints:
        pytest.skip(f"the set of torch {golden.torch_version} holds no FSDP1 {kind} state dicts")
    found: list[str] = []
    for checkpoint in checkpoints:
        training = _fsdp1_loaded(golden, checkpoint, world)
        if kind == "local":
            found += _values_differ(golden, checkpoint, training, keys="model.")
            continue
        reader = "single" if world.size == 1 else checkpoint.cell
        found += _values_differ(golden, checkpoint, training) or _continuation_differs(
            golden, checkpoint, training, reader
        )
    assert not found, "\n".join(found)


@pytest.mark.world(1)
@pytest.mark.parametrize("model_id", SINGLE_MODELS)
@pytest.mark.parametrize("release", RELEASES)
def test_golden_single_process_state_loads_as_recorded(world, release, model_id):
    """One process's ``torch.save`` state of ``release``'s set, loaded with ``weights_only``:
    its values, bit for bit."""
    golden = golden_set(release)
    training = _single_state(golden, model_id, world.device)
    found = _values_differ(golden, golden.single(model_id), training)
    assert not found, "\n".join(found)


@pytest.mark.world(1)
@pytest.mark.parametrize("model_id", SINGLE_MODELS)
@pytest.mark.parametrize("release", RELEASES)
def test_golden_single_process_steps_continue_as_recorded(world, release, model_id):
    """Each step after one process's ``torch.save`` state of ``release``'s set, taken by the
    release that wrote it on the kind of device it trained on, equals the recorded trajectory:
    bit for bit where this build and machine signature are the writer's, else within the
    tolerance of ``conformance.compare._computed`` (kernels of another CPU round differently)."""
    golden = golden_set(release)
    if str(release_of(torch.__version__)) != release:
        pytest.skip(f"steps of torch {golden.torch_version} are held in that release alone")
    if world.device.type != golden.device:
        pytest.skip(f"the set trained on {golden.device}; {world.device.type} rounds otherwise")
    if golden.machine is None:
        pytest.skip(
            f"the set of torch {golden.torch_version} keeps no trajectory: write it again with "
            "python -m ci.gate.golden"
        )
    checkpoint = golden.single(model_id)
    model, optimizer, scheduler = _single_state(golden, model_id, world.device)
    bitwise = _same_build_and_machine(golden, world.device_type)
    recorded = golden.trajectory(model_id)
    for step in range(golden.steps, golden.steps + MORE_STEPS):
        train(model, optimizer, 1, scheduler, start=step, inputs=MODELS[model_id].inputs)
        state = state_leaves(full_state(model, optimizer, scheduler, flatten=False))
        steps = 0 if bitwise else step + 1 - golden.steps
        differ = computed_differences(state, recorded[step], steps=steps)
        assert not differ, (
            f"{_where(golden, checkpoint)}, after step {step + 1} "
            f"({'bit for bit' if bitwise else 'within a tolerance'}: {_machines(golden)}): "
            f"{differ}"
        )


def _same_build_and_machine(golden: GoldenSet, device_type: str) -> bool:
    """Whether this process is the build and the machine that computed ``golden``'s
    trajectory, so that its steps must give the same bits."""
    same_build = (torch.__version__, torch.version.git_version) == (
        golden.torch_version,
        golden.torch_git,
    )
    return same_build and this_machine(device_type) == golden.machine


def _machines(golden: GoldenSet) -> str:
    here = this_machine(golden.device)
    differences = golden.machine.differences(here)
    if not differences:
        return f"written on this machine's signature, {here.describe()}"
    return f"written on {golden.machine.describe()}; here {'; '.join(differences)}"
