"""Hugging Face checkpoints: a model's state saved as safetensors through DCP and read back.

Each cell trains ``SAVED_AFTER`` steps and saves its model's state through
``HuggingFaceStorageWriter``, in one of three layouts:

- ``consolidated``: every rank writes its pieces (``save_distributed``), and the save joins
  them into whole tensors (``enable_consolidation``). They go in two files chosen by
  ``fqn_to_index_mapping``: ``fc1``'s tensors in ``model-00001-of-00002.safetensors``, the
  rest in ``model-00002-of-00002.safetensors``. The ``model.safetensors.index.json`` maps
  each key to its file.
- ``sharded``: every rank writes its pieces, not joined.
- ``rank0_full``: the full state dict saved by rank 0 alone (``no_dist``), as a model is
  published, split over the same two files by ``fqn_to_index_mapping``.

The state is saved in ``float32`` and, cast piece by piece, in ``bfloat16``. Where the files
hold whole tensors (``consolidated``, ``rank0_full``), the ``safetensors`` package reads them
on rank 0. They must hold every key of the model, in its dtype and shape. Each key holds
exactly the saving model's full state cast to that dtype. That full state is itself the
single-process state after ``SAVED_AFTER`` steps, within the cell's tolerance. The index names
the file each key lies in, and its ``total_size`` the bytes the tensors hold.

A file that ``safetensors.torch.save_file`` wrote on rank 0 (no DCP metadata, no index), of
the single-process state, loads the same way into every cell; the reader's ``read_metadata``
describes each key as one whole chunk of its size and dtype.

A ``sharded`` save's files are named ``shard-<rank>-model-<i>-of-<n>.safetensors``, each with
the keys mapped to file ``i``. ``consolidate_safetensors_files_on_every_rank`` joins them at 2
and 4 ranks, into two files and into one (where ranks without a file wait): the files and
index hold the model's full state.

In every layout, fresh objects of the same cell load the files through
``HuggingFaceStorageReader`` into their own (sharded) state dict. The model then holds exactly
those values. A build skips, naming what is missing, if it lacks the writer, the options a
layout needs, or the ``safetensors`` package. The writer of 2.8 has neither
``save_distributed`` nor ``enable_consolidation``. The mutant
``safetensors_written_in_float32`` (a writer that stores a ``bfloat16`` tensor as ``float32``)
is seen by this module only.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Literal

import pytest
import torch

from conformance._upstream import (
    dcp,
    dcp_consolidate,
    dcp_loader,
    dsd,
    full_options,
    with_parameters,
)
from conformance.cells import PARALLELISMS, comparison_tolerance, exists_at_size, with_role
from conformance.compare import assert_state_dict_equal, held_part, whole_model_state
from conformance.models.optimizers import OPTIMIZERS
from conformance.models.zoo import truth_of
from conformance.training import fresh_training, trained

Layout = Literal["consolidated", "sharded", "rank0_full"]
LAYOUTS: tuple[Layout, ...] = ("consolidated", "sharded", "rank0_full")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
RECIPE = "adam"
SAVED_AFTER = 2
CELLS = sorted(PARALLELISMS)
INDEX = "model.safetensors.index.json"
# The writer's options each distributed layout needs (2.8's writer has neither).
LAYOUT_OPTIONS = {
    "consolidated": ("save_distributed", "enable_consolidation"),
    "sharded": ("save_distributed",),
}


def _file_index(key: str) -> int:
    """The file ``fqn_to_index_mapping`` puts ``key`` in: 1 for ``fc1``'s tensors, else 2."""
    return 1 if key.startswith("fc1.") else 2


def _cast(state: dict[str, Any], dtype: torch.dtype) -> dict[str, Any]:
    """Each tensor of ``state`` (plain, DTensor or ShardedTensor) as ``dtype``."""
    return {key: value.to(dtype) for key, value in state.items()}


