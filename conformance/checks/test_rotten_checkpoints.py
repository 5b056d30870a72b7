"""A checkpoint whose bytes rotted after the save never loads other values silently, and is
refused by an error naming the rotten file.

DCP stores no checksum of what it writes, and safetensors none of its payload. A checkpoint's
files may change after a whole save: a flipped bit on a disk, a copy cut short, a
``.metadata`` copied from another checkpoint. Two demands are judged, each its own id:

- ``never_loads_other_values``: the load is refused on every rank (by any error), or every
  value loads as saved, bit for bit;
- ``is_refused_naming_the_file``: the load is refused, and the error names the rotten file's
  path, so that a user knows which file to restore.

What upstream fails of these is recorded in the manifest; a fork that sees the rot passes
(its XPASS says so). ``conformance/README.md`` tells users which rot DCP cannot see.

Each cell that writes the golden checkpoints (one per family) trains ``SAVED_AFTER`` steps
and saves its model and optimizer state through ``dcp.save`` at its smallest size above one.
Rank 0 then spoils the checkpoint:

- ``flipped_payload``: one byte in the middle of a tensor's stored values in its ``.distcp``
  file is flipped (found by searching the file for the bytes rank 0 saved);
- ``truncated_data``: rank 0's ``.distcp`` file is cut to half its length;
- ``truncated_metadata``: ``.metadata`` is cut to half its length;
- ``other_metadata``: ``.metadata`` is replaced by that of another checkpoint of the same
  training, saved one step later by one process (another layout of the same keys).

Fresh objects of the cell load it as a training loop does (``get_state_dict``'s templates
into ``dcp.load``). A Hugging Face checkpoint written by rank 0 with one byte of a tensor's
payload flipped is loaded through ``HuggingFaceStorageReader`` at 1, 2 and 4 ranks; its cut
and malformed headers are ``test_bad_checkpoints_are_refused.py``'s.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import pytest
import torch

from conformance._upstream import dcp
from conformance.cells import PARALLELISMS, SINGLE, first_size_only, with_role
from conformance.compare import holds_a_part, local_tensors_by_path
from conformance.models.common import ground_truth, train
from conformance.models.optimizers import OPTIMIZERS
from conformance.training import (
    differences,
    fresh_training,
    refusal_of,
    spoiled_hugging_face_file,
    trained,
    training_in,
    training_state,
    tree_leaves,
)

Rot = Literal["flipped_payload", "truncated_data", "truncated_metadata", "other_metadata"]
ROTS: tuple[Rot, ...] = (
    "flipped_payload",
    "truncated_data",
    "truncated_metadata",
    "other_metadata",
)
RECIPE = "adam"
SAVED_AFTER = 2
METADATA = ".metadata"
RANK_0_DATA = "__0_0.distcp"  # the data file rank 0 writes with FileSystemWriter's defaults


@pytest.mark.world(2, 4, applies=first_size_only("cell"))
@pytest.mark.parametrize("rot", ROTS)
@pytest.mark.parametrize("cell", with_role("golden"))
def test_a_rotten_checkpoint_never_loads_other_values(world, cell, rot):
    """Refused on every rank (by any error), or every value loads as saved."""
    refused, wrong, rotten = _load_rotten(world, cell, rot)
    assert refused is not None or not wrong, (
        f"rank {world.rank}: a checkpoint with {rot} ({rotten.name}) loaded other values than "
        "saved, silently: " + "; ".join(wrong)
    )


@pytest.mark.world(2, 4, applies=first_size_only("cell"))
@pytest.mark.parametrize("rot", ROTS)
@pytest.mark.parametrize("cell", with_role("golden"))
def test_a_rotten_checkpoint_is_refused_naming_the_file(world, cell, rot):
    """Refused on every rank by an error that names the rotten file's path."""
    refused, wrong, rotten = _load_rotten(world, cell, rot)
    assert refused is not None, (
        f"rank {world.rank}: a checkpoint with {rot} ({rotten.name}) loaded"
        + (": " + "; ".join(wrong) if wrong else ", every value as saved")
    )
    assert str(rotten) in str(refused), (
        f"rank {world.rank}: the load of a checkpoint with {rot} refused without naming "
        f"{rotten}: {str(refused)[-600:]}"
    )


