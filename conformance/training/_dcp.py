"""Checkpoints through ``torch.distributed.checkpoint``, as a training loop takes them.

The torch build's ``get_state_dict`` gives what DCP saves and the shapes DCP
loads into; ``set_state_dict`` then puts the loaded state back. A scheduler's state, where
there is one, travels beside them as plain values, as training loops keep it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from conformance._upstream import dcp, dsd, with_parameters
from conformance.cells import PARALLELISMS
from conformance.compare import holds_a_part
from conformance.models.common import train
from conformance.training._trajectory import Training, trained

Scheduler = torch.optim.lr_scheduler.LRScheduler


def training_state(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Scheduler | None,
    *,
    flatten: bool | None = None,
) -> dict[str, Any]:
    """What a training loop checkpoints: ``get_state_dict``'s model and optimizer state (the
    shapes DCP saves and loads into) and the scheduler's state.

    The optimizer state is nested, or flattened (``flatten_optimizer_state_dict``) where
    ``flatten`` says so, by default where the rank holds a part of the model (a pipeline
    stage, its experts): upstream's form for MPMD. Nested, each part's param groups would be
    saved under the same keys with other parameter names, and DCP keeps one part's (a resumed
    part then finds no group for its parameters). A checkpoint is read in the form it was
    written in."""
    flat = holds_a_part(model) if flatten is None else flatten
    options = dsd.StateDictOptions(flatten_optimizer_state_dict=True) if flat else None
    model_state, optim_state = dsd.get_state_dict(model, optimizer, options=options)
    state = {"model": model_state, "optim": optim_state}
    if scheduler is not None:
        state["scheduler"] = scheduler.state_dict()
    return state


def refusal_of(load: Callable[[], Any]) -> BaseException | None:
    """The error ``load`` raised (DCP's ``CheckpointException``, which derives from
    ``BaseException``), or None where it loaded."""
    try:
        load()
    except dcp.CheckpointException as refused:
        return refused
    return None


def save_checkpoint(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    path: str | None,
    *,
    scheduler: Scheduler | None = None,
    flatten: bool | None = None,
    **kwargs: Any,
) -> None:
    """Save the model's, optimizer's and scheduler's state under ``path`` (``flatten``: see
    ``training_state``; ``kwargs`` go to ``dcp.save``). ``path`` None: the ``storage_writer``
    in ``kwargs`` knows where (see ``load_checkpoint``)."""
    state = training_state(model, optimizer, scheduler, flatten=flatten)
    where = {} if path is None else {"checkpoint_id": path}
    dcp.save(state, **where, **kwargs)


def load_checkpoint(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    path: str | None,
    *,
    scheduler: Scheduler | None = None,
    flatten: bool | None = None,
    **kwargs: Any,
) -> None:
    """Load ``path`` into the model, optimizer and scheduler (``flatten``: see
    ``training_state``; ``kwargs`` go to ``dcp.load``). ``path`` None: the
    ``storage_reader`` in ``kwargs`` knows where the checkpoint is (a ``checkpoint_id`` would
    point it there anew, without the options it was made with)."""
    state = training_state(model, optimizer, scheduler, flatten=flatten)
    where = {} if path is None else {"checkpoint_id": path}
    dcp.load(state, **where, **kwargs)
    dsd.set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
    )
    if scheduler is not None:
        scheduler.load_state_dict(state["scheduler"])


def load_options_for(loaders: Any) -> dict[str, Any]:
    """``dcp.load``'s options for the members of the sub-world ``loaders``: ``no_dist`` for one
    rank alone, else the members' group. Every rank of the world calls it before the members
    go on alone, so that a release whose ``dcp.load`` lacks ``no_dist`` (2.6) skips the test
    on every rank alike."""
    if loaders.size == 1:
        with_parameters(dcp.load, "no_dist")
        return {"no_dist": True}
    return {"process_group": loaders.group} if loaders.member else {}


def trained_after_a_checkpoint(world: Any, cell: str, recipe: str, steps: int) -> Training:
    """``cell`` trained ``steps`` steps with ``recipe``, its state one step earlier saved by
    ``dcp.save`` at ``world.tmp_path / "previous"``: a checkpoint that a later save's
    failure must leave as it was."""
    parallelism = PARALLELISMS[cell]
    parallelism.skip_unless_runnable(world.device)
    model, optimizer, scheduler = training = trained(parallelism, world, recipe, steps - 1)
    dcp.save(training_state(model, optimizer, None), checkpoint_id=str(world.tmp_path / "previous"))
    train(model, optimizer, 1, scheduler, start=steps - 1)
    return training


def file_hashes(path: Path) -> dict[str, str]:
    """Every file under ``path`` by its path, with the hash of its bytes: what a refused save
    or load must leave as it was."""
    return {
        str(file.relative_to(path)): hashlib.sha256(file.read_bytes()).hexdigest()
        for file in sorted(path.rglob("*"))
        if file.is_file()
    }


def spoiled_hugging_face_file(
    world: Any, state: dict[str, torch.Tensor], spoil: Callable[[Path], None]
) -> Path:
    """``state`` saved by rank 0 alone through ``HuggingFaceStorageWriter`` under the world's
    temporary folder, its safetensors file then spoiled by ``spoil`` there; every rank waits
    for it and gets the file. Every rank skips where the build lacks the writer."""
    pytest.importorskip("safetensors")
    writer_class = dcp.HuggingFaceStorageWriter
    path = world.tmp_path / "hf"
    if world.rank == 0:
        dcp.save(state, storage_writer=writer_class(str(path)), no_dist=True)
        (file,) = path.glob("*.safetensors")
        spoil(file)
    world.barrier()
    (file,) = path.glob("*.safetensors")
    return file
