"""DCP's experimental checkpointer (``torch.distributed.checkpoint._experimental``) saves what
each rank holds and reads it back whole, in part and strictly.

The package writes one ``torch.save`` file per rank (``checkpoint_<rank>.pt``) through a
``CheckpointWriter``, reads it through a ``CheckpointReader``, and offers a synchronous
checkpointer and an asynchronous one that stages the state (``DefaultStager``) and writes it
from a process of its own (``CheckpointProcess``). Upstream marks it experimental; the
check judges what it promises in its docstrings, on states of its own making: each rank's
values differ, so a file read by the wrong rank shows.

- **Synchronous** (``make_sync_checkpointer``, by default and given a config): a
  ``SyncCheckpointer`` whose save, given extra keyword arguments, writes the rank's file
  holding its state.
- **Loads**, through either checkpointer. The whole file comes back, strictly too, onto the
  rank's device and onto the CPU (``default_map_location``); ``torch.load``'s own arguments
  pass on (``weights_only=False`` reads a value of a class it does not know). A template
  reads only its keys: ``None`` leaves filled, given tensors written in place, nested dicts
  and lists, five dtypes kept. A strict load of a template with keys the file lacks raises
  naming exactly those; a non-strict one loads the rest. A checkpoint that is not there
  raises ``FileNotFoundError``.
- **Asynchronous** (``make_async_checkpointer``), staging in line and in the background: an
  ``AsyncCheckpointer``. Its save returns a staging and a write future that both complete
  with ``None``. Once staged, changing the state changes nothing written. A child process
  of the rank writes. Three saves in a row each hold their own state. A write that cannot
  be made fails its write future with the child's ``RuntimeError``, naming the path.
  Keyword arguments pass on to the stager and the writer, as ``save`` documents. On 2.13.0
  a failed write ends the writer process, and the check gives it time to end before
  closing: closing while it ends raises ``ProcessExitedException`` at random (the process
  dies by the signal its creating thread's exit sends).
- **The stager** (``_experimental.DefaultStager``): each option alone, all on, all off, and
  pinned memory with background staging and with non-blocking copies stage a copy equal to
  the state and independent of it, on the CPU (a tensor on the
  rank's device beside CPU ones), a future of one where staging is in the background; one
  stager stages three states in turn.

Non-blocking copies need an accelerator: on CPU worlds the asynchronous checkpointer runs
with them off, and the stager's cases that ask for them skip, naming it.
"""

from __future__ import annotations

import copy
import multiprocessing
import os
import re
import time
from concurrent.futures import Future
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import pytest
import torch

from conformance._upstream import dcp_experimental
from conformance.compare import assert_trees_identical, local_tensors_by_path

STAGER_OPTIONS = ("use_pinned_memory", "use_shared_memory", "use_async_staging")
WRITER_EXIT_LIMIT_S = 10


def _state(rank: int, version: int) -> dict[str, Any]:
    """A rank's state at ``version``: values of its own, five dtypes, nested containers."""
    generator = torch.Generator().manual_seed(1000 * rank + version)
    return {
        "model": {
            "weight": torch.randn(4, 3, generator=generator),
            "bias": torch.randn(4, generator=generator),
        },
        "dtypes": {
            "float32": torch.randn(3, generator=generator),
            "float64": torch.randn(3, generator=generator, dtype=torch.float64),
            "int32": torch.randint(-9, 9, (3,), generator=generator, dtype=torch.int32),
            "int64": torch.randint(-9, 9, (3,), generator=generator),
            "bool": torch.randint(0, 2, (3,), generator=generator).bool(),
        },
        "nested": {"list": [torch.full((2,), float(rank)), [33, torch.arange(3), [44, 55]]]},
        "deep": {"a": {"b": torch.full((2,), float(version))}},
        "step": version,
    }


def _rank_file(path: Path, rank: int) -> Path:
    return path / f"checkpoint_{rank}.pt"


