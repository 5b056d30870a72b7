"""The state-dict operations the benchmarks time, set up on each rank for one case.

``prepare`` builds the inputs once and returns the operation: the call each round times,
and what completes it after the clock stops (an async save's write). A round may change its
inputs in place (a load, a broadcast) but never their shapes, so every round does the same
work.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ci.bench.cases import OPS, BenchCase
from conformance import dcp, dsd, lookup

MIB = 1 << 20
TENSOR_BYTES = 256 * 1024  # utilities run on many tensors, as a model's state dict has
SLOWDOWN_ENV = "GATE_BENCH_SLOWDOWN"  # e.g. 0.10: every timed torch function 10% slower
EXTRA_MEMORY_ENV = "GATE_BENCH_EXTRA_MIB"  # e.g. 2: every timed torch function holds 2 MiB more


# A checkpoint that ``resharded_load`` loads is written by this parallelism, or by the
# second where the case's parallelism is the first: another layout of every tensor.
RESHARD_FROM = ("fsdp2", "tp")


@dataclass(frozen=True)
class Operation:
    """What a round times, and what completes the call's work after the clock stops."""

    run: Callable[[], object]
    finish: Callable[[object], object] | None = None


def prepare(case: BenchCase, world: Any, workdir: Path) -> Operation:
    """The operation of ``case`` on this rank, its inputs ready."""
    install_regressions(
        float(os.environ.get(SLOWDOWN_ENV, "0")), int(os.environ.get(EXTRA_MEMORY_ENV, "0"))
    )
    function = lookup(*OPS[case.op])
    if case.parallelism is None:
        return Operation(_utility(case, function, world))
    if case.op == "async_save":
        return Operation(_model_op(case, function, world, workdir), finish=_await_write)
    return Operation(_model_op(case, function, world, workdir))


def _await_write(response: Any) -> None:
    """Wait for an async save's write: its Future, or the upload of the response a stager
    that stages asynchronously returns."""
    from concurrent.futures import Future

    future = response if isinstance(response, Future) else response.upload_completion
    future.result()


