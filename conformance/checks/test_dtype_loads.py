"""A checkpoint loaded into a template of another dtype is converted exactly, or refused, and
never silently.

Mixed-precision runs keep fp32 masters, and a template is often built in another dtype (a
model cast to bf16 before its load, an fp32 model resumed from a bf16 export). The policy
judged here:

- **Exact or refused.** ``dcp.load`` either refuses, naming the key, or gives every value as
  ``Tensor.to(template dtype)`` gives the saved one, bit for bit, in the template's dtype. No
  other value may come out of it.
- **Said.** A load that converts warns, naming a key it converted. A silent conversion is a
  known divergence where a release makes it (pytorch/pytorch#187138), so a fork that adds
  the warning sees it pass.

The saved model state is the cell's own (DTensors, a pipeline stage's or experts' part), cast
to the saved dtype; the template is the same cast to the loaded dtype. Pairs: fp32 into bf16
and fp16 (rounding), bf16 into fp32 (widening). Every golden cell except FSDP1's, at its
first size, and one process. FSDP1's ShardedTensors have no cast of their own; FSDP1 meets
dtypes in the mixed-precision checks.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch

from conformance._upstream import dcp, dsd
from conformance.cells import PARALLELISMS, first_size_only, with_role
from conformance.compare import local_part
from conformance.models.common import seeded_mlp
from conformance.models.zoo import model_of
from conformance.training import refusal_of

PAIRS = {
    "fp32_into_bf16": (torch.float32, torch.bfloat16),
    "fp32_into_fp16": (torch.float32, torch.float16),
    "bf16_into_fp32": (torch.bfloat16, torch.float32),
}
CELLS = ["single", *(name for name in with_role("golden") if not PARALLELISMS[name].fsdp1)]


def _at_its_size(size: int, **params: Any) -> bool:
    if params["name"] == "single":
        return size == 1
    return first_size_only()(size, **params)


@pytest.mark.world(1, 2, 4, applies=_at_its_size)
@pytest.mark.parametrize("pair", sorted(PAIRS))
@pytest.mark.parametrize("name", CELLS)
def test_a_load_into_another_dtype_converts_exactly_or_refuses(world, name, pair):
    saved, template, path = _saved_and_template(world, name, pair)
    refusal = refusal_of(lambda: dcp.load(template, checkpoint_id=path))
    if refusal is not None:
        assert any(key in str(refusal) for key in template), (
            f"rank {world.rank}: the load of {pair} was refused without naming a key: {refusal}"
        )
        return
    loaded_dtype = PAIRS[pair][1]
    for key, value in template.items():
        expected = local_part(saved[key]).to(loaded_dtype)
        got = local_part(value)
        assert got.dtype == loaded_dtype, f"rank {world.rank}, {key}: loaded as {got.dtype}"
        assert torch.equal(got, expected), (
            f"rank {world.rank}, {key}: {pair} loaded {got.flatten()[:3].tolist()}..., not the "
            f"saved values converted by Tensor.to: {expected.flatten()[:3].tolist()}..."
        )


@pytest.mark.world(1, 2, 4, applies=_at_its_size)
@pytest.mark.parametrize("pair", sorted(PAIRS))
@pytest.mark.parametrize("name", CELLS)
def test_a_load_into_another_dtype_says_so(world, name, pair):
    _, template, path = _saved_and_template(world, name, pair)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if refusal_of(lambda: dcp.load(template, checkpoint_id=path)) is not None:
            return  # a refusal says so; the other check judges that it names the key
    said = [str(w.message) for w in caught if any(key in str(w.message) for key in template)]
    assert said, (
        f"rank {world.rank}: a load of {pair} converted every value without a warning naming "
        f"a key (warnings seen: {[str(w.message)[:120] for w in caught]})"
    )


def _saved_and_template(
    world: Any, name: str, pair: str
) -> tuple[dict[str, Any], dict[str, Any], str]:
    """The model state cast to the pair's saved dtype, saved; a template of it in the loaded
    dtype; the checkpoint's path."""
    saved_dtype, loaded_dtype = PAIRS[pair]
    if name == "single":
        model = seeded_mlp().to(world.device)
    else:
        cell = PARALLELISMS[name]
        cell.skip_unless_runnable(world.device)
        model = model_of(cell, world)
    state = {
        key: value.detach().to(saved_dtype)
        for key, value in dsd.get_model_state_dict(model).items()
        if value.is_floating_point()
    }
    path = str(world.tmp_path / "checkpoint")
    dcp.save(state, checkpoint_id=path)
    template = {key: torch.zeros_like(value, dtype=loaded_dtype) for key, value in state.items()}
    return state, template, path
