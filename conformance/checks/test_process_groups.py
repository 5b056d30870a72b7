"""Saves and loads beyond the world's default group: no process group at all, a group
without global rank 0, a coordinator other than rank 0, and ranks that hold their state's
keys in different orders.

- **No process group.** ``get_state_dict``, ``set_state_dict``, ``dcp.save`` and ``dcp.load``
  promise to work in a process that never initialized ``torch.distributed`` (DCP then runs
  as one rank). A fresh interpreter (``_without_a_process_group.py``) trains the MLP and
  does each, full and offloaded too, and loads the optimizer's own id-keyed dict; its
  results must equal the oracle's state dict of the same run, bit for bit.
- **A group without global rank 0.** On a 2 x 2 mesh each row saves and loads a checkpoint
  of its own over its own group (``process_group=``): rows ``{0, 1}`` and ``{2, 3}`` at
  once. The second row's coordinator is global rank 2 (pytorch#152310 broadcast from global
  rank 0). Every value comes back, and each checkpoint holds its row's keys alone, also when
  saved with ``use_collectives=False`` (each rank records its own writes, and ``dcp.load``
  reads those records).
- **Another coordinator.** ``save_state_dict`` and ``load_state_dict`` (deprecated, still
  shipped) take ``coordinator_rank``; with the last rank as coordinator the checkpoint must
  read back as one saved by ``dcp.save`` does.
- **Keys in another order.** Rank 0 holds ``{"A", "B"}``, the others ``{"B", "A"}``, both
  ``Stateful`` objects whose ``load_state_dict`` runs a collective: DCP must call them in
  one order on every rank (else the collectives pair wrongly or hang) and give each its
  own saved state.
- **The job's store under a prefix.** With ``DCP_USE_PREFIX_STORE=1`` the process
  checkpointer's processes make their group in the job's own store (``MASTER_ADDR``,
  ``MASTER_PORT``) under a prefix, asking no free port. The variable is read as the processes
  start, so the check ends any this trainer started before, and asks a fresh world after it.
  An async save through them loads back, bit for bit, what was saved.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

import reference_impl as ri
from conformance._upstream import dcp, dtensor, quiet_deprecations, with_parameters
from conformance.compare import assert_trees_identical, every_rank
from conformance.models.common import seeded_mlp
from conformance.models.optimizers import adam
from conformance.training import read_whole, skip_unless_checkpointer, start_async_save

HELPER = "conformance.checks._without_a_process_group"
HELPER_DEADLINE_S = 120


def _run_without_a_process_group(out: Path) -> None:
    """The helper in a fresh interpreter; its output on failure names what went wrong."""
    out.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [sys.executable, "-m", HELPER, str(out)],
        capture_output=True,
        text=True,
        timeout=HELPER_DEADLINE_S,
        check=False,
    )
    assert done.returncode == 0, (
        f"the run without a process group exited {done.returncode}:\n{done.stderr[-4000:]}"
    )


def _rebuilt(raw: dict[str, Any]) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The helper's run rebuilt here from its own ``state_dict()``s."""
    model = seeded_mlp()
    optimizer = adam(model)
    model.load_state_dict(raw["model"])
    optimizer.load_state_dict(raw["optimizer"])
    return model, optimizer


@pytest.mark.world(1)
def test_state_dicts_and_dcp_work_without_a_process_group(world):
    out = world.tmp_path / "no-process-group"
    _run_without_a_process_group(out)

    def read(name: str) -> Any:
        return torch.load(out / name, weights_only=True)

    assert read("initialized.pt") == [False, False, False], (
        "the helper's process initialized torch.distributed"
    )
    model, optimizer = _rebuilt(read("raw.pt"))
    expected = ri.get_state_dict(model, optimizer)
    got = read("got.pt")
    assert_trees_identical(tuple(got), tuple(expected), "get_state_dict")
    assert_trees_identical(tuple(read("got_after_set.pt")), tuple(expected), "after set_state_dict")
    assert_trees_identical(
        tuple(read("got_after_own_set.pt")), tuple(expected), "after a set of its own dict"
    )
    full = ri.get_model_state_dict(model, options=ri.StateDictOptions(full_state_dict=True))
    assert_trees_identical(read("got_full.pt"), full, "full, offloaded get_model_state_dict")
    assert_trees_identical(tuple(read("loaded.pt")), tuple(expected), "dcp.save then dcp.load")


