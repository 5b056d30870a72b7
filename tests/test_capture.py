"""Per-test capture at the descriptor level: Python and C output alike, read back after a crash."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from harness._capture import _MAX_SHOWN, FdCapture, capture_path, read_capture


def test_python_and_descriptor_writes_are_captured_and_fds_restored(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    with capfd.disabled():  # a rank process has no pytest capture of its own
        before = os.fstat(1).st_ino, os.fstat(2).st_ino
        with FdCapture(tmp_path, rank=3).during_test():
            # Flushed as a rank's unbuffered streams (PYTHONUNBUFFERED=1) would be.
            print("python stdout", flush=True)
            sys.stderr.write("python stderr\n")
            sys.stderr.flush()
            os.write(1, b"raw fd 1\n")
            os.write(2, b"raw fd 2\n")
        assert (os.fstat(1).st_ino, os.fstat(2).st_ino) == before
    assert read_capture(tmp_path, 3, "stdout") == "python stdout\nraw fd 1\n"
    assert read_capture(tmp_path, 3, "stderr") == "python stderr\nraw fd 2\n"


def test_each_test_starts_with_empty_capture_files(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    capture = FdCapture(tmp_path, rank=0)
    with capfd.disabled():
        with capture.during_test():
            print("a long line from the first test")
        with capture.during_test():
            print("second")
    assert read_capture(tmp_path, 0, "stdout") == "second\n"


def test_missing_capture_reads_empty(tmp_path: Path) -> None:
    assert read_capture(tmp_path, 0, "stdout") == ""


def test_long_capture_keeps_the_tail_and_says_how_much_was_cut(tmp_path: Path) -> None:
    path = capture_path(tmp_path, 0, "stdout")
    path.write_bytes(b"a" * 100 + b"b" * _MAX_SHOWN)
    text = read_capture(tmp_path, 0, "stdout")
    assert text.startswith("[... 100 bytes cut ...]\n")
    assert text.endswith("b" * _MAX_SHOWN)


def test_a_rank_reads_its_own_capture_of_the_last_test(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    capture = FdCapture(tmp_path, rank=1)
    with capfd.disabled():
        with capture.during_test():
            print("from the first test")
        with capture.during_test():
            os.write(1, b"out\n")
            os.write(2, b"a" * 7 + b"b" * _MAX_SHOWN)
    assert capture.captured() == {
        "stdout": "out\n",
        "stderr": "[... 7 bytes cut ...]\n" + "b" * _MAX_SHOWN,
    }
    assert capture.captured()["stderr"] == read_capture(tmp_path, 1, "stderr")
