"""Comparison of state dicts that names the key path and the differing values."""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Mapping
from typing import Any

import torch

from conformance._upstream import dtensor, sharded_tensor


def assert_state_dict_equal(
    actual: Mapping[str, Any], expected: Mapping[str, Any], *, atol: float = 0.0, rtol: float = 0.0
) -> None:
    """Assert same keys and, key by key, the same values (exact unless tolerances are given)."""
    missing = sorted(set(expected) - set(actual))
    unexpected = sorted(set(actual) - set(expected))
    if missing or unexpected:
        raise AssertionError(f"keys differ: missing {missing}, unexpected {unexpected}")
    for key in expected:
        _assert_value_equal(actual[key], expected[key], key, atol=atol, rtol=rtol)


def _assert_value_equal(actual: Any, expected: Any, path: str, *, atol: float, rtol: float) -> None:
    if isinstance(expected, Mapping):
        if not isinstance(actual, Mapping):
            raise AssertionError(f"{path}: expected a mapping, got {type(actual).__name__}")
        nested_keys = sorted(set(actual) | set(expected), key=str)
        for key in nested_keys:
            if key not in actual or key not in expected:
                side = "missing" if key not in actual else "unexpected"
                raise AssertionError(f"{path}.{key}: {side} key")
            _assert_value_equal(actual[key], expected[key], f"{path}.{key}", atol=atol, rtol=rtol)
    elif isinstance(expected, torch.Tensor):
        _assert_tensor_equal(actual, expected, path, atol=atol, rtol=rtol)
    elif actual != expected:
        raise AssertionError(f"{path}: {actual!r} != {expected!r}")


def _assert_tensor_equal(
    actual: Any, expected: torch.Tensor, path: str, *, atol: float, rtol: float
) -> None:
    if not isinstance(actual, torch.Tensor) or type(actual) is not torch.Tensor:
        raise AssertionError(f"{path}: expected a plain torch.Tensor, got {type(actual).__name__}")
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        raise AssertionError(
            f"{path}: {actual.dtype}{list(actual.shape)} != {expected.dtype}{list(expected.shape)}"
        )
    actual, expected = actual.detach().cpu(), expected.detach().cpu()
    close = torch.isclose(actual, expected, atol=atol, rtol=rtol, equal_nan=True)
    if not bool(close.all()):
        diff = (actual.double() - expected.double()).abs().max().item()
        note = f" (max abs diff {diff:.3g}, atol={atol}, rtol={rtol})"
        _raise_first_difference(close, actual, expected, path, ("got", "expected"), note)


def assert_no_state_tensors_overlap(state: Mapping[str, Mapping[str, Any]]) -> None:
    """Assert no two tensors of an optimizer's ``state`` share memory on this rank.

    An optimizer that loads the entries updates each in place: a ``step`` shared by
    two parameters would count every step twice. (Disjoint views of one buffer are fine.)
    """
    seen: dict[int, list[tuple[int, int, str]]] = {}
    for key, entry in state.items():
        for name, value in entry.items():
            for tensor in _local_tensors(value):
                storage, first, last = _byte_span(tensor)
                for other_first, other_last, owner in seen.get(storage, []):
                    if first < other_last and other_first < last:
                        raise AssertionError(f"{key}.{name} shares memory with {owner}")
                seen.setdefault(storage, []).append((first, last, f"{key}.{name}"))


def local_tensors_by_path(tree: Any) -> list[tuple[str, torch.Tensor]]:
    """Each tensor ``tree`` holds on this rank (a DTensor's local tensor, a ShardedTensor's
    local shards), by key path."""
    found = []
    for path, value in _leaves(tree):
        tensors = _local_tensors(value)
        for index, tensor in enumerate(tensors):
            found.append((path if len(tensors) == 1 else f"{path}<shard {index}>", tensor))
    return found


