"""CPU-world counterparts of upstream's ``test/distributed/fsdp/test_fsdp_state_dict.py``.

Each upstream case runs here with torch and the oracle side by side. The state dict torch
saves inside ``FSDP.state_dict_type`` must equal ``reference_impl.fsdp_state_dict`` on the same
model. Keys are compared in sorted order, since FSDP1's order follows module registration. A
fresh model whose values were zeroed then loads it, by ``model.load_state_dict`` and by
``reference_impl.fsdp_load_state_dict`` alike. Each load must give the saved model's values
back.

Upstream couples ``rank0_only`` with ``offload_to_cpu``. On CPU worlds the offload is left
out: it moves nothing, and on torch 2.13 it crashes a rank, which ``test_upstream_failures.py``
reports. So ``full_rank0_only`` here offloads only where the world has accelerators. Parameter
CPU offload and ``sync_module_states`` need an accelerator, and skip on CPU worlds with that
reason.

The cases run on upstream's small models (``conformance/models/fsdp1_small.py``):

- activation-checkpoint wrappers on the saving or loading side, inside FSDP or applied after
  it, and ``FSDP(CheckpointWrapper(block))``;
- tied parameters and a shared module;
- save and load with float16 models and gradients populated;
- save and load with BatchNorm buffers under mixed precision;
- save and load with buffers cast by the root unit's policy, a child's or both; each buffer
  follows the unit that owns it, and saves in float32;
- save and load before or after a step (the oracle saves first, on a model FSDP1 has not
  initialised);
- save and load after six SGD steps;
- FSDP1 saved and reloaded against DDP's training;
- the keys of each type;
- loading into the model without FSDP (FSDP and plain roots);
- a module left out of wrapping;
- ignored modules, saved uncopied and uncast, with a key prefix;
- the config type check, the context manager's restore, and clean missing/unexpected keys;
- LOCAL with empty ranks, through ``torch.save``, and re-cut from 4 ranks to 2;
- SHARDED in one-rank groups and in a ``cpu:gloo`` multi-backend group (as saved and moved to
  the CPU);
- LOCAL and SHARDED state through ``dcp.save`` and ``dcp.load`` into another model, and
  SHARDED state saved at 4 ranks loaded into models sharded over the even and the odd ranks.
"""

from __future__ import annotations

import contextlib
import copy
import io
import itertools
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

import reference_impl as ri
from conformance._upstream import (
    activation_checkpointing,
    dcp,
    ddp,
    fsdp,
    fsdp_wrap,
    remote_device,
    sharded_tensor,
    sharded_tensor_metadata,
    sharding_spec,
)
from conformance.cells import SubWorld
from conformance.compare import assert_state_dict_equal, assert_trees_identical
from conformance.models import fsdp1_small as small
from conformance.models.common import unwrapped_name
from conformance.models.optimizers import sgd
from conformance.models.transformer import Block, seeded_transformer
from conformance.training import (
    model_settings,
    oracle_model_state_dict,
    torch_model_load,
    torch_model_state_dict,
)

KINDS = ("full", "full_rank0_only", "local", "sharded")
UNFLATTENED = ["full", "full_rank0_only", "sharded"]


def _saved(model: nn.Module, kind: str, device: torch.device, prefix: str = "") -> dict[str, Any]:
    """Torch's state dict of ``kind``, after checking the oracle's is identical.

    The oracle saves first: torch's save initialises a model not used yet, which the
    oracle must foresee rather than see done.
    """
    ours = {
        prefix + key: value for key, value in oracle_model_state_dict(model, kind, device).items()
    }
    theirs = torch_model_state_dict(model, kind, device, prefix)
    assert_trees_identical(dict(sorted(theirs.items())), dict(sorted(ours.items())))
    return theirs


def _torch_load(model: nn.Module, state_dict: dict[str, Any], kind: str, group: Any = None) -> Any:
    """``model.load_state_dict`` inside ``FSDP.state_dict_type`` (the model knows its group)."""
    return torch_model_load(model, state_dict, kind)


def _oracle_load(model: nn.Module, state_dict: dict[str, Any], kind: str, group: Any = None) -> Any:
    return ri.fsdp_load_state_dict(model, state_dict, model_settings(kind)[0], group=group)


LOADERS = {"torch": _torch_load, "oracle": _oracle_load}


