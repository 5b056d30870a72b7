"""The cells of the matrix, each declared by its descriptor (``_descriptor.py``).

Adding a cell is adding its descriptor here (and a model in ``conformance/models/`` if it
needs one): the check modules, the golden writer and reader and the gate's tier take their
cells from these fields. ``register`` adds one from outside (a plugin loaded before the
check modules are imported, as ``tests/test_cells.py`` does).
"""

from __future__ import annotations

from functools import partial

from conformance.cells._descriptor import MemoryModel, Parallelism, Partner, Reshard, Role
from conformance.cells._experts import split_experts
from conformance.cells._pipeline import split_into_stages
from conformance.cells._wrappers import (
    wrap_ddp,
    wrap_fsdp1,
    wrap_fsdp1_tp,
    wrap_fsdp2,
    wrap_fsdp2_tp,
    wrap_hsdp2_tp,
    wrap_replicate,
    wrap_tp,
)

_FOUR_TO = "dcp", "resume", "async"  # saved at 4 ranks, loaded by every such check


def _declared() -> list[Parallelism]:
    return [
        Parallelism(
            "ddp",
            wrap_ddp,
            (1, 2, 4),
            family="ddp",
            builds_on_meta=False,  # DDP broadcasts its parameters' values as it wraps
            roles=frozenset({"golden", "staging", "zoo"}),
            partners=(
                Partner("fsdp2", 2, ("dcp",)),
                Partner("fsdp2_tp", 4, ("resume", "async")),
            ),
        ),
        Parallelism("replicate", wrap_replicate, (1, 2, 4), family="ddp"),
        Parallelism(
            "pp",
            split_into_stages,
            (1, 2, 4),
            family="pp",
            partial=True,
            roles=frozenset({"golden"}),
            partners=(
                Partner("single", 1, ("resume",)),  # two stages of two ranks, into one process
                Partner("fsdp2", 2, ("resume",)),
                Partner("pp", 2, ("resume",)),
            ),
        ),
        Parallelism(
            "ep",
            split_experts,
            (1, 2, 4),
            family="ep",
            fsdp2=True,
            partial=True,
            model_id="moe",
            roles=frozenset({"golden"}),
            partners=(
                Partner("single", 1, ("resume",)),  # two ranks of each expert, into one process
                Partner("fsdp2", 2, ("resume",)),
                Partner("ep", 2, ("resume",)),
            ),
        ),
        Parallelism(
            "fsdp2",
            wrap_fsdp2(reshard_after_forward=True),
            (1, 2, 4),
            family="fsdp2",
            fsdp2=True,
            roles=frozenset({"golden", "staging", "zoo", "precision"}),
            wrap_in=lambda precision: wrap_fsdp2(True, precision=precision),
            partners=(
                Partner("fsdp2", 4, ("async",)),
                Partner("fsdp2", 2, _FOUR_TO),
                Partner("single", 1, (*_FOUR_TO, "zoo")),
                Partner("pp", 2, ("resume",)),  # into two stages of one rank
                Partner("ep", 2, ("resume",)),  # into one rank of each expert
                Partner("fsdp1_full_shard_orig_nested", 2, ("zoo",)),
                # saved at 2 ranks, loaded at 4
                Partner("fsdp2", 4, ("dcp_grow", "async_grow")),
                Partner("fsdp2_tp", 4, ("dcp_grow", "async_grow")),
                Partner("ddp", 4, ("dcp_grow", "async_grow")),
                Partner("fsdp1_full_shard_orig", 4, ("dcp_grow",)),
            ),
        ),
        Parallelism(
            "fsdp2_keep_unsharded",
            wrap_fsdp2(reshard_after_forward=False),
            (2, 4),
            family="fsdp2",
            fsdp2=True,
            roles=frozenset({"zoo", "precision"}),
            wrap_in=lambda precision: wrap_fsdp2(False, precision=precision),
        ),
        Parallelism(
            "hsdp2",
            wrap_fsdp2(True, hybrid=True),
            (4,),
            family="fsdp2",
            fsdp2=True,
            roles=frozenset({"zoo", "precision"}),
            wrap_in=lambda precision: wrap_fsdp2(True, hybrid=True, precision=precision),
            partners=(Partner("ddp", 2, ("zoo",)),),
        ),
        Parallelism(
            "tp",
            wrap_tp,
            (2, 4),
            family="tp",
            exact=False,
            roles=frozenset({"golden", "zoo"}),
            partners=(
                Partner("ddp", 2, ("dcp",)),
                Partner("fsdp1_full_shard_orig_nested", 2, ("resume", "async")),
            ),
        ),
        Parallelism(
            "fsdp2_tp",
            wrap_fsdp2_tp,
            (4,),
            family="2-D",
            exact=False,
            fsdp2=True,
            roles=frozenset({"golden", "staging", "zoo"}),
            partners=(
                Partner("tp", 2, _FOUR_TO),
                Partner("fsdp2", 2, ("dcp",)),
                Partner("ddp", 4, ("async",)),
            ),
        ),
        Parallelism(
            "hsdp2_tp",
            wrap_hsdp2_tp,
            (8,),  # two replicas of two shards of two tensor-parallel ranks
            family="2-D",
            exact=False,
            fsdp2=True,
            roles=frozenset({"zoo"}),
        ),
        Parallelism(
            "fsdp1_tp",
            wrap_fsdp1_tp,
            (4,),
            family="2-D",
            exact=False,
            fsdp1=True,
            fsdp1_mesh=True,
            oracle_models=False,
            memory=MemoryModel(
                full_loads=False, unconvertible=frozenset({"full_rank0_only", "to_load"})
            ),
        ),
        *_fsdp1_cells(),
    ]


