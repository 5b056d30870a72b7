"""Which world sizes a check runs a cell at, and how closely cells' values are compared.

The world marker's ``applies`` takes these (``@pytest.mark.world(2, 4,
applies=exists_at_size("cell"))``): ids of a cell at a size it lacks are not collected.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from conformance.cells._descriptor import Parallelism
from conformance.cells._parallelisms import PARALLELISMS

Applies = Callable[..., bool]  # the world marker's ``applies(size, **params)``


def exists_at_size(param: str = "name") -> Applies:
    """``applies`` for the world marker: the cell named by the parametrize argument ``param``
    runs at the world size. Ids of cells that do not are not collected."""

    def applies(size: int, **params: Any) -> bool:
        return PARALLELISMS[params[param]].supports(size)

    return applies


def whole_model_at_size(param: str = "name") -> Applies:
    """``applies`` for the world marker: the cell runs at the world size and every rank holds
    the whole model there (a partial cell is whole at one rank only): for checks of a
    submodule every rank must have."""

    def applies(size: int, **params: Any) -> bool:
        cell = PARALLELISMS[params[param]]
        return cell.supports(size) and not (cell.partial and size > 1)

    return applies


def first_size_only(param: str = "name", every_size_if: dict[str, Any] | None = None) -> Applies:
    """``applies`` for the world marker: only the cell's ``first_size``, or every size it has
    where the parameters match ``every_size_if`` (e.g. ``{"recipe": "adam"}``)."""

    def applies(size: int, **params: Any) -> bool:
        cell = PARALLELISMS[params[param]]
        everywhere = every_size_if is not None and all(
            params[key] == value for key, value in every_size_if.items()
        )
        return cell.supports(size) and (everywhere or size == cell.first_size)

    return applies


def first_size_and_four(param: str = "name") -> Applies:
    """``applies`` for the world marker: the cell's ``first_size``, and 4 ranks where it
    runs there."""

    def applies(size: int, **params: Any) -> bool:
        cell = PARALLELISMS[params[param]]
        return cell.supports(size) and size in (cell.first_size, 4)

    return applies


def flattened_between(*names: str) -> bool | None:
    """The optimizer state's form for a checkpoint that passes between the cells ``names``
    (``conformance._dcp.training_state``): flattened where one is partial (a pipeline, experts),
    so that both sides read and write the form parts need; else each model's own (None)."""
    return True if any(PARALLELISMS[n].partial for n in names if n in PARALLELISMS) else None


TP_TOLERANCE = {"rtol": 1e-5, "atol": 1e-7}


def comparison_tolerance(*cells: Parallelism) -> dict[str, float]:
    """Exact when every cell is; else TP's tolerances (see test_full_state_dict's docstring)."""
    return {} if all(cell.exact for cell in cells) else TP_TOLERANCE