def _accelerator_available() -> bool:
    return torch.accelerator.is_available()


@pytest.mark.world(1, 2)
def test_the_sync_checkpointer_saves_each_ranks_state_and_reads_it_back(world):
    experimental = dcp_experimental
    given = experimental.CheckpointerConfig(
        barrier_config=experimental.BarrierConfig(barrier_type=None)
    )
    for name, checkpointer in (
        ("default", experimental.make_sync_checkpointer()),
        ("given_config", experimental.make_sync_checkpointer(config=given)),
    ):
        try:
            assert isinstance(checkpointer, experimental.SyncCheckpointer), type(checkpointer)
            path = world.tmp_path / name
            state = _state(world.rank, 0)
            assert checkpointer.save(str(path), state, step=0, note="given to the writer") is None
            saved = torch.load(_rank_file(path, world.rank), weights_only=True)
            assert_trees_identical(saved, state)
            _judge_loads(world, checkpointer, path, state)
        finally:
            checkpointer.close()


def _judge_loads(world: Any, checkpointer: Any, path: Path, state: dict[str, Any]) -> None:
    """What a checkpointer's loads of the rank's file give: the whole, strictly and with
    ``torch.load``'s own arguments; on the rank's device and on the CPU; in part; and a
    refusal of what is not there."""
    assert_trees_identical(checkpointer.load(str(path), strict=True), state)
    for device in (world.device, torch.device("cpu")):
        placed = checkpointer.load(str(path), default_map_location=device)
        assert {t.device.type for t in _tensors_of(placed)} == {device.type}, (
            f"rank {world.rank}: a load onto {device} placed tensors on "
            f"{ {t.device for t in _tensors_of(placed)} }"
        )
        assert_trees_identical(placed, _on(state, device))
    _judge_partial_load(checkpointer, path, state)
    _judge_strict_load(world, checkpointer, path, state)
    with pytest.raises(FileNotFoundError, match="checkpoint_"):
        checkpointer.load(str(path.parent / f"{path.name}-never-saved"))


def _judge_partial_load(checkpointer: Any, path: Path, state: dict[str, Any]) -> None:
    """A template reads its keys alone: ``None`` leaves are filled (a dtype's tensor, a
    nested dict, a list), given tensors are written in place, and keys it lacks are left
    out."""
    given = {key: torch.empty_like(value) for key, value in state["dtypes"].items()}
    for dtypes in (given, dict.fromkeys(state["dtypes"])):
        template: dict[str, Any] = {
            "model": {"weight": None},
            "dtypes": dtypes,
            "nested": None,
            "deep": {"a": {"b": None}},
        }
        loaded = checkpointer.load(str(path), template)
        expected = {
            "model": {"weight": state["model"]["weight"]},
            "dtypes": state["dtypes"],
            "nested": state["nested"],
            "deep": state["deep"],
        }
        assert_trees_identical(loaded, expected)
        for key, tensor in given.items():
            assert dtypes is not given or loaded["dtypes"][key] is tensor, (
                f"dtypes.{key}: the load gave a new tensor, not the template's filled"
            )


def _judge_strict_load(world: Any, checkpointer: Any, path: Path, state: dict[str, Any]) -> None:
    """A template with keys the file lacks: a strict load names exactly those, a non-strict
    one loads the others and leaves them empty."""
    template = {
        "model": {"bias": None, "absent": None},
        "step": None,
        "absent_top": None,
        "absent_dict": {"x": None},
    }
    missing = ["model.absent", "absent_top", "absent_dict"]
    with pytest.raises(RuntimeError, match=re.escape(f"is missing keys: {missing}")):
        checkpointer.load(str(path), copy.deepcopy(template), strict=True)
    loaded = checkpointer.load(str(path), copy.deepcopy(template), strict=False)
    assert_trees_identical(
        {"bias": loaded["model"]["bias"], "step": loaded["step"]},
        {"bias": state["model"]["bias"], "step": state["step"]},
    )
    left = (loaded["model"]["absent"], loaded["absent_top"], loaded["absent_dict"])
    assert left == (None, None, {"x": None}), (
        f"rank {world.rank}: keys the checkpoint lacks are filled with {left}"
    )