@contextlib.contextmanager
def _loaded_by(loader: str) -> Iterator[None]:
    """Name the loader in a failed comparison of what it loaded."""
    try:
        yield
    except AssertionError as error:
        raise AssertionError(f"loaded by {loader}: {error}") from None


def _everywhere(state_dict: dict[str, Any], kind: str) -> dict[str, Any]:
    """A ``rank0_only`` state dict sent from rank 0 to every rank, as upstream loads it."""
    if kind != "full_rank0_only":
        return state_dict
    holder = [state_dict if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(holder, src=0)
    assert holder[0] is not None
    return holder[0]


def _values(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer at full size, by clean name (wrapper prefixes dropped)."""
    with fsdp.FullyShardedDataParallel.summon_full_params(model):
        named = itertools.chain(model.named_parameters(), model.named_buffers())
        return {unwrapped_name(name): t.detach().clone() for name, t in named}


def _detached(model: nn.Module) -> dict[str, torch.Tensor]:
    """A model without FSDP: its parameters and buffers as plain tensors."""
    named = itertools.chain(model.named_parameters(), model.named_buffers())
    return {name: tensor.detach() for name, tensor in named}


def _zeroed(model: nn.Module) -> nn.Module:
    with fsdp.FullyShardedDataParallel.summon_full_params(model, writeback=True), torch.no_grad():
        for tensor in itertools.chain(model.parameters(), model.buffers()):
            tensor.zero_()
    return model


def _assert_differs(model: nn.Module, expected: dict[str, torch.Tensor]) -> None:
    """The fresh model must not already hold the values a load has to write."""
    values = _values(model)
    assert any(not torch.equal(values[key], expected[key]) for key in expected), "nothing to load"


def _assert_loads_back(
    make: Callable[[], nn.Module], source: nn.Module, saved: dict[str, Any], kind: str
) -> None:
    """Torch's load and the oracle's, each into a zeroed ``make()``, give ``source``'s values."""
    expected = _values(source)
    saved = _everywhere(saved, kind)
    for loader, load in LOADERS.items():
        fresh = _zeroed(make())
        _assert_differs(fresh, expected)
        load(fresh, copy.copy(saved), kind)
        with _loaded_by(loader):
            assert_state_dict_equal(_values(fresh), expected)


def _one_step(model: nn.Module, device: torch.device, dtype: torch.dtype = torch.float32) -> None:
    """A forward and backward pass, so gradients are populated as in training."""
    model(torch.randn(3, 10, device=device, dtype=dtype)).sum().backward()


# ----- activation checkpointing ----------------------------------------------------------


AC_PLACES = ["source", "dest", "both", "source_after_wrap", "both_after_wrap"]


@pytest.mark.world(2)
@pytest.mark.parametrize("model", ["simple", "nested"])
@pytest.mark.parametrize("checkpoint", AC_PLACES)
@pytest.mark.parametrize("kind", UNFLATTENED)
def test_state_dict_with_activation_checkpoint(world, kind, checkpoint, model):
    """Save from and load into models with checkpoint wrappers inside or applied after FSDP."""
    build = {"simple": small.simple, "nested": small.nested}[model]

    def make(side: str) -> nn.Module:
        built = build(world.device, checkpoint=checkpoint in (side, "both"))
        if checkpoint in (f"{side}_after_wrap", "both_after_wrap"):
            small.apply_checkpointing(built)
        return built

    source = make("source")
    _assert_loads_back(lambda: make("dest"), source, _saved(source, kind, world.device), kind)


def _transformer_wrapped_per_block(world: Any, checkpoint: bool) -> nn.Module:
    """FSDP around each block (inside a checkpoint wrapper when ``checkpoint``) and the root."""
    model = seeded_transformer()
    for index, block in enumerate(model.layers):
        inner = activation_checkpointing.checkpoint_wrapper(block) if checkpoint else block
        model.layers[index] = small.fsdp1(inner, world.device)
    return small.fsdp1(model, world.device)


@pytest.mark.world(2)
@pytest.mark.parametrize("kind", UNFLATTENED)
def test_state_dict_with_manual_checkpoint_wrapper(world, kind):
    """``FSDP(CheckpointWrapper(block))`` saves the keys ``FSDP(block)`` saves, and loads."""
    with_ac = _transformer_wrapped_per_block(world, checkpoint=True)
    without_ac = _transformer_wrapped_per_block(world, checkpoint=False)
    saved_with, saved_without = (_saved(m, kind, world.device) for m in (with_ac, without_ac))
    assert sorted(saved_with) == sorted(saved_without)
    _assert_loads_back(
        lambda: _transformer_wrapped_per_block(world, True), with_ac, saved_with, kind
    )


# ----- shared parameters -----------------------------------------------------------------


def _tied_transformer(world: Any) -> nn.Module:
    """The transformer with its head tied to the embedding, each block wrapped on its own."""
    model = seeded_transformer()
    model.head.weight = model.embed.weight
    return small.fsdp1(model, world.device, auto_wrap_policy=fsdp_wrap.ModuleWrapPolicy({Block}))


@pytest.mark.world(2)
@pytest.mark.parametrize("kind", ["full", "sharded", "local"])
def test_state_dict_with_shared_parameters(world, kind):
    source = _tied_transformer(world)
    saved = _saved(source, kind, world.device)
    if kind != "local":  # the tied weight under each of its names
        assert {"embed.weight", "head.weight"} <= set(saved)
    _assert_loads_back(lambda: _tied_transformer(world), source, saved, kind)


@pytest.mark.world(2)
def test_shared_module_and_shared_parameter(world):
    model = small.fsdp1(small.SharedModuleAndParameter(), world.device)
    saved = _saved(model, "full", world.device)
    assert torch.equal(saved["random_parameter"], saved["shared_parameter"])
    assert torch.equal(saved["net2.0.weight"], saved["net3.0.weight"])
    assert torch.equal(saved["net2.0.bias"], saved["net3.0.bias"])


# ----- save and load with CPU offload, float16, buffers and mixed precision --------------


MODELS = {
    "non_fsdp_root": small.NonFsdpRoot,
    "nested": small.nested,
    "simple": small.simple,
}


def _supported(world: Any, kind: str, use_orig_params: bool, offload_params: bool) -> None:
    if offload_params and world.device.type == "cpu":
        pytest.skip("FSDP1 pins offloaded parameters' memory, which needs an accelerator")
    if use_orig_params and kind == "local":
        pytest.skip("FSDP1 has no LOCAL_STATE_DICT load with use_orig_params (as upstream)")


@pytest.mark.world(2)
@pytest.mark.parametrize("use_orig_params", [False, True], ids=["flat", "orig"])
@pytest.mark.parametrize("offload_params", [False, True], ids=["on_device", "cpu_offload"])
@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "fp16"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("model", sorted(MODELS))
def test_basic_save_and_load(world, model, kind, fp16, offload_params, use_orig_params):
    _supported(world, kind, use_orig_params, offload_params)
    dtype = torch.float16 if fp16 else torch.float32
    kwargs = {"cpu_offload": fsdp.CPUOffload(offload_params), "use_orig_params": use_orig_params}

    def make() -> nn.Module:
        built = MODELS[model](world.device, **kwargs).to(dtype)
        _one_step(built, world.device, dtype)  # gradients populated, as in training
        return built

    source = make()
    saved = _saved(source, kind, world.device)
    if kind != "local":
        assert {value.dtype for value in saved.values()} <= {dtype}
    _assert_loads_back(make, source, saved, kind)


@pytest.mark.world(2)
@pytest.mark.parametrize("use_orig_params", [False, True], ids=["flat", "orig"])
@pytest.mark.parametrize("offload_params", [False, True], ids=["on_device", "cpu_offload"])
@pytest.mark.parametrize("mixed_precision", [False, True], ids=["fp32", "mixed"])
@pytest.mark.parametrize("kind", KINDS)
def test_buffers_save_and_load(world, kind, mixed_precision, offload_params, use_orig_params):
    _supported(world, kind, use_orig_params, offload_params)

    def make() -> nn.Module:
        return small.multi_buffer(
            world.device,
            mixed_precision=small.half_precision() if mixed_precision else None,
            cpu_offload=fsdp.CPUOffload(offload_params),
            use_orig_params=use_orig_params,
        )

    source = make()
    source(torch.randn(3, 10, device=world.device)).sum().backward()  # moves the norm's stats
    _assert_loads_back(make, source, _saved(source, kind, world.device), kind)


@pytest.mark.world(2)
@pytest.mark.parametrize("used", [True, False], ids=["after_a_step", "not_used_yet"])
@pytest.mark.parametrize("casting", ["root", "child", "both"])
@pytest.mark.parametrize("kind", KINDS)
def test_buffers_cast_by_some_units_save_in_their_own_dtype(world, kind, casting, used):
    """Whichever units' mixed precision casts a buffer, it is saved in float32 (but LOCAL, as
    it is) and loads back; the oracle must follow the unit that owns the buffer. A model not
    used yet is cast by its first save, so its buffers are saved through float16."""
    source = small.buffer_casting_units(world.device, casting)
    if used:
        source(torch.randn(3, 10, device=world.device)).sum().backward()
    saved = _saved(source, kind, world.device)
    half = {key for key, value in _values(source).items() if value.dtype == torch.float16}
    assert (
        half
        == {
            "root": {"1.offset"},  # the child unit casts its own buffer, by its own policy
            "child": {"0.offset"},
            "both": {"0.offset", "1.offset"},
        }[casting]
    )
    if kind != "local":
        assert {value.dtype for value in saved.values()} <= {torch.float32}
    _assert_loads_back(
        lambda: small.buffer_casting_units(world.device, casting), source, saved, kind
    )


@pytest.mark.world(2)
@pytest.mark.parametrize("mixed_precision", [False, True], ids=["fp32", "mixed"])
@pytest.mark.parametrize("kind", KINDS)
def test_save_and_load_after_training(world, kind, mixed_precision):
    """After six SGD steps the saved values are the trained ones, in float32, and load back."""
    precision = small.half_precision() if mixed_precision else None

    def make() -> nn.Module:
        return small.nested(world.device, mixed_precision=precision)

    model, untrained = make(), _values(make())
    optimizer = sgd(model)
    for _ in range(6):
        loss = model(torch.randn(1, 10, device=world.device)).sum()
        assert loss.dtype == (torch.float16 if mixed_precision else torch.float32)
        loss.backward()
        optimizer.step()
    _assert_differs(model, untrained)
    saved = _saved(model, kind, world.device)
    if kind != "local":  # empty on ranks other than 0 with rank0_only
        assert {value.dtype for value in saved.values()} <= {torch.float32}
    _assert_loads_back(make, model, saved, kind)


# ----- FSDP1 against DDP, and into local modules -----------------------------------------


def _trained_inner_outer(world: Any, wrap: str) -> nn.Module:
    """Upstream's ``Model`` after three SGD steps, under FSDP1 (inner wrapped too) or DDP."""
    model = small.InnerOuter(world.device, inner_fsdp=wrap == "fsdp")
    wrapped: nn.Module = (
        small.fsdp1(model, world.device) if wrap == "fsdp" else ddp.DistributedDataParallel(model)
    )
    optimizer = sgd(wrapped)
    inputs = torch.rand(64, 4, generator=torch.Generator().manual_seed(small.SEED))
    for _ in range(3):
        wrapped(inputs.to(world.device)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    return wrapped


@pytest.mark.world(2)
@pytest.mark.parametrize("kind", KINDS)
def test_state_dict_save_load_flow_matches_ddp(world, kind):
    """FSDP1 trained, saved and loaded into a blank model ends where DDP's training does."""
    _assert_a_load_ends_where_ddp_does(world, kind, lambda value: value)


@pytest.mark.world(2)
@pytest.mark.parametrize("kind", KINDS)
def test_state_dict_moved_to_the_cpu_loads_as_saved(world, kind):
    """As above, the saved tensors (the local shards of sharded and local state) moved from
    the accelerator to the CPU before the load."""
    if world.device.type == "cpu":
        pytest.skip("the state is on the CPU already: the move runs on accelerator worlds")
    _assert_a_load_ends_where_ddp_does(world, kind, _moved_to_cpu)


def _assert_a_load_ends_where_ddp_does(
    world: Any, kind: str, before_load: Callable[[Any], Any]
) -> None:
    fsdp_model = _trained_inner_outer(world, "fsdp")
    saved = _everywhere(_saved(fsdp_model, kind, world.device), kind)
    saved = {key: before_load(value) for key, value in saved.items()}
    ddp_values = {
        key: v for key, v in _trained_inner_outer(world, "ddp").module.state_dict().items()
    }
    for loader, load in LOADERS.items():
        blank = _zeroed(small.fsdp1(small.InnerOuter(world.device, inner_fsdp=True), world.device))
        load(blank, copy.copy(saved), kind)
        with _loaded_by(loader):
            assert_state_dict_equal(_values(blank), ddp_values)


def _moved_to_cpu(value: Any) -> Any:
    """``value`` on the CPU; a ShardedTensor keeps its metadata, its local shards moved."""
    if isinstance(value, sharded_tensor.ShardedTensor):
        for shard in value.local_shards():
            shard.tensor = shard.tensor.cpu()
        return value
    return value.cpu() if isinstance(value, torch.Tensor) else value


@pytest.mark.world(2)
@pytest.mark.parametrize("kind", KINDS)
def test_state_dict_keys(world, kind):
    """Full and sharded keys are the local model's; local keys are the two flat parameters."""
    model = small.fsdp1(small.InnerOuter(world.device, inner_fsdp=True), world.device)
    keys = set(_saved(model, kind, world.device))
    if kind == "local":
        assert keys == {"_flat_param", "inner._flat_param"}
    elif world.rank == 0 or kind != "full_rank0_only":
        assert keys == set(small.InnerOuter(world.device).state_dict())
    else:
        assert keys == set()


@pytest.mark.world(2)
@pytest.mark.parametrize("root", ["fsdp_root", "non_fsdp_root"])
@pytest.mark.parametrize("kind", UNFLATTENED)
def test_state_dict_load_into_local_module(world, kind, root):
    """A state dict saved from FSDP1, gathered, loads into the model without any FSDP."""
    if root == "fsdp_root":
        inner = small.InnerOuter(world.device, inner_fsdp=True, buffers=True)
        model: nn.Module = small.fsdp1(inner, world.device)
        local: nn.Module = small.InnerOuter(world.device, buffers=True)
        inputs = torch.rand(64, 4, device=world.device)
    else:
        model, local = small.NonFsdpRoot(world.device), small.NonFsdpRoot(world.device, wrap=False)
        inputs = torch.randn(1, 10, device=world.device)
    optimizer = sgd(model)
    for _ in range(3):
        model(inputs).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    expected = _values(model)
    saved = _everywhere(ri.gather_state_dict(_saved(model, kind, world.device)), kind)
    with torch.no_grad():
        for parameter in local.parameters():
            parameter.zero_()
    local.load_state_dict(saved, strict=True)
    assert_state_dict_equal(_detached(local), expected)


@pytest.mark.world(2)
@pytest.mark.parametrize("kind", KINDS)
def test_state_dict_skip_module(world, kind):
    """A module detached while wrapping and reattached saves under its plain names, and the
    gathered state loads strictly into the model without FSDP, giving its values."""
    model = small.with_skipped_module(world.device)
    model(torch.randn(1, 10, device=world.device)).sum().backward()
    saved = _saved(model, kind, world.device)
    gathered, values = ri.gather_state_dict(saved), _values(model)  # collectives: every rank
    if kind != "local" and (world.rank == 0 or kind != "full_rank0_only"):
        plain = small.WithSkippedModule(world.device, wrap=False)
        assert sorted(saved) == sorted(plain.state_dict())
        plain.load_state_dict(gathered, strict=True)
        assert_state_dict_equal(_detached(plain), values)
    _assert_loads_back(lambda: small.with_skipped_module(world.device), model, saved, kind)


# ----- ignored modules, configs, the context manager -------------------------------------


@pytest.mark.world(2)
@pytest.mark.parametrize("mixed_precision", [False, True], ids=["fp32", "mixed"])
@pytest.mark.parametrize("ignore_inner", [False, True], ids=["inner_wrapped", "inner_ignored"])
@pytest.mark.parametrize("prefix", ["", "foo."], ids=["no_prefix", "prefix"])
@pytest.mark.parametrize("kind", ["full", "sharded"])
def test_state_dict_with_ignored_modules(world, kind, prefix, ignore_inner, mixed_precision):
    """Ignored parameters and all buffers are saved as they are, by every save: not copied,
    not cast."""
    model = small.InnerOuter(
        world.device,
        inner_fsdp=True,
        buffers=True,
        ignore_inner=ignore_inner,
        mixed_precision=mixed_precision,
    )
    kept = {"outer.weight": model.outer.weight, "outer.bias": model.outer.bias}
    if ignore_inner:
        kept |= {"inner.weight": model.inner.weight, "inner.bias": model.inner.bias}
    kept["outer.buffer"] = model.outer.buffer
    if ignore_inner or not mixed_precision:  # a cast buffer is saved as a float32 copy
        kept["inner.buffer"] = model.inner.buffer
    wrapped = small.fsdp1(
        model,
        world.device,
        ignored_modules=[model.outer],
        mixed_precision=small.half_precision() if mixed_precision else None,
    )
    saved = ri.gather_state_dict(_saved(wrapped, kind, world.device, prefix=prefix))
    again = ri.gather_state_dict(_saved(wrapped, kind, world.device, prefix=prefix))
    for name, tensor in kept.items():
        for which, state in (("first", saved), ("second", again)):
            assert state[prefix + name].data_ptr() == tensor.data_ptr(), (
                f"the {which} save copied {prefix}{name}"
            )
    assert (
        saved[prefix + "inner.buffer"].dtype
        == saved[prefix + "outer.buffer"].dtype
        == torch.float32
    )
    local = small.InnerOuter(world.device, buffers=True)
    with torch.no_grad():
        for parameter in local.parameters():
            parameter.zero_()
    local.load_state_dict({key.removeprefix(prefix): v for key, v in saved.items()}, strict=True)
    loaded = {name: p.detach() for name, p in local.named_parameters()}  # buffers: cast by MP
    assert_state_dict_equal(loaded, {k: v for k, v in _values(wrapped).items() if k in loaded})


@pytest.mark.world(2)
def test_wrong_state_dict_config_is_refused(world):
    model = small.fsdp1(small.InnerOuter(world.device, inner_fsdp=True), world.device)
    refused = pytest.raises(RuntimeError, match="Expected state_dict_config of type")
    with (
        refused,
        fsdp.FullyShardedDataParallel.state_dict_type(
            model, fsdp.StateDictType.FULL_STATE_DICT, fsdp.LocalStateDictConfig()
        ),
    ):
        pass


@pytest.mark.world(2)
def test_state_dict_type_is_restored_after_the_context(world):
    model = small.with_skipped_module(world.device)
    with fsdp.FullyShardedDataParallel.state_dict_type(model, fsdp.StateDictType.LOCAL_STATE_DICT):
        assert {m._state_dict_type for m in fsdp.FullyShardedDataParallel.fsdp_modules(model)} == {
            fsdp.StateDictType.LOCAL_STATE_DICT
        }
    for module in fsdp.FullyShardedDataParallel.fsdp_modules(model):
        assert module._state_dict_type == fsdp.StateDictType.FULL_STATE_DICT


@pytest.mark.world(2)
def test_full_state_dict_missing_and_unexpected_keys_are_clean(world):
    """The keys a non-strict load reports carry no FSDP wrapper prefix, in torch and the oracle."""
    model = small.nested(world.device)
    saved = dict(model.state_dict())
    first = next(iter(saved))
    del saved[first]
    saved["unexpected"] = torch.ones(1)
    theirs = model.load_state_dict(copy.copy(saved), strict=False)
    ours = ri.fsdp_load_state_dict(small.nested(world.device), copy.copy(saved), strict=False)
    assert (list(theirs.missing_keys), list(theirs.unexpected_keys)) == ([first], ["unexpected"])
    assert (ours.missing_keys, ours.unexpected_keys) == ([first], ["unexpected"])
    assert "_fsdp_wrapped_module" not in first


# ----- local state dicts -----------------------------------------------------------------


@pytest.mark.world(2, 4)
def test_local_state_dict_with_empty_ranks(world):
    saved_model = small.fsdp1(small.OneElement(), world.device)
    saved = _saved(saved_model, "local", world.device)
    saved_model(None).sum().backward()
    _assert_loads_back(
        lambda: small.fsdp1(small.OneElement(), world.device), saved_model, saved, "local"
    )


@pytest.mark.world(2)
def test_local_state_dict_survives_torch_save_and_load(world):
    """A LOCAL state dict (ShardedTensors of the flat shards) through ``torch.save`` and a
    weights-only ``torch.load`` that allows the classes a ShardedTensor pickles."""
    model = small.fsdp1(small.InnerOuter(world.device, inner_fsdp=True), world.device)
    saved = _saved(model, "local", world.device)
    buffer = io.BytesIO()
    torch.save(saved, buffer)
    buffer.seek(0)
    allowed = [
        sharded_tensor.Shard,
        sharded_tensor.ShardMetadata,
        sharded_tensor.ShardedTensor,
        sharded_tensor.ShardedTensor.ProcessGroupState,
        sharded_tensor_metadata.ShardedTensorMetadata,
        sharded_tensor_metadata.TensorProperties,
        sharded_tensor_metadata.MEM_FORMAT_ENCODING,
        sharding_spec.ChunkShardingSpec,
        remote_device._remote_device,
        getattr,
    ]
    with torch.serialization.safe_globals(allowed):
        reloaded = torch.load(buffer, weights_only=True)
    assert_trees_identical(reloaded, saved)


@pytest.mark.world(4)
def test_local_state_dict_resharded_to_half_the_ranks(world):
    """Four ranks' LOCAL flat shards, re-cut for two, load into a two-rank model (by torch
    and the oracle) whose full state dict is the four-rank model's."""

    model = small.fsdp1(small.InnerOuter(world.device, inner_fsdp=True), world.device)
    sgd(model)
    saved = _saved(model, "local", world.device)
    full_flats = {key: ri.gather_state_dict({key: value})[key] for key, value in saved.items()}
    expected = _saved(model, "full", world.device)
    half = SubWorld(world, world.size // 2)
    if not half.member:
        return
    for loader, load in LOADERS.items():
        resharded = {}
        for key, flat in full_flats.items():
            chunks = flat.chunk(half.size)
            offset = sum(chunk.numel() for chunk in chunks[: half.rank])
            shard = sharded_tensor.Shard.from_tensor_and_offsets(
                chunks[half.rank].clone(), [offset], half.rank
            )
            resharded[key] = sharded_tensor.init_from_local_shards(
                [shard], flat.shape, process_group=half.group
            )
        inner = small.InnerOuter(world.device, inner_fsdp=True, group=half.group)
        smaller = _zeroed(small.fsdp1(inner, world.device, process_group=half.group))
        load(smaller, resharded, "local", group=half.group)
        with (
            fsdp.FullyShardedDataParallel.state_dict_type(
                smaller, fsdp.StateDictType.FULL_STATE_DICT
            ),
            _loaded_by(loader),
        ):
            assert_state_dict_equal(dict(smaller.state_dict()), expected)


# ----- rank 0 save, sync_module_states, groups of one ------------------------------------


@pytest.mark.world(2)
@pytest.mark.parametrize("use_orig_params", [False, True], ids=["flat", "orig"])
def test_rank0_save_then_sync_module_states(world, use_orig_params):
    """Saved on rank 0 only, loaded by rank 0 into a plain model, broadcast by FSDP1's
    ``sync_module_states``: every rank then holds the saved model."""
    if world.device.type == "cpu":
        pytest.skip("FSDP1's sync_module_states needs the module on an accelerator")
    policy = fsdp_wrap.ModuleWrapPolicy({Block})
    source = small.fsdp1(
        seeded_transformer(), world.device, auto_wrap_policy=policy, use_orig_params=use_orig_params
    )
    with fsdp.FullyShardedDataParallel.summon_full_params(source, writeback=True), torch.no_grad():
        for tensor in source.parameters():
            tensor.add_(1.0)  # no zero left: a zeroed copy differs everywhere
    saved = _saved(source, "full_rank0_only", world.device)
    plain = _zeroed(seeded_transformer())
    if world.rank == 0:
        plain.load_state_dict(copy.deepcopy(saved), strict=True)
    synced = small.fsdp1(plain, world.device, auto_wrap_policy=policy, sync_module_states=True)
    assert_state_dict_equal(_values(synced), _values(source))


@pytest.mark.world(2)
def test_sharded_state_dict_in_groups_of_one(world):
    """Each rank its own one-rank group: a SHARDED save and load stay within the rank."""
    groups = [dist.new_group([rank]) for rank in range(world.size)]
    model = small.fsdp1(
        seeded_transformer(),
        world.device,
        process_group=groups[world.rank],
        auto_wrap_policy=fsdp_wrap.ModuleWrapPolicy({Block}),
    )
    with fsdp.FullyShardedDataParallel.state_dict_type(
        model, fsdp.StateDictType.SHARDED_STATE_DICT
    ):
        model.load_state_dict(model.state_dict())
    ours = ri.fsdp_state_dict(model, fsdp.StateDictType.SHARDED_STATE_DICT)
    fresh = _zeroed(
        small.fsdp1(
            seeded_transformer(),
            world.device,
            process_group=groups[world.rank],
            auto_wrap_policy=fsdp_wrap.ModuleWrapPolicy({Block}),
        )
    )
    ri.fsdp_load_state_dict(
        fresh, ours, fsdp.StateDictType.SHARDED_STATE_DICT, group=groups[world.rank]
    )
    assert_state_dict_equal(_values(fresh), _values(model))
    dist.barrier()


@pytest.mark.world(2)
def test_sharded_load_with_a_multi_backend_group(world):
    """A group with a CPU backend and the device's: SHARDED state loads from either device."""
    device_backend = dist.get_default_backend_for_device(world.device)
    backend = (
        "cpu:gloo"
        if world.device.type == "cpu"
        else f"cpu:gloo,{world.device.type}:{device_backend}"
    )
    group = dist.new_group(backend=backend)

    def make() -> nn.Module:
        return small.fsdp1(
            seeded_transformer(),
            world.device,
            process_group=group,
            use_orig_params=True,
            auto_wrap_policy=fsdp_wrap.ModuleWrapPolicy({Block}),
        )

    source = make()
    saved = _saved(source, "sharded", world.device)
    on_cpu = {key: value.cpu() for key, value in saved.items()}
    for where, given in (("as saved", saved), ("moved to the CPU", on_cpu)):
        for loader, load in LOADERS.items():
            fresh = _zeroed(make())
            load(fresh, copy.copy(given), "sharded", group=group)
            with _loaded_by(f"{loader}, {where}"):
                assert_state_dict_equal(_values(fresh), _values(source))


@pytest.mark.world(2, 4)
@pytest.mark.parametrize("kind", ["local", "sharded"])
def test_a_dcp_checkpoint_of_fsdp1s_own_state_dict_loads_into_another_model(world, kind):
    """Upstream's distributed-checkpoint flow: ``model.state_dict()`` under LOCAL (flat
    parameters' shards) or SHARDED state, saved by ``dcp.save``, read by ``dcp.load`` into a
    zeroed model's state dict of the same type and loaded by ``load_state_dict``: the model
    holds the saved one's values, at 2 and 4 ranks."""
    source = _trained_inner_outer(world, "fsdp")
    path = world.tmp_path / f"fsdp1-{kind}"
    dcp.save(torch_model_state_dict(source, kind, world.device), checkpoint_id=str(path))
    fresh = _zeroed(small.fsdp1(small.InnerOuter(world.device, inner_fsdp=True), world.device))
    _assert_differs(fresh, _values(source))
    template = torch_model_state_dict(fresh, kind, world.device)
    dcp.load(template, checkpoint_id=str(path))
    _torch_load(fresh, template, kind)
    assert_state_dict_equal(_values(fresh), _values(source))


@pytest.mark.world(4)
def test_a_sharded_checkpoint_loads_into_fsdp1_over_other_groups(world):
    """Upstream's resharding flow: SHARDED state saved by ``dcp.save`` at 4 ranks, then read
    by one ``dcp.load`` over the world into FSDP1 models each sharded over a group of its own
    (the even ranks, the odd ranks): every model holds the saved values."""
    source = _trained_inner_outer(world, "fsdp")
    path = world.tmp_path / "fsdp1-sharded"
    dcp.save(torch_model_state_dict(source, "sharded", world.device), checkpoint_id=str(path))
    groups = [dist.new_group(list(range(parity, world.size, 2))) for parity in (0, 1)]
    group = groups[world.rank % 2]
    inner = small.InnerOuter(world.device, inner_fsdp=True, group=group)
    fresh = _zeroed(small.fsdp1(inner, world.device, process_group=group))
    template = torch_model_state_dict(fresh, "sharded", world.device)
    dcp.load(template, checkpoint_id=str(path))
    _torch_load(fresh, template, "sharded", group=group)
    assert_state_dict_equal(_values(fresh), _values(source))