def _save(
    world: Any, cell: str, layout: Layout, dtype: torch.dtype, path: Path
) -> dict[str, torch.Tensor]:
    """Train the cell, save its model state in ``layout`` under ``path``: the whole model's
    full state, as trained (on a pipeline, every stage's part)."""
    writer_class = dcp.HuggingFaceStorageWriter  # every rank skips where the build lacks it
    if layout != "rank0_full":
        with_parameters(writer_class, *LAYOUT_OPTIONS[layout])
    model, _, _ = trained(PARALLELISMS[cell], world, RECIPE, SAVED_AFTER)
    full = whole_model_state(dsd.get_model_state_dict(model, options=full_options()))
    if layout == "rank0_full":
        if world.rank == 0:
            mapping = {key: _file_index(key) for key in full}
            writer = writer_class(str(path), fqn_to_index_mapping=mapping)
            dcp.save(_cast(full, dtype), storage_writer=writer, no_dist=True)
        world.barrier()
        return full
    state = _cast(dsd.get_model_state_dict(model), dtype)
    writer = writer_class(
        str(path),
        fqn_to_index_mapping={key: _file_index(key) for key in full},  # the whole model's
        save_distributed=True,
        **({"enable_consolidation": True} if layout == "consolidated" else {}),
    )
    dcp.save(state, storage_writer=writer)
    return full


def _assert_files_hold(path: Path, expected: dict[str, torch.Tensor], files: int) -> None:
    """The ``files`` safetensors files under ``path`` (not below), named as Hugging Face
    names the parts of a model (``model-00001-of-00002.safetensors``), hold ``expected``,
    and its index names the file of each key."""
    safetensors_torch = pytest.importorskip("safetensors.torch")
    held = {
        file.name: safetensors_torch.load_file(str(file))
        for file in sorted(path.glob("*.safetensors"))
    }
    named = [f"model-{part:05d}-of-{files:05d}.safetensors" for part in range(1, files + 1)]
    assert sorted(held) == named, f"the save wrote {sorted(held)}, not {named}"
    read = {key: tensor for tensors in held.values() for key, tensor in tensors.items()}
    assert_state_dict_equal(read, expected)
    index = json.loads((path / INDEX).read_text())
    where = {key: name for name, tensors in held.items() for key in tensors}
    assert index["weight_map"] == where, (
        f"{INDEX} maps keys to {index['weight_map']}, the files hold {where}"
    )
    size = sum(tensor.numel() * tensor.element_size() for tensor in read.values())
    assert index.get("metadata", {}).get("total_size") == size, (
        f"{INDEX} gives a total size of {index.get('metadata')}, the tensors hold {size} bytes"
    )


@pytest.mark.world(1, 2, 4, applies=exists_at_size("cell"))
@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("cell", CELLS)
def test_safetensors_hold_the_model_and_load_into_the_cell(world, cell, layout, dtype):
    parallelism = PARALLELISMS[cell]
    parallelism.skip_unless_runnable(world.device)
    pytest.importorskip("safetensors")
    path = world.tmp_path / "hf"
    trained = _save(world, cell, layout, DTYPES[dtype], path)
    truth = truth_of(parallelism, SAVED_AFTER, OPTIMIZERS[RECIPE], world.device).model
    assert_state_dict_equal(trained, truth, **comparison_tolerance(parallelism))
    expected = _cast(trained, DTYPES[dtype])
    if layout != "sharded" and world.rank == 0:
        _assert_files_hold(path, expected, files=2)
    model, _, _ = fresh_training(parallelism, world, RECIPE)
    state = _cast(dsd.get_model_state_dict(model), DTYPES[dtype])
    dcp.load(state, storage_reader=dcp.HuggingFaceStorageReader(str(path)))
    dsd.set_model_state_dict(model, state)
    loaded = _cast(dsd.get_model_state_dict(model, options=full_options()), DTYPES[dtype])
    assert_state_dict_equal(loaded, held_part(expected, model))


@pytest.mark.world(1, 2, 4, applies=exists_at_size("cell"))
@pytest.mark.parametrize("cell", CELLS)
def test_a_file_safetensors_wrote_loads_into_the_cell(world, cell):
    """A model published by ``safetensors.torch.save_file`` (no DCP metadata, no index) on
    rank 0: ``HuggingFaceStorageReader`` reads it into every rank's (sharded) state dict."""
    parallelism = PARALLELISMS[cell]
    parallelism.skip_unless_runnable(world.device)
    safetensors_torch = pytest.importorskip("safetensors.torch")
    reader_class = dcp.HuggingFaceStorageReader  # every rank skips where the build lacks it
    truth = truth_of(parallelism, SAVED_AFTER, OPTIMIZERS[RECIPE], torch.device("cpu")).model
    path = world.tmp_path / "published"
    if world.rank == 0:
        path.mkdir()
        published = {key: value.contiguous() for key, value in truth.items()}
        safetensors_torch.save_file(published, str(path / "model.safetensors"))
    world.barrier()
    _assert_read_metadata_describes(reader_class(str(path)).read_metadata(), truth)
    model, _, _ = fresh_training(parallelism, world, RECIPE)
    state = dsd.get_model_state_dict(model)
    dcp.load(state, storage_reader=reader_class(str(path)))
    dsd.set_model_state_dict(model, state)
    loaded = dsd.get_model_state_dict(model, options=full_options())
    expected = {key: value.to(world.device) for key, value in held_part(truth, model).items()}
    assert_state_dict_equal(loaded, expected)