# Each FSDP1 cell's partners in the checks that load into another cell.
_FSDP1_PARTNERS: dict[str, tuple[Partner, ...]] = {
    "fsdp1_full_shard_orig": (Partner("fsdp2", 2, _FOUR_TO), Partner("tp", 4, ("resume",))),
    "fsdp1_full_shard_flat": (
        Partner("fsdp2", 2, ("dcp",)),
        Partner("single", 1, ("dcp",)),
        Partner("ddp", 4, ("resume",)),
        Partner("fsdp1_full_shard_flat_nested", None, ("fsdp1",)),
        Partner("fsdp1_shard_grad_op_orig", None, ("fsdp1",)),
    ),
    "fsdp1_full_shard_orig_nested": (Partner("fsdp1_full_shard_orig", None, ("fsdp1",)),),
    "fsdp1_hybrid_shard_orig_nested": (
        Partner("fsdp1_shard_grad_op_flat", 2, ("resume",)),
        Partner("fsdp1_mesh_full_shard_flat", 4, ("resume",)),  # 2-way DTensor shards to 4-way
    ),
    "fsdp1_shard_grad_op_orig_nested": (Partner("fsdp1_full_shard_flat", None, ("fsdp1",)),),
    "fsdp1_no_shard_flat": (Partner("fsdp1_full_shard_orig_nested", None, ("fsdp1",)),),
    "fsdp1_hybrid_shard_orig": (Partner("fsdp1_full_shard_flat_nested", None, ("fsdp1",)),),
}
# Mixed precision runs under every strategy, once with original parameters wrapped whole and
# once with flat parameters wrapped per unit.
_FSDP1_ROLES: dict[str, frozenset[Role]] = {
    "fsdp1_full_shard_orig": frozenset({"golden", "precision"}),
    "fsdp1_full_shard_flat": frozenset({"staging"}),
    "fsdp1_hybrid_shard_orig": frozenset({"staging", "precision"}),
    "fsdp1_full_shard_orig_nested": frozenset({"zoo"}),
    "fsdp1_full_shard_flat_nested": frozenset({"zoo", "precision"}),
    "fsdp1_shard_grad_op_flat": frozenset({"zoo"}),
    "fsdp1_hybrid_shard_orig_nested": frozenset({"zoo"}),
    "fsdp1_shard_grad_op_orig": frozenset({"precision"}),
    "fsdp1_shard_grad_op_flat_nested": frozenset({"precision"}),
    "fsdp1_no_shard_orig": frozenset({"precision"}),
    "fsdp1_no_shard_flat_nested": frozenset({"precision"}),
    "fsdp1_hybrid_shard_flat_nested": frozenset({"precision"}),
}