def _tensors(case: BenchCase, device: Any, fill: float = 1.0) -> dict[str, Any]:
    import torch

    count = max(1, case.size_mib * MIB // TENSOR_BYTES)
    shape = (64, TENSOR_BYTES // 4 // 64)
    return {f"layer{i}.weight": torch.full(shape, fill, device=device) for i in range(count)}


def _sharded(state: dict[str, Any], world: Any) -> dict[str, Any]:
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = world.mesh(world.size, ("dp",))
    return {key: distribute_tensor(value, mesh, [Shard(0)]) for key, value in state.items()}


def _utility(case: BenchCase, function: Callable[..., Any], world: Any) -> Callable[[], object]:
    """Inputs on the world's device (an accelerator, or the CPU); copies go into a CPU
    companion."""
    import torch

    device = world.device
    source = _tensors(case, device)
    if case.op == "gather":
        sharded = _sharded(source, world)
        return lambda: function(sharded)
    if case.op in ("offload", "create_cpu"):
        return lambda: function(source)
    if case.op == "copy":
        companion = _tensors(case, torch.device("cpu"), fill=0.0)
        return lambda: function(source, companion)
    if case.op == "broadcast":
        local = _tensors(case, device, fill=0.0)
        full = source if world.rank == 0 else {}
        return lambda: function(full, local, device=device)
    local_shards = _sharded(_tensors(case, device, fill=0.0), world)
    return lambda: function(source, local_shards, device=device)  # distribute


def _trained(parallelism: str, size_mib: int, world: Any) -> tuple[Any, Any]:
    """A model of about ``size_mib`` MiB of state, wrapped in ``parallelism``, and its Adam
    optimizer, one step taken; built once per rank process and shared by the cases of that
    cell and size, as one training job's model serves its saves, loads and state dicts
    (building them was most of a run's set-up)."""
    key = (parallelism, size_mib)
    if key not in _TRAINED:
        _TRAINED[key] = _train(parallelism, size_mib, world)
    return _TRAINED[key]


_TRAINED: dict[tuple[str, int], tuple[Any, Any]] = {}


def _train(parallelism: str, size_mib: int, world: Any) -> tuple[Any, Any]:
    import torch

    from conformance import PARALLELISMS, MLPWithBuffers, batch

    hidden = size_mib * MIB // 4 // 13  # fc1 (7 + 1) and fc2 (5) values per unit
    torch.manual_seed(0)
    model = PARALLELISMS[parallelism].wrap(MLPWithBuffers(hidden).to(world.device), world)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    model(batch(0).to(world.device)).sum().backward()
    optimizer.step()
    return model, optimizer


def writer_of(parallelism: str) -> str:
    """The parallelism that writes the checkpoint a resharded load into ``parallelism``
    reads."""
    return RESHARD_FROM[1] if parallelism == RESHARD_FROM[0] else RESHARD_FROM[0]


def _written_by_another_layout(case: BenchCase, world: Any, workdir: Path) -> Path:
    """A checkpoint of the case's model and optimizer written under another parallelism
    (``RESHARD_FROM``), so that loading it reshards every tensor; written once per rank
    process for each writer and size."""
    from conformance import PARALLELISMS

    source = writer_of(str(case.parallelism))
    if not PARALLELISMS[source].supports(world.size):
        raise ValueError(
            f"{case.name}: {source} writes its checkpoint, and it does not run at "
            f"{world.size} ranks"
        )
    checkpoint = workdir / f"written-by-{source}-{case.size_mib}MiB"
    if checkpoint not in _WRITTEN:
        model, optimizer = _trained(source, case.size_mib, world)
        model_state, optim_state = dsd.get_state_dict(model, optimizer)
        dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=checkpoint)
        _WRITTEN.add(checkpoint)
    return checkpoint


_WRITTEN: set[Path] = set()


def _model_op(
    case: BenchCase, function: Callable[..., Any], world: Any, workdir: Path
) -> Callable[[], object]:
    model, optimizer = _trained(str(case.parallelism), case.size_mib, world)
    if case.op == "get_state_dict":
        return lambda: function(model, optimizer)
    model_state, optim_state = dsd.get_state_dict(model, optimizer)
    if case.op == "set_state_dict":
        # Fresh outer dicts each round: torch 2.13 renames a DDP caller's keys in place
        # (see test_set_state_dict_leaves_the_callers_dicts_unchanged).
        return lambda: function(
            model,
            optimizer,
            model_state_dict=dict(model_state),
            optim_state_dict={**optim_state, "state": dict(optim_state["state"])},
        )
    state = {"model": model_state, "optim": optim_state}
    checkpoint = workdir / case.name
    if case.op in ("dcp_save", "async_save"):
        return lambda: function(state, checkpoint_id=checkpoint)
    if case.op == "resharded_load":
        checkpoint = _written_by_another_layout(case, world, workdir)
    else:
        dcp.save(state, checkpoint_id=checkpoint)
    return lambda: function(state, checkpoint_id=checkpoint)  # dcp_load, resharded_load


def install_regressions(slowdown: float, extra_mib: int) -> None:
    """Make every timed torch function busy for ``slowdown`` of its own duration after it
    runs, and hold a filled buffer of ``extra_mib`` MiB while it runs: regressions of known
    size, for showing that a comparison flags them."""
    if slowdown <= 0 and extra_mib <= 0:
        return
    import importlib

    for module_name, name in OPS.values():
        module = importlib.import_module(module_name)
        original = getattr(module, name)
        if getattr(original, "_regressed", False):
            continue
        setattr(module, name, with_regressions(original, slowdown, extra_mib))


def with_regressions(
    function: Callable[..., Any], slowdown: float, extra_mib: int
) -> Callable[..., Any]:
    """``function``, busy for ``slowdown`` of its own duration after each call and holding
    ``extra_mib`` MiB more during it."""
    import torch

    def regressed(*args: Any, **kwargs: Any) -> Any:
        held = torch.ones(extra_mib * MIB // 4) if extra_mib > 0 else None
        start = time.perf_counter()
        result = function(*args, **kwargs)
        busy_until(start + (1 + max(0.0, slowdown)) * (time.perf_counter() - start))
        del held
        return result

    regressed._regressed = True  # type: ignore[attr-defined]
    return regressed


def busy_until(deadline: float) -> None:
    """Spin until ``time.perf_counter()`` reaches ``deadline``: a slower function is busier,
    and a sleep is not exact (one of 0.1 ms took 0.19 ms here, so a call of 1 ms became
    about 20% slower, not 10%). Like a slower Python call it holds the GIL meanwhile: an
    async save's write, which is not timed, waits for it."""
    while time.perf_counter() < deadline:
        pass
