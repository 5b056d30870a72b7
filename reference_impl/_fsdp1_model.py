"""An FSDP1 model as its state dicts see it: named state, flat parameters, applied types.

Shared by the get and load sides of ``fsdp_state_dict_utils``. FSDP1 applies
the requested state-dict type per FSDP module, except that a ``NO_SHARD``
module always saves and loads a FULL_STATE_DICT with the default config
(``_Request.applied``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import (
    FullStateDictConfig,
    FullyShardedDataParallel,
    LocalStateDictConfig,
    ShardedStateDictConfig,
    ShardingStrategy,
    StateDictConfig,
    StateDictType,
)

from reference_impl._flat_layout import FlatParamShard, Segment, flat_param_shards
from reference_impl._fqn import Entry, ModelNames, without_stripped_segments

FLAT_PARAM = "_flat_param"
FULL = StateDictType.FULL_STATE_DICT
SHARDED = StateDictType.SHARDED_STATE_DICT
LOCAL = StateDictType.LOCAL_STATE_DICT

_CONFIG_TYPES: dict[StateDictType, type[StateDictConfig]] = {
    FULL: FullStateDictConfig,
    SHARDED: ShardedStateDictConfig,
    LOCAL: LocalStateDictConfig,
}


@dataclass(frozen=True)
class Request:
    """A state-dict type with its config (the type's own config class)."""

    state_dict_type: StateDictType
    config: Any

    @classmethod
    def of(cls, state_dict_type: StateDictType, config: StateDictConfig | None) -> Request:
        expected = _CONFIG_TYPES[state_dict_type]
        if config is None:
            return cls(state_dict_type, expected())
        if type(config) is not expected:
            raise ValueError(
                f"{state_dict_type.name} takes a {expected.__name__}, got {type(config).__name__}"
            )
        return cls(state_dict_type, config)

    def applied(self, sharded: bool) -> Request:
        """What a module applies: NO_SHARD modules give FULL with the default config."""
        return self if sharded else Request(FULL, FullStateDictConfig())

    @property
    def rank0_only(self) -> bool:
        return self.state_dict_type == FULL and bool(self.config.rank0_only)


@dataclass(frozen=True)
class Original:
    """An original parameter FSDP1 manages: its flat parameter and place in it."""

    shard: FlatParamShard
    segment: Segment

    def local_slice(self) -> torch.Tensor:
        """Its flattened part in this rank's flat shard: a view, empty where it holds none."""
        held = self.shard.layout.slices(self.shard.shard_rank).get(self.segment.fqn)
        flat = self.shard.flat_param.detach()
        if held is None:
            return flat[:0]
        return flat[held.offset_in_shard : held.offset_in_shard + held.numel]


class Fsdp1Model:
    """What an FSDP1 model's state dict is made of, and the types its modules apply."""

    def __init__(self, model: nn.Module, request: Request) -> None:
        fsdp_modules = FullyShardedDataParallel.fsdp_modules(model)
        if not fsdp_modules:
            raise ValueError(f"{type(model).__name__} has no FullyShardedDataParallel module")
        names = ModelNames(model)
        self.entries = _in_state_dict_order(names)
        self.shards = flat_param_shards(model)
        self.originals = {
            shard.canonical(segment.fqn): Original(shard, segment)
            for shard in self.shards
            for segment in shard.layout.segments
        }
        for shard in self.shards:  # a tied weight is saved under each of its FQNs
            for sharer, holder in shard.shared.items():
                self.originals[sharer] = self.originals[holder]
        self.fsdp_buffers = {id(b) for m in fsdp_modules for b in m.buffers()}
        root = fsdp_modules[0]
        self.original_dtypes = _original_buffer_dtypes(fsdp_modules, names)
        self.first_use_dtypes = (
            _computation_buffer_dtypes(fsdp_modules, names) if root._is_root is None else {}
        )
        self.request = request
        self.buffer_request = request.applied(root.sharding_strategy != ShardingStrategy.NO_SHARD)
        self._refuse_local_with_a_mesh()

    def _refuse_local_with_a_mesh(self) -> None:
        for shard in self.shards:
            if self.request_of(shard).state_dict_type == LOCAL and shard.mesh is not None:
                raise RuntimeError(
                    f"LOCAL_STATE_DICT: the FSDP1 module at '{shard.prefix.rstrip('.')}' was "
                    "given a device mesh; use SHARDED_STATE_DICT for DTensors"
                )

    def request_of(self, shard: FlatParamShard) -> Request:
        return self.request.applied(shard.sharded)

    def original_of(self, entry: Entry) -> Original | None:
        return self.originals.get(entry.fqn)

    @staticmethod
    def is_buffer(entry: Entry) -> bool:
        return entry.value is not None and not isinstance(entry.value, nn.Parameter)

    def flat_param_key(self, shard: FlatParamShard) -> str:
        """The state-dict key of ``shard``'s flat parameter (its module's key prefix)."""
        first = shard.layout.segments[0]
        key = next(e.key for e in self.entries if e.fqn == shard.canonical(first.fqn))
        return key[: len(key) - len(first.fqn)] + FLAT_PARAM

    def local_shards(self) -> list[FlatParamShard]:
        """The flat parameters whose modules apply LOCAL_STATE_DICT."""
        return [s for s in self.shards if self.request_of(s).state_dict_type == LOCAL]


def _in_state_dict_order(names: ModelNames) -> list[Entry]:
    """``nn.Module.state_dict``'s order: parents first; a module's params, buffers, extra state.

    An original parameter of a flat parameter counts as a parameter of its
    own module, where FSDP1 puts it back while it saves.
    """
    modules = {fqn: index for index, fqn in enumerate(names.module_fqns())}

    def position(numbered: tuple[int, Entry]) -> tuple[int, int, int]:
        index, entry = numbered
        kind = 2 if entry.value is None else 0 if isinstance(entry.value, nn.Parameter) else 1
        return modules.get(entry.fqn.rpartition(".")[0], len(modules)), kind, index

    return [entry for _, entry in sorted(enumerate(names.entries), key=position)]


@dataclass(frozen=True)
class _UnitBuffer:
    """A buffer beneath an FSDP unit: its canonical FQN, its name in the unit, ignored or not."""

    fqn: str
    name_in_unit: str
    ignored: bool


def _unit_buffers(unit: FullyShardedDataParallel, names: ModelNames) -> Iterator[_UnitBuffer]:
    """Every buffer beneath an FSDP unit, under each of its canonical FQNs."""
    ignored: set[str] = getattr(unit, "_ignored_buffer_names", set())
    for name, buffer in unit.named_buffers():
        clean = without_stripped_segments(name)
        for fqn in names.fqns_of(buffer):
            yield _UnitBuffer(fqn, clean, clean in ignored)


def _original_buffer_dtypes(
    fsdp_modules: list[FullyShardedDataParallel], names: ModelNames
) -> dict[str, torch.dtype]:
    """Buffer dtypes before mixed precision cast them, by canonical FQN.

    Each FSDP unit whose policy casts buffers gives every buffer beneath it
    back the dtype it had when that unit was built; the outermost one saves
    last, so its record wins. Buffers a unit ignores keep the dtype they
    have, and buffers under no casting unit are left out.
    """
    dtypes: dict[str, torch.dtype] = {}
    for unit in fsdp_modules:  # parents before children
        if unit.mixed_precision.buffer_dtype is None:
            continue
        record: dict[str, torch.dtype] = getattr(unit, "_buffer_name_to_orig_dtype", {})
        for buffer in _unit_buffers(unit, names):
            if not buffer.ignored and buffer.name_in_unit in record:
                dtypes.setdefault(buffer.fqn, record[buffer.name_in_unit])
    return dtypes


def _computation_buffer_dtypes(
    fsdp_modules: list[FullyShardedDataParallel], names: ModelNames
) -> dict[str, torch.dtype]:
    """The dtypes FSDP1 casts buffers to when the model is first used, by canonical FQN.

    A model neither run nor saved yet still holds its buffers as built; its
    first use (a saving state dict included) casts each buffer to the buffer
    dtype of the innermost unit holding it, unless that unit ignores it, so
    a saved buffer has passed through that dtype.
    """
    dtypes: dict[str, torch.dtype | None] = {}
    for unit in reversed(fsdp_modules):  # children before parents
        dtype = unit.mixed_precision.buffer_dtype
        for buffer in _unit_buffers(unit, names):
            dtypes.setdefault(buffer.fqn, None if buffer.ignored else dtype)
    return {fqn: dtype for fqn, dtype in dtypes.items() if dtype is not None}
