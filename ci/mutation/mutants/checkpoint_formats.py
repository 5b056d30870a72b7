"""Mutants of DCP's other formats: conversions to and from ``torch.save`` files
(``torch/distributed/checkpoint/format_utils.py``), Hugging Face safetensors
(``hf_storage.py``) and fp8 ones published with block scales (``quantized_hf_storage.py``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ci.mutation.mutants._mutant import (
    FORMAT_UTILS,
    HF_STORAGE,
    QUANTIZED_HF_STORAGE,
    mutant_maker,
)

Fn = Callable[..., Any]
CONVERSIONS = "conformance/checks/test_format_conversions.py"
SAFETENSORS = "conformance/checks/test_safetensors.py"
QUANTIZED = "conformance/checks/test_quantized_checkpoints.py"


def _tensors_only(tree: Any) -> Any:
    """``tree`` with every leaf that is not a tensor left out, and containers left empty."""
    if isinstance(tree, torch.Tensor):
        return tree
    if isinstance(tree, dict):
        kept = {key: _tensors_only(value) for key, value in tree.items()}
        return {key: value for key, value in kept.items() if value is not None}
    if isinstance(tree, (list, tuple)):
        kept_items = [item for item in map(_tensors_only, tree) if item is not None]
        return kept_items or None
    return None


def _drops_non_tensor_state(original: Fn) -> Fn:
    def convert(dcp_checkpoint_dir: Any, torch_save_path: Any) -> None:
        original(dcp_checkpoint_dir, torch_save_path)
        state = torch.load(torch_save_path, weights_only=False)
        torch.save(_tensors_only(state), torch_save_path)

    return convert


class _Float32Resolver:
    """A save planner whose ``bfloat16`` tensors resolve as ``float32``."""

    def __init__(self, planner: Any) -> None:
        self._planner = planner

    def resolve_data(self, item: Any) -> Any:
        data = self._planner.resolve_data(item)
        if isinstance(data, torch.Tensor) and data.dtype == torch.bfloat16:
            return data.float()
        return data

    def __getattr__(self, name: str) -> Any:
        return getattr(self._planner, name)


def _writes_bfloat16_as_float32(original: Fn) -> Fn:
    def write_data(self: Any, plan: Any, planner: Any) -> Any:
        return original(self, plan, _Float32Resolver(planner))

    return write_data


def _blocks_counted_from_the_piece(original: Fn) -> Fn:
    def block_mapping(self: Any, request: Any) -> Any:
        rows, cols, row_slice, col_slice = original(self, request)
        row_shift, col_shift = (first * self.block_size for first in (rows[0], cols[0]))
        return (
            (0, rows[1] - rows[0]),  # the bug: the piece's first block taken as block 0
            (0, cols[1] - cols[0]),
            slice(row_slice.start - row_shift, row_slice.stop - row_shift),
            slice(col_slice.start - col_shift, col_slice.stop - col_shift),
        )

    return block_mapping


MUTANTS = [
    mutant_maker(FORMAT_UTILS, CONVERSIONS)(
        "dcp_to_torch_save_drops_non_tensor_state",
        "dcp_to_torch_save",
        "converting a DCP checkpoint to a torch.save file keeps its tensors and drops the "
        "rest (an optimizer's param groups and hyper-parameters)",
        _drops_non_tensor_state,
    ),
    mutant_maker(HF_STORAGE, SAFETENSORS)(
        "safetensors_written_in_float32",
        "HuggingFaceStorageWriter.write_data",
        "the safetensors writer stores a bfloat16 tensor as float32",
        _writes_bfloat16_as_float32,
    ),
    mutant_maker(QUANTIZED_HF_STORAGE, QUANTIZED)(
        "quantized_reader_scales_pieces_from_the_first_block",
        "QuantizedHuggingFaceStorageReader._get_slice_to_block_mapping",
        "the fp8 reader dequantizes a rank's piece of a weight with the scales of the blocks "
        "at the weight's start, not those of the blocks the piece lies in",
        _blocks_counted_from_the_piece,
    ),
]
