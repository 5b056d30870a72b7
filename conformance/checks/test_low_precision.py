"""Low-precision tensors keep their values, their dtype and their size through every save and
load path.

bf16 and fp16 exports, fp8 weights, int8 ones and bool masks are saved and read by the paths
fp32 state takes. Here each golden cell's model state (and one process's), cast to a dtype of
``DTYPES``, goes through one path of ``PATHS``:

- ``dcp``: ``dcp.save``, then ``dcp.load`` into zeros of the same placements;
- ``dcp_resharded``: ``dcp.save``, then ``dcp.load`` on every rank into whole plain tensors;
- ``safetensors``: ``HuggingFaceStorageWriter`` joining every rank's pieces into whole tensors
  in one file (``save_distributed``, ``enable_consolidation``), read back through
  ``HuggingFaceStorageReader`` into zeros of the cell's placements;
- ``torch_save``: each rank's ``torch.save`` of its state, read by
  ``torch.load(weights_only=True)``.

Each path must give back every tensor bit for bit, in its dtype. What it stores must be the
tensor's bytes in that dtype, no wider and no more:

- ``dcp``: ``.metadata`` records the dtype, and each stored chunk, read on its own by
  ``torch.load(weights_only=True)``, is a tensor of that dtype and of the chunk's size whose
  storage holds its elements alone (DCP clones a view of a larger storage before it writes);
- ``safetensors``: the file's header names the dtype (``BF16``, ``F16``, ``F8_E4M3``,
  ``F8_E5M2``, ``I8``, ``BOOL``) and gives each tensor ``numel * itemsize`` bytes;
- ``torch_save``: each tensor read back has a storage of the saved tensor's size.

int8 values are the fp32 ones times ``INT8_SCALE``, truncated, so that they span the type;
bool ones are the fp32 ones' signs.
Every golden cell but FSDP1's at its first size, and one process.
"""

from __future__ import annotations

import io
import json
import math
from pathlib import Path
from typing import Any, Literal

import pytest
import torch

from conformance._upstream import dcp, dsd, full_options, with_parameters
from conformance.cells import PARALLELISMS, first_size_only, with_role
from conformance.compare import local_part, whole_model_state
from conformance.models.common import seeded_mlp
from conformance.models.zoo import model_of

SavePath = Literal["dcp", "dcp_resharded", "safetensors", "torch_save"]
PATHS: tuple[SavePath, ...] = ("dcp", "dcp_resharded", "safetensors", "torch_save")
DTYPES = {
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "fp8_e4m3": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
    "int8": torch.int8,
    "bool": torch.bool,
}
# safetensors' name of each dtype (its format's specification).
SAFETENSORS_DTYPES = {
    torch.bfloat16: "BF16",
    torch.float16: "F16",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e5m2: "F8_E5M2",
    torch.int8: "I8",
    torch.bool: "BOOL",
}
INT8_SCALE = 64
# FSDP1's model state is ShardedTensors, which have no arithmetic (an int8 cast scales) nor a
# local part to compare; FSDP1 meets low precision in the mixed-precision checks.
CELLS = ["single", *(name for name in with_role("golden") if not PARALLELISMS[name].fsdp1)]
HF_FILE = "model-00001-of-00001.safetensors"


def _at_its_size(size: int, **params: Any) -> bool:
    if params["name"] == "single":
        return size == 1
    return first_size_only()(size, **params)


@pytest.mark.world(1, 2, 4, applies=_at_its_size)
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("name", CELLS)
def test_a_low_precision_state_comes_back_in_its_dtype_and_size(world, name, dtype, path):
    model = _model(world, name)
    state = _cast(dsd.get_model_state_dict(model), DTYPES[dtype])
    where = world.tmp_path / "checkpoint"
    if path == "torch_save":
        _torch_save_round_trip(world, state, where)
        return
    if path == "safetensors":
        _safetensors_round_trip(world, state, DTYPES[dtype], where)
        return
    dcp.save(state, checkpoint_id=str(where))
    if world.rank == 0:
        _assert_dcp_stores_each_chunk_in_its_dtype(where, DTYPES[dtype])
    if path == "dcp":
        template = {key: torch.zeros_like(value) for key, value in state.items()}
        expected = state
    else:
        whole = whole_model_state(dsd.get_model_state_dict(model, options=full_options()))
        expected = _cast(whole, DTYPES[dtype])
        template = {key: torch.zeros_like(value) for key, value in expected.items()}
    dcp.load(template, checkpoint_id=str(where))
    _assert_bitwise(world.rank, template, expected)


def _model(world: Any, name: str) -> torch.nn.Module:
    if name == "single":
        return seeded_mlp().to(world.device)
    cell = PARALLELISMS[name]
    cell.skip_unless_runnable(world.device)
    return model_of(cell, world)


