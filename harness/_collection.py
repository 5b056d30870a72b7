"""Which world test ids a session runs, and in what order: the marker's sizes, the sizes
asked for, the cells that do not exist at a size (left out, not skipped)."""

from __future__ import annotations

import pytest

from harness._items import MARKER, item_size
from harness.session import NOT_APPLICABLE


def marked_sizes(marker: pytest.Mark) -> tuple[int, ...]:
    """The world sizes a ``world`` marker names; UsageError unless positive integers."""
    sizes = tuple(marker.args)
    if not sizes or not all(isinstance(s, int) and s >= 1 for s in sizes):
        raise pytest.UsageError(f"@pytest.mark.world needs positive integer sizes, got {sizes}")
    return sizes


def _applies(item: pytest.Item) -> bool:
    """Whether the world marker's ``applies`` (if any) keeps this size and these parameters."""
    marker = item.get_closest_marker(MARKER)
    applies = marker.kwargs.get("applies") if marker else None
    if applies is None:
        return True
    params = dict(item.callspec.params)  # type: ignore[attr-defined]
    return bool(applies(params.pop("world"), **params))


def _leave_out_what_does_not_apply(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Drop the ids whose cell does not exist at their world size: not collected, and
    counted apart (``NOT_APPLICABLE``), never reported as skips."""
    left_out = [item for item in items if item_size(item) is not None and not _applies(item)]
    config.stash[NOT_APPLICABLE] = [(item.nodeid, item_size(item) or 0) for item in left_out]
    if left_out:
        dropped = set(map(id, left_out))
        items[:] = [item for item in items if id(item) not in dropped]
        config.hook.pytest_deselected(items=left_out)


def select_and_order(
    config: pytest.Config, items: list[pytest.Item], wanted: set[int] | None
) -> None:
    """Keep the ids of the sizes ``wanted`` (all where None) whose cell exists there, plain
    tests first, then world tests grouped by size: one spawn per world."""
    keep: list[pytest.Item] = []
    drop: list[pytest.Item] = []
    for item in items:
        size = item_size(item)
        (drop if size is not None and wanted is not None and size not in wanted else keep).append(
            item
        )
    if drop:
        config.hook.pytest_deselected(items=drop)
    _leave_out_what_does_not_apply(config, keep)
    keep.sort(key=lambda item: item_size(item) or 0)
    items[:] = keep
