"""Walking the nested state dicts a mutant rewrites."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def map_leaves(tree: Any, change: Callable[[Any], Any]) -> Any:
    """``tree`` with every leaf (not a dict, list or tuple) replaced by ``change(leaf)``."""
    if isinstance(tree, dict):
        return {key: map_leaves(value, change) for key, value in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(map_leaves(value, change) for value in tree)
    return change(tree)


def tensor_paths(tree: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """The path of every tensor leaf, in traversal order."""
    if isinstance(tree, dict):
        return [p for key, value in tree.items() for p in tensor_paths(value, (*path, key))]
    if isinstance(tree, (list, tuple)):
        return [p for index, value in enumerate(tree) for p in tensor_paths(value, (*path, index))]
    return [path] if isinstance(tree, torch.Tensor) else []


def get_path(tree: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        tree = tree[key]
    return tree


def with_leaf(tree: Any, path: tuple[Any, ...], value: Any) -> Any:
    """``tree`` with the leaf at ``path`` replaced; tuples on the way are rebuilt."""
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(tree, dict):
        return {**tree, head: with_leaf(tree[head], rest, value)}
    items = list(tree)
    items[head] = with_leaf(items[head], rest, value)
    return type(tree)(items)


def rows_shifted(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``'s elements moved one place along its flattened order: an off-by-one offset."""
    return tensor.flatten().roll(1).view_as(tensor) if tensor.numel() > 1 else tensor
