"""An fp8 checkpoint published with block scales loads, dequantized, into every cell through
``QuantizedHuggingFaceStorageReader``.

Models are published in fp8 as DeepSeek-V3's are: each 2-D ``.weight`` in
``float8_e4m3fn``, cut into ``BLOCK`` by ``BLOCK`` blocks, with a ``.weight_scale_inv`` of one
fp32 scale per block (the block's largest magnitude over fp8's largest value), beside the
other tensors as they are. Rank 0 writes the cell's initial model state so, with
``safetensors.torch.save_file``, the scales in the weights' file (``beside``) or in a file of
their own (``apart``), and the ``model.safetensors.index.json`` that maps each key to its
file. Every rank then loads it through ``QuantizedHuggingFaceStorageReader(block_size=BLOCK,
target_dtype=...)`` into its own (sharded) state dict, as a fine-tune of a published model
starts.

The reader's contract: each weight element is its fp8 value times its block's scale, computed
in fp32 and given in ``target_dtype``; the other tensors are read as written. The model must
then hold exactly that, each rank its part. ``BLOCK`` divides no weight's sizes, and no
sharding cuts along block edges, so every rank's part meets partial blocks. Every golden cell
at its first size; ``target_dtype`` fp32 and bf16. A build skips, naming what it lacks, where
it has no such reader or no ``safetensors`` package.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch

from conformance._upstream import dcp, dsd, full_options
from conformance.cells import PARALLELISMS, first_size_only, with_role
from conformance.compare import assert_state_dict_equal, held_part
from conformance.models.optimizers import OPTIMIZERS
from conformance.models.zoo import truth_of
from conformance.training import fresh_training

BLOCK = 4
FP8 = torch.float8_e4m3fn
TARGETS = {"float32": torch.float32, "bfloat16": torch.bfloat16}
RECIPE = "adam"
FILE = "model.safetensors"
SCALES_FILES = {"beside": FILE, "apart": "scales.safetensors"}
INDEX = "model.safetensors.index.json"
SCALE = ".weight_scale_inv"


@pytest.mark.world(1, 2, 4, applies=first_size_only())
@pytest.mark.parametrize("scales", sorted(SCALES_FILES))
@pytest.mark.parametrize("target", sorted(TARGETS))
@pytest.mark.parametrize("name", with_role("golden"))
def test_a_published_fp8_checkpoint_loads_dequantized_into_the_cell(world, name, target, scales):
    parallelism = PARALLELISMS[name]
    parallelism.skip_unless_runnable(world.device)
    safetensors_torch = pytest.importorskip("safetensors.torch")
    reader_class = dcp.QuantizedHuggingFaceStorageReader  # a skip where the build lacks it
    initial = truth_of(parallelism, 0, OPTIMIZERS[RECIPE], torch.device("cpu")).model
    published = _quantized(initial)
    path = world.tmp_path / "published"
    if world.rank == 0:
        path.mkdir()
        weight_map = {
            key: SCALES_FILES[scales] if key.endswith(SCALE) else FILE for key in published
        }
        for file in set(weight_map.values()):
            held = {key: value for key, value in published.items() if weight_map[key] == file}
            safetensors_torch.save_file(held, str(path / file))
        (path / INDEX).write_text(json.dumps({"weight_map": weight_map}))
    world.barrier()
    model, _, _ = fresh_training(parallelism, world, RECIPE)
    state = dsd.get_model_state_dict(model)
    reader = reader_class(str(path), target_dtype=TARGETS[target], block_size=BLOCK)
    dcp.load(state, storage_reader=reader)
    dsd.set_model_state_dict(model, state)
    expected = _dequantized(published, TARGETS[target])
    loaded = dsd.get_model_state_dict(model, options=full_options())
    on_device = {key: value.to(world.device) for key, value in held_part(expected, model).items()}
    assert_state_dict_equal(loaded, on_device)


def _quantized(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` with each 2-D weight in fp8 beside its block scales."""
    published = {}
    for key, value in state.items():
        if not (key.endswith(".weight") and value.dim() == 2):
            published[key] = value.contiguous()
            continue
        scales = _block_amax(value) / torch.finfo(FP8).max
        published[key] = (value / _spread(scales, value.shape)).to(FP8)
        published[key.removesuffix(".weight") + SCALE] = scales
    return published


def _dequantized(published: dict[str, torch.Tensor], target: torch.dtype) -> dict[str, Any]:
    """The model state the reader's contract gives of ``published``, in the template's fp32."""
    expected = {}
    for key, value in published.items():
        if key.endswith(SCALE):
            continue
        scales = published.get(key.removesuffix(".weight") + SCALE)
        if scales is None:
            expected[key] = value
            continue
        exact = value.to(torch.float32) * _spread(scales, value.shape)
        expected[key] = exact.to(target).to(torch.float32)
    return expected


def _block_amax(value: torch.Tensor) -> torch.Tensor:
    """The largest magnitude in each ``BLOCK`` by ``BLOCK`` block of ``value`` (edge blocks
    partial: zeros pad them, which no magnitude is below)."""
    rows, cols = (-(-size // BLOCK) for size in value.shape)
    padded = value.abs().new_zeros(rows * BLOCK, cols * BLOCK)
    padded[: value.shape[0], : value.shape[1]] = value.abs()
    return padded.reshape(rows, BLOCK, cols, BLOCK).amax(dim=(1, 3)).float()


def _spread(scales: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """Each block's scale at every element of the block, over a tensor of ``shape``."""
    spread = scales.repeat_interleave(BLOCK, dim=0).repeat_interleave(BLOCK, dim=1)
    return spread[: shape[0], : shape[1]]
