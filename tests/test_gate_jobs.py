"""Jobs of a gate run side by side: how many, their output, and the exit status of their
merged run. (That their merged report is one run's: ``tests/test_gate_shards.py``.)"""

from __future__ import annotations

import io
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from ci.gate import jobs
from ci.gate.results import NO_RESULTS_EXIT, GateResults
from tests.test_gate_shards import results_of


@pytest.mark.parametrize("text", ["0", "-1", "two", "1.5", ""])
def test_a_job_count_is_at_least_one_or_auto(text: str) -> None:
    with pytest.raises(ValueError, match="--jobs is a count of at least 1 or auto"):
        jobs.parse_jobs(text)


def test_auto_is_a_job_per_core_for_cpu_worlds_as_memory_allows(monkeypatch) -> None:
    monkeypatch.setattr(jobs.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    monkeypatch.setattr(jobs, "_available_memory", lambda: 64 * 2**30)
    assert jobs.parse_jobs("auto") is None
    assert jobs.auto_jobs("cpu") == 4
    monkeypatch.setattr(jobs, "_available_memory", lambda: 9 * 2**30)
    assert jobs.auto_jobs("cpu") == 2  # 4 GiB a job
    monkeypatch.setattr(jobs, "_available_memory", lambda: 2**30)
    assert jobs.auto_jobs("cpu") == 1


def test_auto_is_one_job_for_accelerator_worlds(monkeypatch) -> None:
    monkeypatch.setattr(jobs.os, "sched_getaffinity", lambda pid: set(range(64)))
    assert jobs.auto_jobs("cuda") == 1


def test_each_jobs_lines_reach_the_console_prefixed_and_its_status_is_returned() -> None:
    say = "import sys; print('one'); print('two', file=sys.stderr); sys.exit({})"
    console = io.StringIO()
    statuses = jobs.run_side_by_side(
        [[sys.executable, "-c", say.format(0)], [sys.executable, "-c", say.format(4)]],
        Path.cwd(),
        console,
    )
    assert statuses == [0, 4]
    assert sorted(console.getvalue().splitlines()) == [
        "[job 1/2] one",
        "[job 1/2] two",
        "[job 2/2] one",
        "[job 2/2] two",
    ]


def test_an_interrupted_run_interrupts_the_jobs_still_running(monkeypatch) -> None:
    """A job that did not stop on its own within the grace is interrupted as Ctrl-C does,
    and waited for."""
    monkeypatch.setattr(jobs, "STOP_GRACE_S", 0.5)
    # Python's own Ctrl-C handler, whatever this run inherited: a shell's background job
    # starts with SIGINT ignored, and Python keeps it so
    waits = (
        "import signal, sys, time\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "print('ready', flush=True)\n"
        "try:\n    time.sleep(60)\nexcept KeyboardInterrupt:\n    sys.exit(2)"
    )
    done = subprocess.Popen([sys.executable, "-c", "pass"], text=True)
    waiting = subprocess.Popen([sys.executable, "-c", waits], stdout=subprocess.PIPE, text=True)
    assert waiting.stdout is not None
    assert waiting.stdout.readline() == "ready\n"  # its Ctrl-C handler is in place
    jobs._interrupt_the_rest([done, waiting])
    waiting.stdout.close()
    assert done.returncode == 0
    assert waiting.returncode == 2


def _job(directory: Path, nodeid: str | None, exit_status: int) -> Path:
    """A job's folder, with results holding ``nodeid`` (None: no results at all)."""
    directory.mkdir(parents=True)
    if nodeid is not None:
        results = replace(results_of("2.13.0", [nodeid]), exit_status=exit_status)
        results.save(directory / "results.json")
    return directory


def test_a_job_without_results_fails_the_run_and_is_named(tmp_path: Path, capsys) -> None:
    directories = [_job(tmp_path / "1", "m.py::t[w2]", 0), _job(tmp_path / "2", None, 0)]
    assert jobs.merge_jobs(directories, [0, 0], tmp_path) == NO_RESULTS_EXIT
    assert "gate: job 2 exited with 0 and wrote no results" in capsys.readouterr().err
    merged = GateResults.load(tmp_path / "results.json")
    assert [test.nodeid for test in merged.tests] == ["m.py::t[w2]"]
    assert merged.exit_status == NO_RESULTS_EXIT


def test_a_job_left_no_ids_counts_only_when_every_job_was(tmp_path: Path) -> None:
    none_left = jobs.NO_TESTS
    directories = [_job(tmp_path / "1", "m.py::t[w2]", 0), _job(tmp_path / "2", "m.py::u", 0)]
    assert jobs.merge_jobs(directories, [0, none_left], tmp_path) == 0
    assert jobs.merge_jobs(directories, [1, none_left], tmp_path) == 1
    assert GateResults.load(tmp_path / "results.json").exit_status == 1
    assert jobs.merge_jobs(directories, [none_left, none_left], tmp_path) == none_left


# A job that reports the one id it "ran" once interrupted, as pytest writes its report on
# Ctrl-C; it says when its handler is in place.
_INTERRUPTED_JOB = """
import signal, sys, time
from dataclasses import replace
from pathlib import Path
from tests.test_gate_shards import results_of
signal.signal(signal.SIGINT, signal.default_int_handler)
print("ready", flush=True)
try:
    time.sleep(60)
except KeyboardInterrupt:
    results = replace(results_of("2.13.0", [f"m.py::t{sys.argv[2][0]}[w2]"]), exit_status=2)
    results.save(Path(sys.argv[1]) / "results.json")
    sys.exit(2)
"""
_GATE_OF_TWO_JOBS = """
import signal, sys
from pathlib import Path
from ci.gate import jobs
signal.signal(signal.SIGINT, signal.default_int_handler)
jobs.STOP_GRACE_S = 0.5
job = sys.argv[2]
command_of = lambda directory, claims: [sys.executable, "-c", job, str(directory), directory.name]
sys.exit(jobs.run_jobs(command_of, 2, Path(sys.argv[1]), Path.cwd()))
"""


@pytest.mark.slow
def test_an_interrupted_gate_merges_what_its_jobs_reported(tmp_path: Path) -> None:
    """SIGINT to the gate alone (``timeout -s INT``, a CI runner's cancel): its jobs are
    interrupted, report what they ran, and the run merges their reports, exit status 2 as
    an interrupted pytest session's, instead of ending in a traceback with no report."""
    command = [sys.executable, "-c", _GATE_OF_TWO_JOBS, str(tmp_path), _INTERRUPTED_JOB]
    gate = subprocess.Popen(
        command,
        cwd=Path(__file__).parent.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert gate.stdout is not None
    ready = {gate.stdout.readline(), gate.stdout.readline()}
    assert ready == {"[job 1/2] ready\n", "[job 2/2] ready\n"}
    gate.send_signal(signal.SIGINT)
    _, errors = gate.communicate(timeout=60)
    assert gate.returncode == 2, errors
    assert "gate: interrupted; each job reports what it ran" in errors
    merged = GateResults.load(tmp_path / "results.json")
    assert sorted(test.nodeid for test in merged.tests) == ["m.py::t1[w2]", "m.py::t2[w2]"]
    assert merged.exit_status == 2