def _tensors_of(tree: Any) -> list[torch.Tensor]:
    return [tensor for _, tensor in local_tensors_by_path(tree)]


def _on(tree: Any, device: torch.device) -> Any:
    """``tree`` with each tensor moved to ``device``."""
    if isinstance(tree, torch.Tensor):
        return tree.to(device)
    if isinstance(tree, dict):
        return {key: _on(value, device) for key, value in tree.items()}
    if isinstance(tree, list):
        return [_on(value, device) for value in tree]
    return tree


def _staging_config(in_background: bool) -> Any:
    """The stager's defaults but ``use_async_staging``, and non-blocking copies only where
    an accelerator is."""
    return dcp_experimental.CheckpointStagerConfig(
        use_async_staging=in_background, use_non_blocking_copy=_accelerator_available()
    )


@pytest.mark.world(1, 2)
@pytest.mark.parametrize("staging", ["in_line", "in_background"])
def test_the_async_checkpointer_writes_what_it_staged_in_order(world, staging):
    config = dcp_experimental.CheckpointerConfig(
        staging_config=_staging_config(staging == "in_background")
    )
    noted = world.tmp_path / f"writer-process-of-rank-{world.rank}"
    checkpointer = dcp_experimental.make_async_checkpointer(
        config=config,
        subprocess_init_fn=_note_the_writers_process,
        subprocess_init_args=(str(noted),),
    )
    try:
        assert isinstance(checkpointer, dcp_experimental.AsyncCheckpointer), type(checkpointer)
        state = _state(world.rank, 0)
        expected = copy.deepcopy(state)
        futures = checkpointer.save(str(world.tmp_path / "v0"), state)
        assert isinstance(futures, tuple), futures
        assert len(futures) == 2, futures
        assert all(isinstance(future, Future) for future in futures), futures
        staged, written = futures
        assert staged.result() is None, f"rank {world.rank}: staging completed with {staged}"
        for tensor in _tensors_of(state):
            tensor.logical_not_() if tensor.dtype == torch.bool else tensor.add_(1)
        assert written.result() is None
        writer_pid, writer_parent = (int(n) for n in noted.read_text().split())
        assert writer_parent == os.getpid(), (
            f"rank {world.rank} (pid {os.getpid()}): the file was written by pid {writer_pid}, "
            f"a child of {writer_parent}"
        )
        saved = torch.load(_rank_file(world.tmp_path / "v0", world.rank), weights_only=True)
        assert_trees_identical(saved, expected)
        _judge_loads(world, checkpointer, world.tmp_path / "v0", expected)

        saves = [
            (version, _state(world.rank, version), world.tmp_path / f"v{version}")
            for version in (1, 2, 3)
        ]
        pending = [checkpointer.save(str(path), state) for _, state, path in saves]
        for _, write in pending:
            write.result()
        for version, state, path in saves:
            assert_trees_identical(checkpointer.load(str(path)), state)
            assert checkpointer.load(str(path))["step"] == version

        blocked = world.tmp_path / f"a-file-of-rank-{world.rank}"
        blocked.write_text("a file where the checkpoint's folder would go")
        _, failing = checkpointer.save(str(blocked / "v4"), _state(world.rank, 4))
        with pytest.raises(RuntimeError, match=blocked.name):
            failing.result()
        _wait_for_the_end_of(writer_pid)
    finally:
        checkpointer.close()