def _load_rotten(world: Any, cell: str, rot: Rot) -> tuple[BaseException | None, list[str], Path]:
    """Save ``cell``'s trained state, let rank 0 rot it, and load it into fresh objects: the
    refusal (or None), the values that loaded other than saved, and the rotten file."""
    parallelism = PARALLELISMS[cell]
    parallelism.skip_unless_runnable(world.device)
    path = world.tmp_path / "checkpoint"
    model, optimizer, _ = trained(parallelism, world, RECIPE, SAVED_AFTER)
    state = training_state(model, optimizer, None)
    dcp.save(state, checkpoint_id=str(path))
    saved = tree_leaves(state)
    flatten = holds_a_part(model)
    if rot == "other_metadata" and world.rank == 0:
        _save_one_step_later_alone(world, parallelism.model_id, world.tmp_path / "other", flatten)
    world.barrier()
    if world.rank == 0:
        _rot(rot, path, world.tmp_path / "other", state)
    world.barrier()
    model, optimizer, _ = fresh_training(parallelism, world, RECIPE)
    template = training_state(model, optimizer, None, flatten=flatten)
    refused = refusal_of(lambda: dcp.load(template, checkpoint_id=str(path)))
    wrong = [] if refused else differences(tree_leaves(template), saved, ("loaded", "saved"))
    world.barrier()  # every rank has loaded before the next test's saves
    return refused, wrong, path / (METADATA if rot.endswith("metadata") else RANK_0_DATA)


def _save_one_step_later_alone(world: Any, model_id: str, other: Path, flatten: bool) -> None:
    """On this rank alone: the zoo's ``model_id`` trained one step more than the cell's, saved
    by one process in the cell's form of optimizer state."""
    model, optimizer, scheduler = training_in(SINGLE, world, RECIPE, model_id)
    train(model, optimizer, SAVED_AFTER + 1, scheduler)
    state = training_state(model, optimizer, None, flatten=flatten)
    dcp.save(state, checkpoint_id=str(other), no_dist=True)


def _rot(rot: Rot, path: Path, other: Path, state: dict[str, Any]) -> None:
    if rot == "flipped_payload":
        _flip_a_saved_byte(path / RANK_0_DATA, local_tensors_by_path(state["model"]))
    elif rot == "truncated_data":
        _truncate(path / RANK_0_DATA)
    elif rot == "truncated_metadata":
        _truncate(path / METADATA)
    else:
        (path / METADATA).write_bytes((other / METADATA).read_bytes())


def _truncate(file: Path) -> None:
    data = file.read_bytes()
    file.write_bytes(data[: len(data) // 2])


def _flip_a_saved_byte(file: Path, tensors: list[tuple[str, torch.Tensor]]) -> None:
    """Flip the middle byte of the first of ``tensors`` (this rank's, by path) whose bytes the
    file holds as they are."""
    data = bytearray(file.read_bytes())
    for _, tensor in tensors:
        payload = tensor.detach().cpu().contiguous().numpy().tobytes()
        start = data.find(payload) if len(payload) >= 16 else -1
        if start >= 0:
            data[start + len(payload) // 2] ^= 0x40
            file.write_bytes(bytes(data))
            return
    raise AssertionError(f"{file.name} holds none of the tensors saved: {[p for p, _ in tensors]}")


@pytest.mark.world(1, 2, 4)
def test_a_rotten_safetensors_payload_is_refused_naming_the_file(world):
    model = ground_truth(SAVED_AFTER, OPTIMIZERS[RECIPE], device=world.device).model
    file = spoiled_hugging_face_file(world, model, _flip_a_safetensors_payload_byte)
    path = file.parent
    template = {key: torch.zeros_like(value) for key, value in model.items()}
    saved = tree_leaves(model)
    reader = dcp.HuggingFaceStorageReader(str(path))
    refused = refusal_of(lambda: dcp.load(template, storage_reader=reader))
    if refused is not None:
        assert str(file) in str(refused), (
            f"rank {world.rank}: refused without naming {file}: {str(refused)[-600:]}"
        )
        return
    wrong = differences(tree_leaves(template), saved, ("loaded", "saved"))
    assert not wrong, (
        f"rank {world.rank}: a safetensors file with a flipped payload byte ({file.name}) "
        "loaded other values than saved, silently: " + "; ".join(wrong)
    )


def _flip_a_safetensors_payload_byte(file: Path) -> None:
    """Flip the middle byte of the first tensor's payload: the header's length is the file's
    first 8 bytes (little-endian), and each tensor's ``data_offsets`` count from its end."""
    data = bytearray(file.read_bytes())
    header_length = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + header_length])
    name = min(key for key in header if key != "__metadata__")
    begin, end = header[name]["data_offsets"]
    data[8 + header_length + (begin + end) // 2] ^= 0x40
    file.write_bytes(bytes(data))
