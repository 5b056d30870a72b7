"""Bad checkpoints are refused on every rank, by an error naming what is wrong; nothing changes.

A cell trains ``SAVED_AFTER`` steps and saves its model and optimizer state through
``dcp.save``, with one entry spoiled. Fresh objects of the same cell then load it as a
training loop does (``get_state_dict``'s templates into ``dcp.load``). The spoils, of
``fc1.weight``:

- ``renamed``: saved as ``fc3.weight``, as a checkpoint of another model holds it;
- ``wrong_shape``: saved with one more row;
- ``short_shape``: saved with one row fewer (the template is the larger);
- ``wrong_dtype``: saved as ``float64`` (other values than the model's).

The load must raise on every rank, naming the key (``model.fc1.weight``). It must leave the
templates, the model, the optimizer and every file of the checkpoint as they were. A dtype
can also be converted, as ``load_state_dict`` converts it: a load that does so must give the
saved values in the parameter's dtype. Each cell runs at every size it has.

Bad files, at 1, 2 and 4 ranks:

- a Hugging Face checkpoint written by rank 0 and loaded through ``HuggingFaceStorageReader``,
  whose safetensors file is cut short, declares a header longer than the file, or holds a
  header that is not JSON;
- a ``torch.save`` file that holds a list, not a state dict, read on rank 0 by
  ``BroadcastingTorchSaveReader``.

Every rank must raise an error that names the file, and the files must be left as they were.
On 2.13.0 no such error names the file. There the list read by ``BroadcastingTorchSaveReader``
also hangs the ranks other than 0 in its broadcast. Both are manifest entries.

DCP reports a failed load as ``CheckpointException``, which derives from ``BaseException``
(on 2.6.0, 2.13.0 and 2.15.0): a script's ``except Exception`` does not catch it. The check
expects that class by name.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import pytest
import torch

from conformance._upstream import dcp, dcp_formats, dsd, full_options
from conformance.cells import PARALLELISMS, exists_at_size
from conformance.compare import assert_state_dict_equal, held_part, local_copy
from conformance.models.common import ground_truth
from conformance.models.optimizers import OPTIMIZERS
from conformance.training import (
    file_hashes,
    fresh_training,
    refusal_of,
    spoiled_hugging_face_file,
    trained,
    training_state,
)

Spoil = Literal["renamed", "wrong_shape", "short_shape", "wrong_dtype"]
SPOILS: tuple[Spoil, ...] = ("renamed", "wrong_shape", "short_shape", "wrong_dtype")
FileSpoil = Literal["cut_short", "header_too_long", "header_not_json"]
FILE_SPOILS: tuple[FileSpoil, ...] = ("cut_short", "header_too_long", "header_not_json")
RECIPE = "adam"
SAVED_AFTER = 2
CELLS = sorted(PARALLELISMS)
PARAM = "fc1.weight"
KEY = f"model.{PARAM}"


def _spoiled(model_state: dict[str, Any], spoil: Spoil) -> dict[str, Any]:
    """``model_state`` with ``PARAM`` spoiled (a new dict; the model's tensors untouched),
    where this rank holds it (a pipeline stage may not)."""
    state = dict(model_state)
    if PARAM not in state:
        return state
    value = state.pop(PARAM)
    if spoil == "renamed":
        state["fc3.weight"] = value
    elif spoil in ("wrong_shape", "short_shape"):
        rows = value.shape[0] + (1 if spoil == "wrong_shape" else -1)
        state[PARAM] = torch.zeros(rows, *value.shape[1:])
    else:
        state[PARAM] = _saved_float64()
    return state


def _saved_float64() -> torch.Tensor:
    """The ``wrong_dtype`` spoil's value: not the model's, so that a load that converts it
    shows what it read (any device's training gives such a value)."""
    return ground_truth(SAVED_AFTER, OPTIMIZERS[RECIPE], device="cpu").model[PARAM].double() * 1.5


@pytest.mark.world(1, 2, 4, applies=exists_at_size("cell"))
@pytest.mark.parametrize("spoil", SPOILS)
@pytest.mark.parametrize("cell", CELLS)
def test_a_spoiled_checkpoint_is_refused_naming_the_key(world, cell, spoil):
    parallelism = PARALLELISMS[cell]
    parallelism.skip_unless_runnable(world.device)
    path = world.tmp_path / "checkpoint"
    model, optimizer, _ = trained(parallelism, world, RECIPE, SAVED_AFTER)
    state = training_state(model, optimizer, None)
    dcp.save({**state, "model": _spoiled(state["model"], spoil)}, checkpoint_id=str(path))
    world.barrier()
    files = file_hashes(path)
    model, optimizer, _ = fresh_training(parallelism, world, RECIPE)
    template = training_state(model, optimizer, None)
    before = local_copy(template)
    refused = refusal_of(lambda: dcp.load(template, checkpoint_id=str(path)))
    if refused is None:
        assert spoil == "wrong_dtype", f"rank {world.rank}: the {spoil} checkpoint loaded"
        _assert_converted(model, template)
    else:
        assert KEY in str(refused), f"rank {world.rank}: the error names no {KEY}: {refused}"
        assert_state_dict_equal(local_copy(template), before)
        assert_state_dict_equal(local_copy(training_state(model, optimizer, None)), before)
    world.barrier()
    assert file_hashes(path) == files, f"rank {world.rank}: the load changed the checkpoint"


def _assert_converted(model: Any, template: dict[str, Any]) -> None:
    """The ``wrong_dtype`` load converted the saved values: the model holds them as float32
    (where it holds ``PARAM``)."""
    dsd.set_model_state_dict(model, template["model"])
    loaded = dsd.get_model_state_dict(model, options=full_options())
    expected = held_part({PARAM: _saved_float64().float()}, model)
    assert_state_dict_equal({key: loaded[key] for key in expected}, expected)


def _spoil_file(file: Path, spoil: FileSpoil) -> None:
    """Spoil a safetensors file: cut off its last bytes, declare a header longer than the
    file (the first 8 bytes are the header's length), or make the header other than JSON."""
    data = file.read_bytes()
    if spoil == "cut_short":
        data = data[:-8]
    elif spoil == "header_too_long":
        data = len(data).to_bytes(8, "little") + data[8:]
    else:
        data = data[:8] + b"<not json" + data[17:]
    file.write_bytes(data)


def _assert_refused_naming(world: Any, refused: BaseException, file: Path) -> None:
    assert file.name in str(refused), (
        f"rank {world.rank}: the error names no {file.name}: {refused}"
    )


@pytest.mark.world(1, 2, 4)
@pytest.mark.parametrize("spoil", FILE_SPOILS)
def test_a_spoiled_safetensors_file_is_refused_naming_it(world, spoil):
    model = ground_truth(SAVED_AFTER, OPTIMIZERS[RECIPE], device=world.device).model
    file = spoiled_hugging_face_file(world, model, lambda file: _spoil_file(file, spoil))
    path = file.parent
    files = file_hashes(path)
    template = {key: torch.zeros_like(value) for key, value in model.items()}
    with pytest.raises(dcp.CheckpointException) as refused:
        dcp.load(template, storage_reader=dcp.HuggingFaceStorageReader(str(path)))
    assert all(not value.any() for value in template.values()), "the template was written"
    world.barrier()
    assert file_hashes(path) == files, f"rank {world.rank}: the load changed the files"
    _assert_refused_naming(world, refused.value, file)


@pytest.mark.world(1, 2, 4)
def test_a_torch_save_file_that_is_no_state_dict_is_refused_naming_it(world):
    file = world.tmp_path / "model.pt"
    model = ground_truth(SAVED_AFTER, OPTIMIZERS[RECIPE], device=world.device).model
    if world.rank == 0:
        torch.save(list(model.values()), file)
    world.barrier()
    template = {key: torch.zeros_like(value) for key, value in model.items()}
    with pytest.raises(dcp.CheckpointException) as refused:
        dcp.load(
            template,
            storage_reader=dcp_formats.BroadcastingTorchSaveReader(),
            planner=dcp_formats.DynamicMetaLoadPlanner(),
            checkpoint_id=str(file),
        )
    assert all(not value.any() for value in template.values()), "the template was written"
    _assert_refused_naming(world, refused.value, file)
