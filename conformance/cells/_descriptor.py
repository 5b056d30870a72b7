"""A cell's descriptor: everything the suite knows about one parallelism, in one place.

Check modules, the golden writer and reader and the gate's tier derive every list of cells
from these fields; none names a cell it could read off a descriptor.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal, get_args

from torch import nn

from conformance._upstream import fully_shard_on
from conformance.cells._precision import Precision

Wrap = Callable[[nn.Module, Any], nn.Module]
DEFAULT_MODEL = "mlp"  # the zoo's model (conformance/models/zoo.py) that every cell trains
SINGLE = "single"  # a partner that is one process without a parallelism

# The families of cells: the gate's tier keeps a test of each contract in each family.
Family = Literal["ddp", "fsdp1", "fsdp2", "tp", "2-D", "pp", "ep"]
# The checks that take one cell of a kind, not every cell:
#   golden:  writes and reads the golden DCP checkpoints of every release (one per family);
#   staging: its tensors are a kind that async staging copies (plain tensors, DTensors on 1-D
#            and 2-D meshes, FSDP1's flat and hybrid ShardedTensors);
#   zoo:     trains every model of the zoo (conformance/checks/test_model_matrix.py);
#   precision: trains under its mixed-precision policy (conformance/checks/test_mixed_precision.py):
#            a strategy, layout or mesh of each family whose wrapper takes one (``wrap_in``).
Role = Literal["golden", "staging", "zoo", "precision"]
# The checks that load what a cell saved into another cell (``Partner.checks``):
#   dcp, resume, async, zoo: saved at 4 ranks, loaded at ``size`` ranks, by test_dcp_round_trips,
#            test_resuming_commutes_with_training, test_async_saves and test_model_matrix;
#   dcp_grow, async_grow: saved at 2 ranks, loaded at 4 (``size``), by the first and third;
#   fsdp1:   FSDP1's own state dicts into another FSDP1 wrapping (test_fsdp1_reshard_loads),
#            at the sizes that check runs.
Reshard = Literal["dcp", "resume", "async", "zoo", "dcp_grow", "async_grow", "fsdp1"]


@dataclass(frozen=True)
class Partner:
    """A cell (or ``single``) that loads what this cell saved, at ``size`` ranks, in ``checks``."""

    loaded_by: str
    size: int | None
    checks: tuple[Reshard, ...]

    def __post_init__(self) -> None:
        unknown = set(self.checks) - set(get_args(Reshard))
        if unknown or not self.checks:
            raise ValueError(f"partner {self.loaded_by}: checks {self.checks} not of {Reshard}")


@dataclass(frozen=True)
class MemoryModel:
    """How the peak-memory checks bound the cell (``conformance/checks/test_peak_memory.py``).

    ``full_loads``: ``set_*_state_dict`` from full state dicts is measured (upstream loads none
    into FSDP1 + TP, pytorch/pytorch#135763); ``unconvertible``: FSDP1 optimizer configs its
    conversions cannot finish (each a known divergence), left out of the conversion bounds.
    """

    full_loads: bool = True
    unconvertible: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Parallelism:
    """A named way to parallelise the model; ``sizes`` are the world sizes it runs at.

    ``exact``: its full state dicts equal the single-process ones bit for bit (data
    parallelism averages identical gradients); tensor parallelism sums partial products in
    another order, so it is compared within tolerances. ``memory``: None where the memory
    checks measure another cell that holds the same tensors (a nested wrapping, a flat one).
    """

    name: str
    wrap: Wrap
    sizes: tuple[int, ...]
    family: Family
    exact: bool = True
    fsdp1: bool = False
    flat_params: bool = False  # FSDP1 without use_orig_params: one flat parameter per wrap
    nested: bool = False  # the model's units are wrapped on their own, inside the root
    fsdp1_mesh: bool = False  # FSDP1 given a device mesh, which refuses LOCAL_STATE_DICT
    # FSDP1 given a device mesh: the same wrapping given process groups instead, whose sharded
    # state dicts hold ShardedTensors where the cell's hold DTensors
    # (conformance/checks/test_fsdp1_dtensor_state.py compares the two).
    on_process_groups: Wrap | None = None
    fsdp2: bool = False  # built with fully_shard, which some releases cannot run on CPU
    # Each rank holds a part of the model alone at more than one rank: a pipeline stage's
    # layers, its experts (conformance/compare/_held.py).
    partial: bool = False
    model_id: str = DEFAULT_MODEL  # the zoo's model the cell trains
    # The oracle models the cell's state dicts; tests that compare with the oracle (their
    # names say so) skip a cell it does not, naming it (conformance/conftest.py).
    oracle_models: bool = True
    builds_on_meta: bool = True  # wraps a model made on the meta device
    roles: frozenset[Role] = frozenset()
    partners: tuple[Partner, ...] = ()
    memory: MemoryModel | None = field(default_factory=MemoryModel)
    # How the cell wraps under a mixed-precision policy (FSDP's own); None where it has none.
    wrap_in: Callable[[Precision], Wrap] | None = None

    def __post_init__(self) -> None:
        if not self.sizes or any(size < 1 for size in self.sizes):
            raise ValueError(f"{self.name}: world sizes must be positive, got {self.sizes}")
        if self.family not in get_args(Family):
            raise ValueError(f"{self.name}: family {self.family!r} is not one of {Family}")
        if unknown := set(self.roles) - set(get_args(Role)):
            raise ValueError(f"{self.name}: roles {sorted(unknown)} are not of {Role}")
        if self.on_process_groups is not None and not self.fsdp1_mesh:
            raise ValueError(f"{self.name}: on_process_groups is for FSDP1 given a device mesh")
        if "precision" in self.roles and self.wrap_in is None:
            raise ValueError(f"{self.name}: the precision role needs a policy (wrap_in)")

    def in_precision(self, precision: Precision) -> Parallelism:
        """This cell computing in ``precision``: a cell of its own, in no role and with no
        partners, whose state the mixed-precision checks judge."""
        if self.wrap_in is None:
            raise ValueError(f"{self.name} has no mixed-precision policy")
        return replace(
            self,
            name=f"{self.name}-{precision.name}",
            wrap=self.wrap_in(precision),
            exact=False,
            roles=frozenset(),
            partners=(),
            memory=None,
            wrap_in=None,
            on_process_groups=None,
        )

    def parallelise(self, model: nn.Module, world: Any) -> nn.Module:
        """``model`` moved to the rank's device (a CUDA device under NCCL), then wrapped."""
        return self.wrap(model.to(world.device), world)

    def supports(self, world_size: int) -> bool:
        return world_size in self.sizes

    @property
    def first_size(self) -> int:
        """The smallest world size above one rank at which the cell runs: where tests that
        need not run at every size cover it."""
        return min(size for size in self.sizes if size >= 2)

    def skip_unless_runnable(self, device: Any) -> None:
        """Skip, naming why, where this release cannot build the cell on ``device``. Tests
        that build a cell on some ranks only call it on every rank first: a skip on some
        ranks would leave the others waiting in a collective."""
        if self.fsdp2:
            fully_shard_on(device)

    def require(self, world_size: int) -> None:
        """Refuse a world size the cell lacks: the test's ``applies`` should have left it out."""
        if not self.supports(world_size):
            raise ValueError(
                f"{self.name} runs at world sizes {self.sizes}, not {world_size}: give the "
                "test's world marker applies=exists_at_size(...) or first_size_only(...)"
            )