def _cast(state: dict[str, Any], dtype: torch.dtype) -> dict[str, Any]:
    """Each floating tensor of ``state`` (plain or DTensor) as ``dtype``: int8 scaled first,
    bool the values' signs (a mask)."""
    if dtype == torch.bool:
        return {
            key: value.detach() > 0 for key, value in state.items() if value.is_floating_point()
        }
    scale = INT8_SCALE if dtype == torch.int8 else 1
    return {
        key: (value.detach() * scale).to(dtype)
        for key, value in state.items()
        if value.is_floating_point()
    }


def _bits(value: Any) -> torch.Tensor:
    """The bytes of ``value``'s local part: fp8 has no equality of its own on every build,
    and bytes compare NaNs too."""
    return local_part(value).contiguous().reshape(-1).view(torch.uint8)


def _assert_bitwise(rank: int, got: dict[str, Any], expected: dict[str, Any]) -> None:
    assert got.keys() == expected.keys(), f"rank {rank}: keys {sorted(got)}"
    for key, value in expected.items():
        loaded = got[key]
        assert local_part(loaded).dtype == local_part(value).dtype, (
            f"rank {rank}, {key}: came back as {local_part(loaded).dtype}, saved as "
            f"{local_part(value).dtype}"
        )
        assert torch.equal(_bits(loaded), _bits(value)), (
            f"rank {rank}, {key} ({local_part(value).dtype}): came back as "
            f"{local_part(loaded).flatten()[:4].float().tolist()}..., saved "
            f"{local_part(value).flatten()[:4].float().tolist()}..."
        )


def _assert_dcp_stores_each_chunk_in_its_dtype(where: Path, dtype: torch.dtype) -> None:
    """Every key of the checkpoint (every rank's: an expert's may be on another) is recorded
    and stored in ``dtype``, each chunk in a storage of its own size."""
    metadata = dcp.FileSystemReader(str(where)).read_metadata()
    for key, recorded in metadata.state_dict_metadata.items():
        assert recorded.properties.dtype == dtype, (
            f"{key}: .metadata records {recorded.properties.dtype}, saved as {dtype}"
        )
    for index, stored in metadata.storage_data.items():
        with open(where / stored.relative_path, "rb") as data:
            data.seek(stored.offset)
            chunk = torch.load(io.BytesIO(data.read(stored.length)), weights_only=True)
        assert chunk.dtype == dtype, f"{index.fqn} at {index.offset}: stored as {chunk.dtype}"
        sizes = _chunk_sizes(metadata, index)
        assert chunk.shape == sizes, f"{index.fqn} at {index.offset}: stored {chunk.shape}"
        held = chunk.untyped_storage().nbytes()
        assert held == chunk.numel() * chunk.element_size(), (
            f"{index.fqn} at {index.offset}: a chunk of {chunk.numel()} {dtype} elements is "
            f"stored with a storage of {held} bytes"
        )


def _chunk_sizes(metadata: Any, index: Any) -> torch.Size:
    chunks = metadata.state_dict_metadata[index.fqn].chunks
    return next(chunk.sizes for chunk in chunks if chunk.offsets == index.offset)


def _safetensors_round_trip(
    world: Any, state: dict[str, Any], dtype: torch.dtype, where: Path
) -> None:
    pytest.importorskip("safetensors")
    writer_class = with_parameters(
        dcp.HuggingFaceStorageWriter, "save_distributed", "enable_consolidation"
    )
    writer = writer_class(str(where), save_distributed=True, enable_consolidation=True)
    dcp.save(state, storage_writer=writer)
    if world.rank == 0:
        _assert_header_holds_each_tensor_in_its_dtype(where / HF_FILE, dtype)
    template = {key: torch.zeros_like(value) for key, value in state.items()}
    dcp.load(template, storage_reader=dcp.HuggingFaceStorageReader(str(where)))
    _assert_bitwise(world.rank, template, state)


def _assert_header_holds_each_tensor_in_its_dtype(file: Path, dtype: torch.dtype) -> None:
    """Every tensor of the file is named in ``dtype`` and spans its elements' bytes."""
    with open(file, "rb") as data:
        header = json.loads(data.read(int.from_bytes(data.read(8), "little")))
    named = SAFETENSORS_DTYPES[dtype]
    itemsize = torch.empty((), dtype=dtype).element_size()
    for key, entry in header.items():
        if key == "__metadata__":
            continue
        assert entry["dtype"] == named, f"{file.name}, {key}: dtype {entry['dtype']}, not {named}"
        begin, end = entry["data_offsets"]
        size = math.prod(entry["shape"]) * itemsize
        assert end - begin == size, f"{file.name}, {key}: {end - begin} bytes, not {size}"


def _torch_save_round_trip(world: Any, state: dict[str, Any], where: Path) -> None:
    file = Path(f"{where}.rank{world.rank}.pt")
    torch.save(state, file)
    loaded = torch.load(file, weights_only=True)
    _assert_bitwise(world.rank, loaded, state)
    for key, value in state.items():
        held, saved = (local_part(v).untyped_storage().nbytes() for v in (loaded[key], value))
        assert held == saved, (
            f"rank {world.rank}, {key}: read back with a storage of {held} bytes, saved with "
            f"one of {saved}"
        )
