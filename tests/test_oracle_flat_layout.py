"""The oracle's FSDP1 flat-parameter layout, on layouts worked out by hand and on invariants."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from reference_impl import FlatLayout, ParamSlice, flat_layout


def _layout(numels: list[int], shard_count: int) -> FlatLayout:
    shapes = [torch.Size([n]) for n in numels]
    return flat_layout(
        [f"p{i}" for i in range(len(numels))], shapes, numels, [False] * len(numels), shard_count
    )


def test_uneven_split_with_a_parameter_across_two_shards_and_an_empty_shard():
    # 3 + 4 + 5 = 12 elements over 5 ranks: shards of ceil(12 / 5) = 3, padded to 15.
    layout = _layout([3, 4, 5], shard_count=5)
    assert (layout.shard_numel, layout.padded_numel) == (3, 15)
    assert layout.slices(0) == {"p0": ParamSlice("p0", 0, 0, 3)}
    assert layout.slices(1) == {"p1": ParamSlice("p1", 0, 0, 3)}
    assert layout.slices(2) == {"p1": ParamSlice("p1", 0, 3, 1), "p2": ParamSlice("p2", 1, 0, 2)}
    assert layout.slices(3) == {"p2": ParamSlice("p2", 0, 2, 3)}
    assert layout.slices(4) == {}
    assert [layout.tail_padding(r) for r in range(5)] == [0, 0, 0, 0, 3]
    assert layout.shard_range(4) == (12, 12)


def test_alignment_padding_between_parameters_is_skipped():
    # use_orig_params pads p0 (3 elements) to 4 before p1 starts.
    layout = flat_layout(
        ["p0", "p1"], [torch.Size([3]), torch.Size([2, 2])], [3, 1, 4], [False, True, False], 2
    )
    assert [(s.fqn, s.start, s.shape) for s in layout.segments] == [
        ("p0", 0, torch.Size([3])),
        ("p1", 4, torch.Size([2, 2])),
    ]
    assert layout.slices(0) == {"p0": ParamSlice("p0", 0, 0, 3)}
    assert layout.slices(1) == {"p1": ParamSlice("p1", 0, 0, 4)}


def test_one_shard_holds_everything_unpadded():
    layout = _layout([3, 4], shard_count=1)
    assert layout.shard_numel == 7
    assert layout.tail_padding(0) == 0
    assert layout.slices(0) == {"p0": ParamSlice("p0", 0, 0, 3), "p1": ParamSlice("p1", 3, 0, 4)}


def test_a_shape_that_disagrees_with_its_numel_names_the_parameter():
    with pytest.raises(ValueError, match=r"fc\.weight: shape \(2, 3\) but 5 elements"):
        flat_layout(["fc.weight"], [torch.Size([2, 3])], [5], [False], 2)


def test_descriptions_of_different_lengths_are_refused():
    with pytest.raises(ValueError, match="2 names, 2 shapes and 1 parameter numels"):
        flat_layout(["a", "b"], [torch.Size([1]), torch.Size([1])], [1], [False], 1)
    with pytest.raises(ValueError, match="2 numels but 1 padding flags"):
        flat_layout(["a"], [torch.Size([1])], [1, 1], [False], 1)


def test_a_rank_outside_the_shard_group_is_refused():
    with pytest.raises(ValueError, match="shard rank 2 outside a group of 2"):
        _layout([4], shard_count=2).slices(2)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.lists(st.integers(0, 20), min_size=1, max_size=6), st.integers(1, 9))
def test_the_shards_tile_every_parameter_exactly_once_in_order(numels, shard_count):
    layout = _layout(numels, shard_count)
    for i, numel in enumerate(numels):
        pieces = [
            (rank, layout.slices(rank)[f"p{i}"])
            for rank in range(shard_count)
            if f"p{i}" in layout.slices(rank)
        ]
        covered = [index for _, piece in pieces for index in range(piece.start, piece.end)]
        assert covered == list(range(numel))
        for rank, piece in pieces:
            flat_start = layout.shard_range(rank)[0] + piece.offset_in_shard
            assert flat_start == layout.segments[i].start + piece.start
            assert piece.offset_in_shard + piece.numel <= layout.shard_numel
