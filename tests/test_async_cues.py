"""The async checks' storage writers: they stage only where asked, travel pickled with their
cue, and hold, fail or refuse exactly as cued."""

from __future__ import annotations

import os
import pickle
import threading
from pathlib import Path

import pytest
from torch.distributed.checkpoint.staging import AsyncStager

from conformance.training import (
    STAGINGS,
    CuedStagingWriter,
    CuedWriter,
    Die,
    Fail,
    Gate,
    Hold,
    InjectedWriteError,
    Unheld,
    cued_writer,
)


def test_a_writer_stages_only_where_the_staging_choice_says(tmp_path: Path) -> None:
    plain = cued_writer(tmp_path / "a", Unheld(), STAGINGS["default"])
    staging = cued_writer(tmp_path / "b", Unheld(), STAGINGS["writer"])
    assert type(plain) is CuedWriter
    assert not isinstance(plain, AsyncStager)
    assert not hasattr(plain, "stage")
    assert isinstance(staging, CuedStagingWriter)
    assert isinstance(staging, AsyncStager)


def test_a_writer_travels_pickled_with_its_cue_and_says_it_was_handed_over(tmp_path: Path) -> None:
    writer = CuedWriter(tmp_path / "checkpoint", Hold(rank=3))
    copy = pickle.loads(pickle.dumps(writer))
    assert Gate(tmp_path / "checkpoint", 3).handed_mark.exists()
    assert copy._cue == Hold(rank=3)
    assert Path(str(copy.path)) == Path(str(writer.path))


def test_a_held_write_waits_for_its_own_ranks_release(tmp_path: Path) -> None:
    checkpoint = tmp_path / "checkpoint"
    done = threading.Event()

    def write() -> None:
        Hold(rank=1).before_write(checkpoint)
        done.set()

    writing = threading.Thread(target=write)
    writing.start()
    Gate(checkpoint, 1).wait_until_held("thread")
    Gate(checkpoint, 0).release()  # another rank's release lets nothing go
    assert not done.wait(0.2)
    Gate(checkpoint, 1).release()
    writing.join(timeout=5)
    assert done.is_set()


def test_a_failing_write_fails_on_its_rank_alone(tmp_path: Path) -> None:
    Fail(rank=1, writer_rank=0).before_write(tmp_path)
    with pytest.raises(InjectedWriteError, match="injected write failure on rank 1"):
        Fail(rank=1, writer_rank=1).before_write(tmp_path)


def test_a_dying_write_never_kills_the_trainer(tmp_path: Path) -> None:
    Die(rank=1, writer_rank=0, trainer_pid=os.getpid()).before_write(tmp_path)
    with pytest.raises(RuntimeError, match="only in a checkpointer process"):
        Die(rank=1, writer_rank=1, trainer_pid=os.getpid()).before_write(tmp_path)
