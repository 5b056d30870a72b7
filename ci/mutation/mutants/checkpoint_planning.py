"""Mutants of DCP's load planning: which keys of a checkpoint a load reads
(``torch/distributed/checkpoint/default_planner.py``), and how a checkpoint's chunks are read
into the chunks a load asks for (``planner_helpers.py``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata

from ci.mutation.mutants._mutant import DEFAULT_PLANNER, PLANNER_HELPERS, mutant_maker

Fn = Callable[..., Any]
PLACEMENTS = "conformance/checks/test_dcp_placements.py"
APP_STATE = "conformance/checks/test_app_state_loads.py"
SAVE_PLANS = "conformance/checks/test_save_plans.py"


def _as_a_matrix(chunk: ChunkStorageMetadata) -> ChunkStorageMetadata:
    """The chunk with its offsets past the first two dimensions taken as zero."""
    offsets = [*chunk.offsets[:2], *[0] * (len(chunk.offsets) - 2)]
    return ChunkStorageMetadata(offsets=torch.Size(offsets), sizes=chunk.sizes)


def _reads_matrices_only(original: Fn) -> Fn:
    def create(fqn: str, checkpoint_md: Any, local_chunks: list[Any]) -> list[Any]:
        if not local_chunks or len(local_chunks[0].offsets) < 3:
            planned: list[Any] = original(fqn, checkpoint_md, local_chunks)
            return planned
        as_matrices = [_as_a_matrix(chunk) for chunk in local_chunks]
        own = {tuple(m.offsets): c.offsets for m, c in zip(as_matrices, local_chunks, strict=True)}
        items = original(fqn, checkpoint_md, as_matrices)
        return [
            dataclasses.replace(
                item,
                dest_index=dataclasses.replace(
                    item.dest_index, offset=own[tuple(item.dest_index.offset)]
                ),
            )
            for item in items
        ]

    return create


def _stops_at_the_first_missing_key(original: Fn) -> Fn:
    def create(state_dict: dict[str, Any], metadata: Any, strict: bool = True) -> Any:
        if strict:
            return original(state_dict, metadata, strict)
        present: dict[str, Any] = {}
        for fqn, value in state_dict.items():
            if fqn not in metadata.state_dict_metadata:
                break
            present[fqn] = value
        return original(present, metadata, strict)

    return create


def _changed_plans_merged_away(original: Fn) -> Fn:
    def merge(cached_plans: list[Any], delta_plans: list[Any]) -> list[Any]:
        return list(cached_plans)

    return merge


def _not_deduplicated(original: Fn) -> Fn:
    def dedup(all_plans: list[Any], *args: Any, **kwargs: Any) -> list[Any]:
        return all_plans

    return dedup


MUTANTS = [
    mutant_maker(DEFAULT_PLANNER, APP_STATE)(
        "partial_load_stops_at_the_first_missing_key",
        "create_default_local_load_plan",
        "a load that allows keys the checkpoint lacks stops planning at the first such key "
        "(a break for a continue): the keys after it are left unread",
        _stops_at_the_first_missing_key,
    ),
    mutant_maker(PLANNER_HELPERS, PLACEMENTS)(
        "resharding_reads_matrices_only",
        "create_read_items_for_chunk_list",
        "the reads planned for a load intersect chunks on their first two dimensions only, as "
        "a planner written for matrices would: a rank whose piece of a 3-D tensor starts past "
        "0 on its third dimension reads the piece that starts at 0",
        _reads_matrices_only,
    ),
    mutant_maker(DEFAULT_PLANNER, SAVE_PLANS)(
        "plan_caching_keeps_the_cached_plans",
        "_merge_delta_local_plans",
        "with plan caching on, a save whose plans changed on some ranks merges the cached "
        "plans with the changed ones by keeping the cached plans: a rank's new or resized "
        "tensor is planned as it was before",
        _changed_plans_merged_away,
    ),
    mutant_maker(DEFAULT_PLANNER, SAVE_PLANS)(
        "replicated_pieces_written_by_every_rank",
        "dedup_save_plans",
        "the global save plan keeps every rank's write of a piece that several ranks hold: "
        "each is written once per rank, the files grow with the world, and every load still "
        "reads the right values",
        _not_deduplicated,
    ),
]
