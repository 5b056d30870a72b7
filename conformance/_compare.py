"""Comparison of state dicts that names the key path and the differing values."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch


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
        index = tuple(int(i) for i in (~close).nonzero()[0])
        diff = (actual.double() - expected.double()).abs().max().item()
        raise AssertionError(
            f"{path}: {int((~close).sum())} of {actual.numel()} values differ "
            f"(max abs diff {diff:.3g}, atol={atol}, rtol={rtol}); first at index {index}: "
            f"{actual[index].item()!r} != {expected[index].item()!r}"
        )
