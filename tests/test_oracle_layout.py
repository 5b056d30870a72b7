"""The oracle's placement arithmetic, against layouts worked out by hand."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.tensor import Partial, Replicate, Shard
from torch.distributed.tensor.placement_types import _StridedShard

from reference_impl._layout import chunk_of, layout_of


def held(global_shape, mesh_shape, placements, coord):
    return [t.tolist() for t in layout_of(global_shape, mesh_shape, placements, coord).indices]


@pytest.mark.parametrize(
    ("length", "parts", "expected"),
    [
        (8, 4, [[0, 1], [2, 3], [4, 5], [6, 7]]),
        (5, 4, [[0, 1], [2, 3], [4], []]),  # chunk size 2: the last part is empty
        (3, 4, [[0], [1], [2], []]),
        (0, 2, [[], []]),
        (7, 2, [[0, 1, 2, 3], [4, 5, 6]]),
    ],
)
def test_chunk_of_follows_torch_chunk_sizes(length, parts, expected):
    assert [chunk_of(torch.arange(length), parts, p).tolist() for p in range(parts)] == expected


def test_fsdp_shard_zero_uneven():
    assert held((5, 3), (2,), (Shard(0),), (0,)) == [[0, 1, 2], [0, 1, 2]]
    assert held((5, 3), (2,), (Shard(0),), (1,)) == [[3, 4], [0, 1, 2]]


def test_hsdp_replicate_then_shard():
    for replica in (0, 1):
        assert held((4,), (2, 2), (Replicate(), Shard(0)), (replica, 1)) == [[2, 3]]


def test_two_d_shard_zero_and_shard_one():
    assert held((4, 6), (2, 2), (Shard(0), Shard(1)), (1, 0)) == [[2, 3], [0, 1, 2]]


def test_shard_of_a_shard_on_the_same_dim_nests():
    # mesh dim 0 takes rows 0-3 of 8, mesh dim 1 then halves those
    assert held((8,), (2, 2), (Shard(0), Shard(0)), (0, 1)) == [[2, 3]]


def test_strided_shard_from_fsdp2_over_tp():
    # TP splits rows in two, FSDP splits each TP half in two: (dp, tp) = (i, j) holds
    # the i-th half of the j-th half.
    placements = (_StridedShard(0, split_factor=2), Shard(0))
    assert held((8, 2), (2, 2), placements, (0, 0))[0] == [0, 1]
    assert held((8, 2), (2, 2), placements, (0, 1))[0] == [4, 5]
    assert held((8, 2), (2, 2), placements, (1, 0))[0] == [2, 3]
    assert held((8, 2), (2, 2), placements, (1, 1))[0] == [6, 7]


def test_layout_index_puts_non_contiguous_pieces_back():
    full = torch.arange(16.0).view(8, 2)
    placements = (_StridedShard(0, split_factor=2), Shard(0))
    layout = layout_of((8, 2), (2, 1), (*placements[:1], Replicate()), (1, 0))
    assert layout.indices[0].tolist() == [2, 3, 6, 7]
    assert full[layout.index()].tolist() == [[4.0, 5.0], [6.0, 7.0], [12.0, 13.0], [14.0, 15.0]]


def test_zero_dim_tensor_is_held_whole():
    layout = layout_of((), (2,), (Replicate(),), (1,))
    assert layout.shape == ()
    assert layout.numel == 1


@pytest.mark.parametrize(
    ("placements", "error"),
    [
        ((Partial(),), "Partial placement"),
        ((Shard(2),), r"Shard\(dim=2\) shards dim 2 of a 2-dim tensor"),
    ],
)
def test_unsupported_placements_are_refused(placements, error):
    with pytest.raises((NotImplementedError, ValueError), match=error):
        layout_of((4, 4), (2,), placements, (0,))


def test_coordinate_must_match_the_mesh():
    with pytest.raises(ValueError, match="one entry per mesh dim"):
        layout_of((4,), (2, 2), (Shard(0),), (0,))
