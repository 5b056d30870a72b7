"""FSDP1's flat parameters hold what the oracle's layout says, where it says.

The checks run on every FSDP1 cell of the matrix: each strategy, with and without
``use_orig_params``, flat and nested wrapping. They use the matrix's MLP, and a tiny model
whose shards run out before the ranks do. The oracle's layout equals FSDP1's own shard
records. Each rank's flat shard holds exactly the pieces of the single-process parameters the
layout names, then zeros.
"""

from __future__ import annotations

import pytest
import torch

import reference_impl as ri
from conformance.cells import PARALLELISMS, exists_at_size
from conformance.models import fsdp1_small as small
from conformance.models.common import seeded_mlp
from conformance.training import FSDP1_CELLS

MODELS = {"mlp": seeded_mlp, "tiny": small.seeded_tiny}


def _their_slices(shard: ri.FlatParamShard) -> dict[str, ri.ParamSlice]:
    """FSDP1's own record of what this rank holds, in the oracle's terms."""
    records = shard.flat_param._shard_param_infos
    return {
        segment.fqn: ri.ParamSlice(
            segment.fqn, info.offset_in_shard, info.intra_param_start_idx, info.numel_in_shard
        )
        for segment, info in zip(shard.layout.segments, records, strict=True)
        if info.in_shard and info.numel_in_shard
    }


@pytest.mark.world(2, 4, applies=exists_at_size())
@pytest.mark.parametrize("model_name", sorted(MODELS))
@pytest.mark.parametrize("name", FSDP1_CELLS)
def test_flat_shards_hold_what_the_oracles_layout_says(world, name, model_name):
    PARALLELISMS[name].require(world.size)
    model = PARALLELISMS[name].parallelise(MODELS[model_name](), world)
    originals = dict(MODELS[model_name]().named_parameters())
    shards = ri.flat_param_shards(model)
    assert shards, f"{name}: no flat parameter found"
    for shard in shards:
        layout, rank = shard.layout, shard.shard_rank
        held = layout.slices(rank)
        assert held == _their_slices(shard), f"shard rank {rank} of {shard.prefix or 'root'}"
        local = shard.flat_param.detach().cpu()
        assert local.numel() == layout.shard_numel
        for fqn, piece in held.items():
            expected = originals[shard.canonical(fqn)].detach().flatten()[piece.start : piece.end]
            actual = local[piece.offset_in_shard : piece.offset_in_shard + piece.numel]
            assert torch.equal(actual, expected), f"{shard.canonical(fqn)} on shard rank {rank}"
        start, end = layout.shard_range(rank)
        tail = local[end - start :]
        assert tail.numel() == layout.tail_padding(rank)
        assert not tail.any(), f"the tail padding of shard rank {rank} is not zeros"