def _wait_for_the_end_of(pid: int) -> None:
    """Give the child ``pid`` up to ``WRITER_EXIT_LIMIT_S`` to end, as the writer process does
    after a failed write on 2.13.0; a release that keeps it alive only waits. Closing the
    checkpointer while it ends races: the process dies by the signal its creating thread's
    exit sends (``PR_SET_PDEATHSIG``), and ``close`` raises ``ProcessExitedException``."""
    deadline = time.monotonic() + WRITER_EXIT_LIMIT_S
    while time.monotonic() < deadline and any(
        child.pid == pid for child in multiprocessing.active_children()
    ):
        time.sleep(0.05)


@pytest.mark.world(1)
def test_the_async_checkpointer_passes_keyword_arguments_on(world):
    """``AsyncCheckpointer.save`` documents its keyword arguments as passed to the stager and
    the writer, as the synchronous one passes them to the writer."""
    config = dcp_experimental.CheckpointerConfig(staging_config=_staging_config(False))
    checkpointer = dcp_experimental.make_async_checkpointer(config=config)
    try:
        state = _state(world.rank, 0)
        _, written = checkpointer.save(str(world.tmp_path / "v0"), state, step=0)
        written.result()
        assert_trees_identical(checkpointer.load(str(world.tmp_path / "v0")), state)
    finally:
        checkpointer.close()


def _note_the_writers_process(where: str) -> None:
    """The writer process's initialiser: it notes its pid and its parent's."""
    Path(where).write_text(f"{os.getpid()} {os.getppid()}")


@dataclass(frozen=True)
class _Note:
    """A value ``torch.load`` refuses under ``weights_only=True``: a class it does not know."""

    text: str


@pytest.mark.world(1)
def test_the_experimental_reader_passes_torch_load_arguments_on(world):
    """``CheckpointReader.read`` documents its keyword arguments as passed to ``torch.load``:
    ``weights_only=False`` must read back a value of a class ``torch.load`` does not know."""
    checkpointer = dcp_experimental.make_sync_checkpointer()
    try:
        state = {**_state(world.rank, 0), "note": _Note("kept")}
        checkpointer.save(str(world.tmp_path / "v0"), state)
        loaded = checkpointer.load(str(world.tmp_path / "v0"), weights_only=False)
        assert loaded["note"] == _Note("kept"), f"read back {loaded['note']!r}"
    finally:
        checkpointer.close()


# Each choice of the stager's flags: each alone, none, all, and pinned memory with each of
# the two ways of copying into it.
STAGER_CHOICES: dict[str, tuple[str, ...] | None] = {
    **{name: (name,) for name in (*STAGER_OPTIONS, "use_non_blocking_copy")},
    "all_off": (),
    "all_on": None,
    "pinned_async": ("use_pinned_memory", "use_async_staging"),
    "pinned_non_blocking": ("use_pinned_memory", "use_non_blocking_copy"),
}


@pytest.mark.world(1)
@pytest.mark.parametrize("option", list(STAGER_CHOICES))
def test_the_experimental_stager_stages_independent_copies(world, option):
    names = [field.name for field in fields(dcp_experimental.CheckpointStagerConfig)]
    chosen = STAGER_CHOICES[option]
    flags = {name: chosen is None or name in chosen for name in names}
    if flags.get("use_non_blocking_copy") and not _accelerator_available():
        pytest.skip(f"{option}: non-blocking copies need an accelerator; this world has none")
    config = dcp_experimental.CheckpointStagerConfig(**flags)
    stager = dcp_experimental.DefaultStager(config)
    try:
        for version in range(3):
            state = {**_state(world.rank, version), "on_device": torch.arange(4.0).to(world.device)}
            expected = {**copy.deepcopy(state), "on_device": torch.arange(4.0)}
            result = stager.stage(state)
            if config.use_async_staging:
                assert isinstance(result, Future), f"{option}: staging gave {type(result)}"
                result = result.result()
            assert_trees_identical(result, expected)
            for tensor in _tensors_of(state):
                tensor.zero_()
            assert_trees_identical(result, expected)
            if config.use_shared_memory:
                assert all(t.is_shared() for t in _tensors_of(result)), f"{option}: not shared"
    finally:
        stager.close()