def _fsdp1_cells() -> list[Parallelism]:
    """FSDP1 under each sharding strategy, with original or flat parameters, wrapped whole or
    nested, and FULL_SHARD given a 1-D device mesh. The memory checks measure the original
    parameters, and flat ones once (its optimizer state is one flat tensor per rank); nested
    wrappings hold the same tensors."""
    cells = []
    for strategy in ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD"):
        for orig in (True, False):
            for nested in (False, True):
                name = f"fsdp1_{strategy.lower()}_{'orig' if orig else 'flat'}"
                name += "_nested" if nested else ""
                measured = not nested and (orig or name == "fsdp1_full_shard_flat")
                hybrid = strategy == "HYBRID_SHARD"
                cells.append(
                    Parallelism(
                        name,
                        wrap_fsdp1(strategy, orig, nested),
                        (4,) if hybrid else (2, 4),
                        family="fsdp1",
                        fsdp1=True,
                        flat_params=not orig,
                        nested=nested,
                        fsdp1_mesh=hybrid,
                        roles=_FSDP1_ROLES.get(name, frozenset()),
                        partners=_FSDP1_PARTNERS.get(name, ()),
                        memory=MemoryModel() if measured else None,
                        wrap_in=partial(wrap_fsdp1, strategy, orig, nested),
                        on_process_groups=(
                            wrap_fsdp1(strategy, orig, nested, groups="process_groups")
                            if hybrid and not nested
                            else None
                        ),
                    )
                )
    cells.append(
        Parallelism(
            "fsdp1_mesh_full_shard_flat",  # as upstream's DTensor tests wrap: FSDP1's defaults
            wrap_fsdp1("FULL_SHARD", False, False, groups="mesh"),
            (4,),  # four shards: some tensors' last shards are empty
            family="fsdp1",
            fsdp1=True,
            flat_params=True,
            fsdp1_mesh=True,
            memory=None,  # fsdp1_full_shard_flat holds the same tensors
            on_process_groups=wrap_fsdp1("FULL_SHARD", False, False, groups="process_groups"),
        )
    )
    return cells


PARALLELISMS: dict[str, Parallelism] = {cell.name: cell for cell in _declared()}


def register(cell: Parallelism) -> None:
    """Add ``cell`` to the matrix; refuse a name already taken. Check modules read the cells
    as they are imported: register before they are."""
    if cell.name in PARALLELISMS:
        raise ValueError(f"a cell named {cell.name!r} exists already")
    PARALLELISMS[cell.name] = cell


def with_role(role: Role) -> tuple[str, ...]:
    """The cells that take ``role``, in the order they are declared."""
    return tuple(name for name, cell in PARALLELISMS.items() if role in cell.roles)


def reshards(check: Reshard) -> list[tuple[str, str, int | None]]:
    """``(saved by, loaded by, size)`` of every partner that ``check`` tries."""
    return [
        (name, partner.loaded_by, partner.size)
        for name, cell in PARALLELISMS.items()
        for partner in cell.partners
        if check in partner.checks
    ]


def loaders_of(saved_by: str, check: Reshard) -> list[str]:
    """The cells that ``check`` loads into from what ``saved_by`` saved."""
    return [
        partner.loaded_by for partner in PARALLELISMS[saved_by].partners if check in partner.checks
    ]


def memory_measured() -> list[str]:
    """The cells the peak-memory checks measure (those with a memory model)."""
    return [name for name, cell in PARALLELISMS.items() if cell.memory is not None]


def families() -> dict[str, str]:
    """Each cell's family, by name."""
    return {name: cell.family for name, cell in PARALLELISMS.items()}
