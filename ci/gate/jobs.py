"""Jobs of one gate run side by side on one host: ``python -m ci.gate --jobs N``.

A world of ranks spends much of a test waiting (in gloo's rounds of a collective, for its
slowest rank), so one pytest session leaves a CPU host's cores partly idle. ``--jobs N`` runs
N pytest sessions at once over the same ids (the runner's own part where ``--gate-shard`` is
given too), each running the groups of ids it claims first in a directory they share
(``ci.gate.shard``: a module's tests at one world size, the dearest first), and merges their
results and junit XML (``ci.gate.merge``) into the run's ``--out``: the ids, outcomes and
report of one session. Each job writes into
``--out/jobs/J``, and its output reaches the console line by line, each line prefixed
``[job J/N]``.

``auto`` is one job per core of the host for worlds of CPU tensors, as many as its memory
holds at :data:`MEMORY_PER_JOB` each, and one job for accelerator worlds: their ranks bind
the host's devices, which two jobs would share.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final, TextIO

import pytest

from ci.gate.merge import merge_files, worst_status
from ci.gate.results import NO_RESULTS_EXIT

AUTO: Final = "auto"
NO_TESTS: Final = int(pytest.ExitCode.NO_TESTS_COLLECTED)
# A job's share of memory: at 4 ranks on 2.13.0, each rank held 0.4 to 0.7 GiB resident and
# each rank index's template 0.4 GiB (most of it shared with the ranks it forked).
MEMORY_PER_JOB: Final = 4 * 2**30
_MEMINFO: Final = Path("/proc/meminfo")
# How long a job may take to stop on its own once the gate is interrupted: a session's
# worlds are torn down and its report written within seconds.
STOP_GRACE_S: Final = 30.0


def parse_jobs(text: str) -> int | None:
    """``--jobs``: a count of at least 1, or None for ``auto``."""
    if text == AUTO:
        return None
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"--jobs is a count of at least 1 or {AUTO}, not {text!r}")
    return int(text)


def auto_jobs(device_type: str) -> int:
    """``auto``'s count for worlds of ``device_type`` on this host."""
    if device_type != "cpu":
        return 1
    affinity = getattr(os, "sched_getaffinity", None)
    cores = (len(affinity(0)) if affinity is not None else os.cpu_count()) or 1
    available = _available_memory()
    by_memory = available // MEMORY_PER_JOB if available is not None else cores
    return max(1, min(cores, by_memory))


def _available_memory() -> int | None:
    if not _MEMINFO.exists():
        return None
    for line in _MEMINFO.read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return None


def job_directories(out: Path, count: int) -> list[Path]:
    """Where each of ``count`` jobs writes its report."""
    return [out / "jobs" / str(job) for job in range(1, count + 1)]


def run_side_by_side(
    commands: Sequence[list[str]], cwd: Path, console: TextIO = sys.stdout
) -> list[int]:
    """Run ``commands`` at once in ``cwd``, each output line prefixed ``[job J/N]`` on
    ``console``; their exit statuses. Interrupted (Ctrl-C, or SIGINT to the gate alone), every
    job is interrupted and waited for, and their statuses returned as any others: each job
    reports what it ran, and the run merges those reports as pytest writes its own."""
    lock = threading.Lock()
    processes = [
        subprocess.Popen(
            command,
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
        )
        for command in commands
    ]
    pumps = [
        threading.Thread(
            target=_pump, args=(process, f"[job {index}/{len(commands)}] ", console, lock)
        )
        for index, process in enumerate(processes, start=1)
    ]
    for pump in pumps:
        pump.start()
    try:
        for process in processes:
            process.wait()
    except KeyboardInterrupt:
        print("gate: interrupted; each job reports what it ran", file=sys.stderr)
    finally:
        _interrupt_the_rest(processes)
        for pump in pumps:
            pump.join()
    return [process.returncode for process in processes]


def _pump(
    process: subprocess.Popen[str], prefix: str, console: TextIO, lock: threading.Lock
) -> None:
    assert process.stdout is not None
    for line in process.stdout:
        with lock:
            console.write(prefix + line)
            console.flush()


def _interrupt_the_rest(processes: list[subprocess.Popen[str]]) -> None:
    """Give each job still running :data:`STOP_GRACE_S` to stop on its own (at Ctrl-C the
    terminal interrupted it too), then interrupt it as Ctrl-C does (pytest still writes its
    report), and wait for it."""
    deadline = time.monotonic() + STOP_GRACE_S
    for process in processes:
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGINT)
    for process in processes:
        process.wait()


def merge_jobs(directories: list[Path], statuses: list[int], out: Path) -> int:
    """Merge the jobs' results and junit XML into ``out``; the run's exit status: the worst
    job's, where a job that wrote no results is a failure (named on stderr) and one left no
    ids (pytest's 5) counts only when every job was."""
    ran = [status for status in statuses if status != NO_TESTS]
    status = worst_status(ran) if ran else NO_TESTS
    reported = []
    for directory, job_status in zip(directories, statuses, strict=True):
        if (directory / "results.json").is_file():
            reported.append(directory)
            continue
        print(
            f"gate: job {directory.name} exited with {job_status} and wrote no results",
            file=sys.stderr,
        )
        status = status or NO_RESULTS_EXIT
    if reported:
        merge_files(reported, out, exit_status=status)
    return status


def run_jobs(
    command_of: Callable[[Path, Path], list[str]], count: int, out: Path, cwd: Path
) -> int:
    """Run ``count`` jobs side by side, each ``command_of(its directory, the directory of
    the claims they share)``, and merge their reports into ``out``; the run's exit status."""
    directories = job_directories(out, count)
    for directory in directories:
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "results.json").unlink(missing_ok=True)
    claims = out / "jobs" / "claims"
    shutil.rmtree(claims, ignore_errors=True)
    claims.mkdir()
    commands = [command_of(directory, claims) for directory in directories]
    return merge_jobs(directories, run_side_by_side(commands, cwd), out)
