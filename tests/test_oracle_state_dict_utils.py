"""The oracle's state-dict utilities alone, in one process (no process group needed)."""

from __future__ import annotations

import io

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import reference_impl as ri


def nested() -> dict:
    return {
        "w": torch.arange(6.0).view(2, 3),
        "t": torch.tensor(7),
        "opt": {
            "state": {0: {"m": torch.ones(4), "step": 3}},
            "groups": [{"lr": 0.1, "params": [0]}],
        },
        "misc": [1, 2.5, "s", None, b"raw", io.BytesIO(b"io"), (torch.zeros(1), "tail")],
        "empty": {},
    }


def test_iterate_rebuilds_containers_and_keeps_plain_leaves():
    sd = nested()
    out = ri.iterate_state_dict(sd, ri.identity, ri.identity, lambda v, *_: v * 2)
    assert out is not sd
    assert out["opt"] is not sd["opt"]
    assert torch.equal(out["w"], sd["w"] * 2)
    assert isinstance(out["misc"][6], tuple)
    assert out["misc"][5] is sd["misc"][5]  # BytesIO kept as is
    assert out["opt"]["state"][0]["step"] == 3
    assert out["empty"] == {}


def test_unsupported_type_is_refused_with_its_path_or_deep_copied():
    sd = {"a": [1, {"b": object()}]}
    with pytest.raises(ri.UnsupportedValue, match=r"^a\[1\]\.b: unsupported value type object"):
        ri.iterate_state_dict(sd, ri.identity, ri.identity, ri.identity)
    marker = {1, 2}
    out = ri.iterate_state_dict(
        {"s": marker}, ri.identity, ri.identity, ri.identity, type_check=False
    )
    assert out["s"] == marker
    assert out["s"] is not marker


def test_cpu_offload_of_cpu_tensors_returns_them_as_they_are():
    # Tensor.to("cpu") returns the tensor itself when it is already there; the
    # device move itself is exercised where a GPU is present.
    source = {"x": torch.ones(2), "l": [torch.zeros(1)]}
    out = ri.offload_state_dict_to_cpu(source)
    assert out["x"] is source["x"]
    assert out["l"][0] is source["l"][0]


def test_copy_lands_in_the_companion_and_returns_its_tensors():
    source = nested()
    companion = ri.create_cpu_state_dict(source)
    result = ri.copy_state_dict(source, companion)
    assert result["w"] is companion["w"]
    assert result["opt"]["state"][0]["m"] is companion["opt"]["state"][0]["m"]
    assert torch.equal(companion["w"], source["w"])
    assert companion["w"].data_ptr() != source["w"].data_ptr()


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda c: c.pop("w"), r"^<root>: keys differ: companion lacks \['w'\]"),
        (lambda c: c["misc"].pop(), r"^misc: length 7, companion length 6"),
        (
            lambda c: c.__setitem__("w", torch.zeros(3, 2)),
            r"^w: torch.float32\[2, 3\] cannot go into .*\[3, 2\]",
        ),
        (
            lambda c: c.__setitem__("w", torch.zeros(2, 3, dtype=torch.float64)),
            r"^w: torch.float32\[2, 3\] cannot go",
        ),
        (
            lambda c: c["opt"].__setitem__("state", [1]),
            r"^opt.state: a dict, but the companion is list",
        ),
        (
            lambda c: c["opt"]["state"][0].__setitem__("m", 5),
            r"^opt.state\[0\].m: a tensor, but the companion is int",
        ),
    ],
)
def test_mismatched_companions_name_the_key_path(mutate, message):
    companion = ri.create_cpu_state_dict(nested())
    mutate(companion)
    with pytest.raises(ri.CompanionMismatch, match=message):
        ri.copy_state_dict(nested(), companion)


def test_cpu_state_dict_has_fresh_memory_of_the_same_shapes():
    source = {"a": torch.ones(3, 4).t(), "z": torch.tensor(5.0), "e": torch.empty(0, 3), "n": 4}
    out = ri.create_cpu_state_dict(source)
    assert out["a"].shape == (4, 3)
    assert out["a"].is_contiguous()
    assert out["a"].data_ptr() != source["a"].data_ptr()
    assert out["z"].dim() == 0
    assert out["z"].item() == 0
    assert out["e"].shape == (0, 3)
    assert out["n"] == 4