def _assert_read_metadata_describes(metadata: Any, published: dict[str, torch.Tensor]) -> None:
    """The reader's ``Metadata`` of a file without DCP's: each key a tensor of its size and
    dtype, held in one chunk at offset zero."""
    described = {
        key: (
            tuple(value.size),
            value.properties.dtype,
            [(tuple(c.offsets), tuple(c.sizes)) for c in value.chunks],
        )
        for key, value in metadata.state_dict_metadata.items()
    }
    expected = {
        key: (tuple(value.shape), value.dtype, [((0,) * value.dim(), tuple(value.shape))])
        for key, value in published.items()
    }
    assert described == expected, f"read_metadata describes {described}, the file holds {expected}"


SHARD_FILE = re.compile(r"shard-(\d{5})-model-(\d{5})-of-(\d{5})\.safetensors")


@pytest.mark.world(2, 4, applies=exists_at_size("cell"))
@pytest.mark.parametrize("files", [1, 2])
@pytest.mark.parametrize("cell", with_role("golden"))
def test_sharded_safetensors_consolidate_on_every_rank(world, cell, files):
    """A ``sharded`` save names each rank's files ``shard-<rank>-model-<i>-of-<n>`` (ranks and
    files counted from 1), each holding the keys ``fqn_to_index_mapping`` puts in file ``i``.
    ``consolidate_safetensors_files_on_every_rank`` then joins them on every rank, each
    writing its share of the output files (into one file, the ranks without a file wait):
    the files and index hold the model's full state."""
    parallelism = PARALLELISMS[cell]
    parallelism.skip_unless_runnable(world.device)
    safetensors_torch = pytest.importorskip("safetensors.torch")
    consolidate = dcp_consolidate.consolidate_safetensors_files_on_every_rank
    path, out = world.tmp_path / "sharded", world.tmp_path / "consolidated"
    full = _save(world, cell, "sharded", torch.float32, path)
    world.barrier()
    if world.rank == 0:
        for file in sorted(path.glob("*.safetensors")):
            named = SHARD_FILE.fullmatch(file.name)
            assert named is not None, f"the sharded save wrote {file.name}"
            shard, part, parts = (int(group) for group in named.groups())
            assert 1 <= shard <= world.size, f"the sharded save wrote {file.name}"
            assert parts == 2, f"the sharded save wrote {file.name}"
            keys = set(safetensors_torch.load_file(str(file)))
            misplaced = sorted(key for key in keys if _file_index(key) != part)
            assert not misplaced, f"{file.name} holds {misplaced}, mapped to another file"
    mapping = {key: 1 if files == 1 else _file_index(key) for key in full}
    out.mkdir(exist_ok=True)  # the output folder is the caller's to make
    consolidate(str(path), str(out), mapping)
    world.barrier()
    if world.rank == 0:
        _assert_files_hold(out, full, files=files)


@pytest.mark.world(1)
@pytest.mark.parametrize("keys", ["every_key", "fc2_only"])
def test_a_safetensors_checkpoint_reads_into_an_empty_dict(world, keys):
    """``_load_state_dict_from_keys`` reads a Hugging Face checkpoint with no template: every
    key (or those asked for) as the whole tensor the file holds."""
    pytest.importorskip("safetensors")
    writer_class = dcp.HuggingFaceStorageWriter  # skips where the build lacks it
    state = truth_of(
        PARALLELISMS["ddp"], SAVED_AFTER, OPTIMIZERS[RECIPE], torch.device("cpu")
    ).model
    path = world.tmp_path / "published"
    dcp.save(state, storage_writer=writer_class(str(path)), no_dist=True)
    asked = None if keys == "every_key" else {"fc2.weight", "fc2.bias"}
    read = dcp_loader._load_state_dict_from_keys(
        asked, storage_reader=dcp.HuggingFaceStorageReader(str(path))
    )
    expected = state if asked is None else {key: state[key] for key in asked}
    assert sorted(read) == sorted(expected), f"read the keys {sorted(read)}"
    assert_state_dict_equal(read, expected)