def _row_state(mesh: Any, row: int, saved: bool) -> dict[str, Any]:
    """What a row saves (``saved``): a DTensor sharded over the row, a tensor the row
    replicates, a tensor and a value of each rank's own, all made from the row and the rank
    and none zero; else a template of the same shapes holding -1 throughout."""
    rank = dist.get_rank()
    whole = torch.arange(1, 13, dtype=torch.float32).reshape(6, 2) + 100 * row
    replicated = torch.full((3,), float(row + 1))
    own = torch.full((2,), float(rank + 1))
    value = {"row": row, "rank": rank}
    if not saved:
        whole, replicated, own = (torch.full_like(t, -1.0) for t in (whole, replicated, own))
        value = {"row": -1, "rank": -1}
    return {
        f"row{row}.sharded": dtensor.distribute_tensor(whole, mesh, [dtensor.Shard(0)]),
        f"row{row}.replicated": replicated,
        f"row{row}.rank{rank}": own,
        f"row{row}.rank{rank}.value": value,
    }


@pytest.mark.world(4)
@pytest.mark.parametrize("collectives", [True, False], ids=["collectives", "no_collectives"])
def test_a_group_without_global_rank_0_saves_and_loads_its_own_checkpoint(world, collectives):
    mesh = world.mesh((2, 2), ("row", "column"))
    row = world.rank // 2
    row_mesh = mesh["column"]
    group = row_mesh.get_group()
    checkpoint = str(world.tmp_path / f"row{row}")
    saved = _row_state(row_mesh, row, saved=True)
    save = dcp.save if collectives else with_parameters(dcp.save, "use_collectives")
    save_options = {} if collectives else {"use_collectives": False}
    save(saved, checkpoint_id=checkpoint, process_group=group, **save_options)
    loaded = _row_state(row_mesh, row, saved=False)
    dcp.load(loaded, checkpoint_id=checkpoint, process_group=group)
    assert_trees_identical(loaded, saved, f"rank {world.rank}, row {row}")

    world.barrier()
    reader = dcp.FileSystemReader(checkpoint)
    if collectives:
        keys = set(reader.read_metadata().state_dict_metadata)
    else:  # each rank recorded its own writes, in ``__<rank in the group>.metadata``
        keys = {key for r in (0, 1) for key in reader.read_metadata(rank=r).state_dict_metadata}
    row_ranks = (2 * row, 2 * row + 1)
    expected = {f"row{row}.sharded", f"row{row}.replicated"} | {
        key
        for rank in row_ranks
        for key in (
            f"row{row}.rank{rank}",
            f"row{row}.rank{rank}.value.row",
            f"row{row}.rank{rank}.value.rank",
        )
    }
    assert keys == expected, f"rank {world.rank}: row {row}'s checkpoint records {sorted(keys)}"


@pytest.mark.world(2, 4)
def test_a_coordinator_other_than_rank_0_saves_what_rank_0_saves(world):
    mesh = world.mesh(world.size)
    saved = _row_state(mesh, 0, saved=True)
    coordinator = world.size - 1
    with quiet_deprecations():
        dcp.save_state_dict(
            saved,
            storage_writer=dcp.FileSystemWriter(str(world.tmp_path / "coordinated")),
            coordinator_rank=coordinator,
        )
        dcp.save(saved, checkpoint_id=str(world.tmp_path / "default"))
        loaded = _row_state(mesh, 0, saved=False)
        dcp.load_state_dict(
            loaded,
            storage_reader=dcp.FileSystemReader(str(world.tmp_path / "coordinated")),
            coordinator_rank=coordinator,
        )
    assert_trees_identical(
        loaded, saved, f"rank {world.rank}, loaded with coordinator {coordinator}"
    )
    world.barrier()
    assert_trees_identical(
        read_whole(world, "coordinated"),
        read_whole(world, "default"),
        f"rank {world.rank}: saved with coordinator {coordinator} against rank 0",
    )