def local_copy(tree: Any) -> dict[str, Any]:
    """Every leaf of ``tree`` by key path, each tensor as a copy of this rank's pieces: what a
    load may change, kept to compare after it."""
    copied = {path: v for path, v in _leaves(tree) if not isinstance(v, torch.Tensor)}
    copied.update((path, t.detach().clone()) for path, t in local_tensors_by_path(tree))
    return copied


def memory_shared_with(tree: Any, other: Any) -> list[str]:
    """The key paths of ``tree`` whose tensors (local pieces on this rank) share memory with a
    tensor of ``other``: empty where ``tree`` lies in memory of its own."""
    spans: dict[int, list[tuple[int, int]]] = {}
    for _, tensor in local_tensors_by_path(other):
        storage, first, last = _byte_span(tensor)
        spans.setdefault(storage, []).append((first, last))
    found = []
    for path, tensor in local_tensors_by_path(tree):
        storage, first, last = _byte_span(tensor)
        if any(a < last and first < b for a, b in spans.get(storage, [])):
            found.append(path)
    return found


def _leaves(tree: Any, path: str = "") -> list[tuple[str, Any]]:
    if isinstance(tree, Mapping):
        return [leaf for key, value in tree.items() for leaf in _leaves(value, f"{path}.{key}")]
    if isinstance(tree, (list, tuple)):
        return [leaf for i, value in enumerate(tree) for leaf in _leaves(value, f"{path}[{i}]")]
    return [(path.lstrip("."), tree)]


def local_part(value: torch.Tensor) -> torch.Tensor:
    """A DTensor's local tensor on this rank; a plain tensor itself."""
    return value.to_local() if isinstance(value, dtensor.DTensor) else value


def _local_tensors(value: Any) -> list[torch.Tensor]:
    """The tensors a state value holds on this rank (none for non-tensors)."""
    if isinstance(value, sharded_tensor.ShardedTensor):
        return [shard.tensor for shard in value.local_shards()]
    if isinstance(value, dtensor.DTensor):
        return [value.to_local()]
    return [value] if isinstance(value, torch.Tensor) else []


def _byte_span(tensor: torch.Tensor) -> tuple[int, int, int]:
    """The storage a tensor views and the bytes ``[first, last)`` of it that it can reach."""
    reach = zip(tensor.shape, tensor.stride(), strict=True)
    elements = 1 + sum((size - 1) * stride for size, stride in reach) if tensor.numel() else 0
    first = tensor.storage_offset() * tensor.element_size()
    return tensor.untyped_storage().data_ptr(), first, first + elements * tensor.element_size()


