"""What a rank holds of the machine (``conformance.training.read_resources``) sees each kind of
leak a save could leave: a child process and what it holds, shared memory, a descriptor, a
thread."""

from __future__ import annotations

import mmap
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from ci.gate.report_files import PLOTS_DIR_ENV as GATE_PLOTS_DIR_ENV
from conformance.training import descendants, plot_path, plot_readings, read_resources
from conformance.training._resource_plot import PLOTS_DIR_ENV

MIB = 2**20


def test_a_child_and_its_grandchild_are_counted_with_what_they_hold() -> None:
    before = read_resources()
    sleep = "import time; time.sleep(60)"
    script = f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {sleep!r}]); {sleep}"
    child = subprocess.Popen([sys.executable, "-c", script])
    try:
        while len(descendants(os.getpid())) < 2:  # the grandchild starts
            pass
        during = read_resources()
    finally:
        for pid in descendants(os.getpid())[::-1]:
            os.kill(pid, 9)
        child.wait()
    assert during.children == before.children + 2
    assert during.rss > before.rss
    assert during.threads >= before.threads + 2


def test_shared_memory_is_counted_once_whether_mapped_or_open() -> None:
    before = read_resources()
    with tempfile.NamedTemporaryFile(dir="/dev/shm") as shared:
        shared.truncate(4 * MIB)
        mapped = mmap.mmap(shared.fileno(), 4 * MIB)
        try:
            during = read_resources()
        finally:
            mapped.close()
    assert during.shared - before.shared == 4 * MIB
    assert during.fds == before.fds + 2  # the file, and the descriptor its mapping keeps


def test_a_thread_is_counted() -> None:
    release = threading.Event()
    before = read_resources()
    thread = threading.Thread(target=release.wait)
    thread.start()
    try:
        during = read_resources()
    finally:
        release.set()
        thread.join()
    assert during.threads == before.threads + 1


def test_readings_are_plotted_where_the_gate_asks(tmp_path: Path, monkeypatch) -> None:
    assert PLOTS_DIR_ENV == GATE_PLOTS_DIR_ENV  # the gate's name for the folder is the checks'
    monkeypatch.delenv(PLOTS_DIR_ENV, raising=False)
    assert plot_path("x") is None
    monkeypatch.setenv(PLOTS_DIR_ENV, str(tmp_path / "plots"))
    path = plot_path("readings")
    assert path == tmp_path / "plots" / "readings.png"
    reading = read_resources()
    plot_readings([[reading.as_dict()] * 4] * 2, reading, 2, "two ranks", path)
    assert path.read_bytes().startswith(b"\x89PNG")