class _Collective:
    """A ``Stateful`` whose load runs a collective (``all_gather`` or ``all_reduce``), notes
    its name in ``order`` and keeps what it was given."""

    def __init__(self, name: str, op: str, order: list[str]) -> None:
        self.name = name
        self.op = op
        self.order = order
        self.value = torch.full((2,), 10.0 if name == "A" else 20.0)  # replicated: one per key
        self.loaded: torch.Tensor | None = None

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.order.append(self.name)
        mine = torch.full((1,), float(dist.get_rank()))
        if self.op == "all_gather":
            dist.all_gather([torch.zeros(1) for _ in range(dist.get_world_size())], mine)
        else:
            dist.all_reduce(mine)
        self.loaded = state_dict["value"].clone()


@pytest.mark.world(2, 4)
def test_stateful_objects_load_in_one_order_whatever_order_each_rank_holds_them(world):
    order: list[str] = []
    objects = {
        "A": _Collective("A", "all_gather", order),
        "B": _Collective("B", "all_reduce", order),
    }
    names = ("A", "B") if world.rank == 0 else ("B", "A")
    state = {name: objects[name] for name in names}
    dcp.save(state, checkpoint_id=str(world.tmp_path / "ordered"))
    saved = {name: objects[name].value.clone() for name in names}
    for obj in objects.values():
        obj.value.zero_()
    dcp.load(state, checkpoint_id=str(world.tmp_path / "ordered"))
    orders = every_rank(order)
    assert all(each == orders[0] for each in orders), f"the ranks loaded in the orders {orders}"
    for name in names:
        loaded = objects[name].loaded
        assert loaded is not None, f"rank {world.rank}: {name}'s load_state_dict was not called"
        assert torch.equal(loaded, saved[name]), (
            f"rank {world.rank}: {name} loaded {loaded.tolist()}, saved {saved[name].tolist()}"
        )


@pytest.mark.world(2)
def test_the_process_checkpointer_can_join_the_jobs_store_under_a_prefix(world):
    skip_unless_checkpointer("process")
    if not world.respawn_after_test():
        pytest.skip("the checkpointer process starts once per trainer; torchrun cannot respawn")
    executor = importlib.import_module("torch.distributed.checkpoint._async_process_executor")
    init_info = getattr(executor, "_ProcessGroupInitInfo", None)
    if "use_prefix_store" not in getattr(init_info, "__annotations__", {}):
        pytest.skip("this release's process checkpointer has no DCP_USE_PREFIX_STORE")
    executor._CHECKPOINT_PROCESS = None  # an earlier test's process ends as it is dropped
    state = {f"rank{world.rank}": torch.arange(64.0) + world.rank, "shared": torch.ones(8)}
    checkpoint = world.tmp_path / "prefixed"
    group = dist.new_group(backend="gloo")
    job_store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False
    )
    keys_before = job_store.num_keys()
    os.environ["DCP_USE_PREFIX_STORE"] = "1"
    try:
        start_async_save(state, checkpoint, None, "process", group).finish()
    finally:
        del os.environ["DCP_USE_PREFIX_STORE"]
    assert job_store.num_keys() > keys_before, (
        f"rank {world.rank}: the checkpointer processes wrote no key to the job's store"
    )
    loaded = {key: torch.zeros_like(value) for key, value in state.items()}
    dcp.load(loaded, checkpoint_id=str(checkpoint))
    assert_trees_identical(loaded, state, f"rank {world.rank}")