def assert_trees_identical(torch_result: Any, oracle_result: Any, path: str = "<root>") -> None:
    """Assert the torch build's result and the oracle's are the same, leaf by leaf.

    Same container types (any two dicts alike) and keys in the same order;
    tensors of the same class, device, dtype, shape and values (NaN equals
    NaN); ShardedTensors with the same metadata and local shards; DTensors
    with the same mesh, placements, global shape and stride and identical local tensors; BytesIO
    with the same bytes; dataclasses field by field; other leaves equal and of
    the same type.
    """
    same_kind = type(torch_result) is type(oracle_result) or (
        isinstance(torch_result, dict) and isinstance(oracle_result, dict)
    )
    if not same_kind:
        raise AssertionError(
            f"{path}: torch gave {type(torch_result).__name__}, "
            f"the oracle {type(oracle_result).__name__}"
        )
    if isinstance(oracle_result, dict):
        if list(torch_result) != list(oracle_result):
            raise AssertionError(
                f"{path}: keys {list(torch_result)} != oracle's {list(oracle_result)}"
            )
        for key in oracle_result:
            assert_trees_identical(torch_result[key], oracle_result[key], f"{path}.{key}")
    elif isinstance(oracle_result, (list, tuple)):
        if len(torch_result) != len(oracle_result):
            raise AssertionError(
                f"{path}: length {len(torch_result)} != oracle's {len(oracle_result)}"
            )
        for index, (a, b) in enumerate(zip(torch_result, oracle_result, strict=True)):
            assert_trees_identical(a, b, f"{path}[{index}]")
    elif isinstance(oracle_result, sharded_tensor.ShardedTensor):
        _assert_same_sharded_tensor(torch_result, oracle_result, path)
    elif isinstance(oracle_result, dtensor.DTensor):
        if torch_result.device_mesh != oracle_result.device_mesh:
            raise AssertionError(f"{path}: meshes differ")
        if tuple(torch_result.placements) != tuple(oracle_result.placements):
            raise AssertionError(
                f"{path}: placements {torch_result.placements} "
                f"!= oracle's {oracle_result.placements}"
            )
        if torch_result.shape != oracle_result.shape:
            raise AssertionError(
                f"{path}: global shape {torch_result.shape} != oracle's {oracle_result.shape}"
            )
        if torch_result.stride() != oracle_result.stride():
            raise AssertionError(
                f"{path}: global stride {torch_result.stride()} "
                f"!= oracle's {oracle_result.stride()}"
            )
        assert_trees_identical(torch_result.to_local(), oracle_result.to_local(), f"{path}<local>")
    elif isinstance(oracle_result, torch.Tensor):
        _assert_same_tensor(torch_result, oracle_result, path)
    elif isinstance(oracle_result, io.BytesIO):
        if torch_result.getvalue() != oracle_result.getvalue():
            raise AssertionError(f"{path}: BytesIO contents differ")
    elif dataclasses.is_dataclass(oracle_result):
        for field in dataclasses.fields(oracle_result):
            assert_trees_identical(
                getattr(torch_result, field.name),
                getattr(oracle_result, field.name),
                f"{path}.{field.name}",
            )
    elif torch_result != oracle_result:
        raise AssertionError(f"{path}: torch gave {torch_result!r}, the oracle {oracle_result!r}")


def _assert_same_sharded_tensor(
    torch_result: sharded_tensor.ShardedTensor,
    oracle_result: sharded_tensor.ShardedTensor,
    path: str,
) -> None:
    """By metadata and local shards: comparing ShardedTensors as tensors needs an accelerator."""
    if torch_result.metadata() != oracle_result.metadata():
        raise AssertionError(
            f"{path}: ShardedTensor metadata {torch_result.metadata()} "
            f"!= oracle's {oracle_result.metadata()}"
        )
    mine, theirs = torch_result.local_shards(), oracle_result.local_shards()
    if [s.metadata for s in mine] != [s.metadata for s in theirs]:
        raise AssertionError(f"{path}: local shards' metadata differ")
    for index, (a, b) in enumerate(zip(mine, theirs, strict=True)):
        _assert_same_tensor(a.tensor, b.tensor, f"{path}<shard {index}>")


def _assert_same_tensor(torch_result: torch.Tensor, oracle_result: torch.Tensor, path: str) -> None:
    for what in ("device", "dtype", "shape"):
        mine, theirs = getattr(torch_result, what), getattr(oracle_result, what)
        if mine != theirs:
            raise AssertionError(f"{path}: {what} {mine} != oracle's {theirs}")
    a, b = torch_result.detach().cpu(), oracle_result.detach().cpu()
    same = (a == b) | (a.isnan() & b.isnan()) if a.is_floating_point() else a == b
    if not bool(same.all()):
        _raise_first_difference(same, a, b, path, ("torch", "oracle"))


def _raise_first_difference(
    same: torch.Tensor,
    left: torch.Tensor,
    right: torch.Tensor,
    path: str,
    labels: tuple[str, str],
    note: str = "",
) -> None:
    """Fail with how many values differ and the first differing pair, by index."""
    index = tuple(int(i) for i in (~same).nonzero()[0])
    raise AssertionError(
        f"{path}: {int((~same).sum())} of {left.numel()} values differ{note}; first at index "
        f"{index}: {labels[0]} {left[index].item()!r}, {labels[1]} {right[index].item()!r}"
    )