def test_shared_memory_cpu_state_dict():
    out = ri.create_cpu_state_dict({"a": torch.ones(8), "e": torch.empty(0)}, share_memory=True)
    assert out["a"].is_shared()
    assert out["e"].is_shared()


@pytest.mark.skipif(torch.accelerator.is_available(), reason="checks a CPU-only build's refusal")
@pytest.mark.parametrize("shared", [False, True])
def test_pinned_memory_needs_an_accelerator(shared):
    with pytest.raises(RuntimeError, match=r"pin_memory needs an accelerator.*this build has none"):
        ri.create_cpu_state_dict({"a": torch.ones(8)}, pin_memory=True, share_memory=shared)


def test_similarity_is_pure_and_checks_structure_size_and_dtype():
    a, b = {"x": torch.ones(3), "l": [torch.ones(2)]}, {"x": torch.zeros(3), "l": [torch.zeros(2)]}
    assert ri.check_state_dict_similarity(a, b)
    assert torch.equal(b["x"], torch.zeros(3)), "the compared dict must not change"
    assert not ri.check_state_dict_similarity(a, {"x": torch.zeros(4), "l": [torch.zeros(2)]})
    assert not ri.check_state_dict_similarity(
        a, {"x": torch.zeros(3, dtype=torch.int64), "l": [torch.zeros(2)]}
    )
    assert not ri.check_state_dict_similarity(a, {"x": torch.zeros(3)})
    assert not ri.check_state_dict_similarity(a, {"x": torch.zeros(3), "l": []})


def test_flatten_names_paths_and_refuses_duplicates():
    flat, mapping = ri.flatten_state_dict({"a": {"b": [1, {"c": 2}]}, "e": []})
    assert flat == {"a.b.0": 1, "a.b.1.c": 2, "e": []}
    assert mapping["a.b.1.c"] == ("a", "b", 1, "c")
    with pytest.raises(ValueError, match=r"duplicated flatten key 'a.b': from a.b and a.b"):
        ri.flatten_state_dict({"a.b": 1, "a": {"b": 2}})


def test_set_element_grows_lists_and_refuses_leaves():
    root: dict = {}
    ri.set_element(root, ("a", 2, "b"), 1)
    assert root == {"a": [None, None, {"b": 1}]}
    with pytest.raises(ValueError, match=r"^a\[2\].b.c: cannot set an item in int"):
        ri.set_element(root, ("a", 2, "b", "c"), 1)


def test_unflatten_names_a_key_without_path():
    with pytest.raises(KeyError, match="flat key 'x' has no path"):
        ri.unflatten_state_dict({"x": 1}, {})


def test_format_path():
    assert ri.format_path(()) == "<root>"
    assert ri.format_path(("state", 0, "exp_avg")) == "state[0].exp_avg"


keys = st.text(alphabet="abcxyz", min_size=1, max_size=3)
leaves = st.one_of(st.integers(), st.floats(allow_nan=False), st.text(max_size=3), st.none())
trees = st.recursive(
    leaves,
    lambda children: st.one_of(
        st.lists(children, max_size=3), st.dictionaries(keys, children, max_size=3)
    ),
    max_leaves=12,
)


def _lists_for_tuples(value):
    if isinstance(value, dict):
        return {k: _lists_for_tuples(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_lists_for_tuples(v) for v in value]
    return value


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.dictionaries(keys, trees, max_size=4))
def test_flatten_then_unflatten_is_the_identity(state_dict):
    try:
        flat, mapping = ri.flatten_state_dict(state_dict)
    except ValueError:
        return  # two paths joined to the same key: refused, as tested above
    assert ri.unflatten_state_dict(flat, mapping) == _lists_for_tuples(state_dict)


def test_distribute_gives_dtensors_their_own_memory(tmp_path):
    """The new DTensor must not alias the caller's full tensor (upstream scatters a copy)."""
    import os

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        full = {"w": torch.arange(6.0).view(3, 2)}
        local = {"w": distribute_tensor(torch.zeros(3, 2), mesh, [Shard(0)])}
        ri.distribute_state_dict(full, local, torch.device("cpu"))
        full["w"].add_(100)
        assert local["w"].to_local().tolist() == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]
    finally:
        dist.destroy_process_group()
