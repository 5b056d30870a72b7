"""Torchrun mode: every rank runs pytest itself; outcomes are agreed through the store.

Under ``torchrun --nproc-per-node N -m pytest ...`` (one node or many) each
rank collects the same tests and runs the world tests whose size equals the
launched world. After each test body, every rank publishes its result in the
rendezvous store; each rank reads all of them, and rank 0 reports the
verdict. A hung rank cannot be replaced under torchrun: at the deadline its
watchdog dumps the Python stacks, publishes a hang, and rank 0 finishes the
reports (junit XML, terminal summary) before the launch ends. A rank that
dies (on this node or another agent's) stops its heartbeat in the store: the
others report it as crashed, by rank, without waiting out the deadline.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import pickle
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness import _env, devices, outcomes
from harness import _messages as msg
from harness._context import WorldContext
from harness._outcome import WorldOutcome
from harness._preload import import_torch
from harness._spec import WorldSpec

if TYPE_CHECKING:
    import torch.distributed as dist

_FINISH_WAIT_S = 600.0
_STOPPED = "torchrun stopped rank 0 (SIGTERM): a rank or an agent failed (see the agents' logs)"
_FIRST_POLL_S = 0.001  # results are polled for, doubling the pause up to the last
_LAST_POLL_S = 0.1
_BEATS = "harness/beats/"
_BEAT_INTERVAL_S = 0.5
# A rank whose beat count has not moved for this long is dead. Counts, not clocks: the nodes'
# clocks need not agree.
_BEAT_STALE_S = 10.0
_REQUIRED_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def launched_by_torchrun() -> bool:
    """True in a process that torchrun started (and not in a spawned rank)."""
    if os.environ.get(_env.ROLE) == _env.RANK_ROLE:
        return False
    return all(v in os.environ for v in _REQUIRED_ENV) and any(
        v in os.environ for v in _env.TORCHRUN_MARKERS
    )


class TorchrunWorld:
    """The world torchrun launched, seen from this rank."""

    def __init__(self, backend: str, device_type: str, ranks_per_device: int = 1) -> None:
        import torch.distributed as dist

        import_torch()
        self.rank = int(os.environ["RANK"])
        self.local_rank = int(os.environ["LOCAL_RANK"])
        size = int(os.environ["WORLD_SIZE"])
        self.spec = WorldSpec(backend, size, device_type, ranks_per_device)
        devices.bind(self.spec.device_type, self.spec.device_index(self.local_rank))
        if not dist.is_initialized():
            dist.init_process_group(self.spec.backend)
        self._store = _store("harness/outcomes/")
        self._sequence = 0
        self._shared_tmp = Path(
            os.environ.get("HARNESS_SHARED_TMP")
            or Path(tempfile.gettempdir()) / f"harness-torchrun-{os.environ['MASTER_PORT']}"
        )
        self._pulse = _Pulse(self.spec.size, _store(_BEATS))
        self._heartbeat = _Heartbeat(self.rank)
        self.reports_begun = False  # set by the plugin when rank 0 starts writing them
        self._agreeing = False  # waiting for the other ranks' results of a test
        self._stopped = False  # torchrun has asked this rank to stop

    @property
    def is_reporter(self) -> bool:
        return self.rank == 0

    def context(self, test_name: str) -> WorldContext:
        """The ``world`` fixture for a test: a fresh directory shared by all ranks."""
        tmp = self._shared_tmp / test_name
        if self.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        self.barrier()
        return WorldContext(
            spec=self.spec,
            rank=self.rank,
            local_rank=self.local_rank,
            shared_dir=tmp,
            launcher="torchrun",
        )

    def barrier(self) -> None:
        import torch.distributed as dist

        if self.spec.device_type != devices.CPU:
            dist.barrier(device_ids=[self.spec.device_index(self.local_rank)])
        else:
            dist.barrier()

    def finish(self) -> None:
        """Rank 0 announces that its reports are written; the others wait for that (or for
        the store to go: then there is no one left to wait for)."""
        self._heartbeat.stop()
        try:
            if self.is_reporter:
                self._store.set("finished", "1")
            else:
                self._store.wait(["finished"], timedelta(seconds=_FINISH_WAIT_S))
        except RuntimeError:  # the store's agent has stopped
            pass

    def report_when_stopped(self) -> None:
        """On rank 0: when torchrun stops this rank (SIGTERM: another rank or agent failed),
        report the ranks still awaited as lost, or, inside a test body (which may be stuck on
        them), end the session as an interrupt: either way the reports are written."""
        signal.signal(signal.SIGTERM, self._interrupt)

    def _interrupt(self, signum: int, frame: object) -> None:
        if self.reports_begun:
            return  # finish them: torchrun waits before it kills
        self._stopped = True
        if not self._agreeing:  # a test body may be stuck on a lost rank: cut it
            raise KeyboardInterrupt(_STOPPED)

    def publish(self, result: msg.RankResult) -> None:
        """Put this rank's result for the current test in the store."""
        payload = pickle.dumps(result)
        self._store.set(f"{self._sequence}/{self.rank}", payload)  # type: ignore[arg-type]  # bytes are fine

    def agree(self, result: msg.RankResult, timeout_s: float) -> WorldOutcome:
        """Publish ``result``, wait for every rank's, and return the joint outcome.

        A rank whose heartbeat stops is reported as crashed as soon as that is seen; ranks
        that publish nothing within ``timeout_s`` are reported as hung.
        """
        with contextlib.suppress(RuntimeError):  # the store is gone: the results say so
            self.publish(result)
        self._agreeing = True
        try:
            results = {
                rank: result if rank == self.rank else self._result_of(rank, timeout_s)
                for rank in range(self.spec.size)
            }
        finally:
            self._agreeing = False
        self._sequence += 1
        return WorldOutcome(spec=self.spec, results=results)

    def _result_of(self, rank: int, timeout_s: float) -> msg.RankResult:
        try:
            return self._await_result(rank, timeout_s)
        except RuntimeError:  # the store went away with the agent that hosted it
            return msg.RankResult(
                rank=rank,
                status=outcomes.CRASHED,
                longrepr=f"rank {rank} did not report this test: the rendezvous store went "
                "away, so the agent hosting it stopped (its ranks likely crashed; see its log)",
            )

    def _await_result(self, rank: int, timeout_s: float) -> msg.RankResult:
        key = f"{self._sequence}/{rank}"
        deadline = time.monotonic() + timeout_s
        pause = _FIRST_POLL_S
        while not self._store.check([key]):  # polled: a blocking wait logs every timeout
            if self._stopped:
                return msg.RankResult(
                    rank=rank,
                    status=outcomes.CRASHED,
                    longrepr=f"rank {rank} did not report this test before {_STOPPED}",
                )
            silent_s = self._pulse.silent_for(rank)
            if silent_s >= _BEAT_STALE_S:
                return msg.RankResult(
                    rank=rank,
                    status=outcomes.CRASHED,
                    longrepr=f"rank {rank} died: its heartbeat stopped {silent_s:.0f} s ago, "
                    "before it reported this test (its agent's log has its exit status)",
                )
            if time.monotonic() >= deadline:
                return msg.RankResult(
                    rank=rank,
                    status=outcomes.HUNG,
                    longrepr=f"rank {rank} reported no result within {timeout_s:g} s",
                )
            time.sleep(pause)
            pause = min(2 * pause, _LAST_POLL_S)
        return pickle.loads(self._store.get(key))  # type: ignore[no-any-return]


def _store(prefix: str) -> dist.Store:
    """A client of the store torchrun's rendezvous hosts (on whichever node runs it)."""
    import torch.distributed as dist

    client = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False
    )
    return dist.PrefixStore(prefix, client)


class _Heartbeat:
    """Counts this rank's beat up in the store while the process lives, on a thread with its
    own client (the main thread may be blocked in the store or a collective)."""

    def __init__(self, rank: int) -> None:
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._beat, args=(rank,), daemon=True)
        self._thread.start()

    def _beat(self, rank: int) -> None:
        store = _store(_BEATS)
        while not self._stopped.is_set():
            try:
                store.add(str(rank), 1)
            except RuntimeError:
                return  # the store is gone, and with it everyone who listened
            self._stopped.wait(_BEAT_INTERVAL_S)

    def stop(self) -> None:
        """Stop beating; the thread ends before the interpreter, which would abort a thread
        left in a store call."""
        self._stopped.set()
        self._thread.join()


class _Pulse:
    """When each rank's beat count last moved, by this process's clock."""

    def __init__(self, size: int, beats: dist.Store) -> None:
        now = time.monotonic()
        self._beats = beats
        self._last: dict[int, tuple[int, float]] = {rank: (-1, now) for rank in range(size)}

    def silent_for(self, rank: int) -> float:
        """Seconds since ``rank``'s beat count last moved (read now)."""
        count = int(self._beats.add(str(rank), 0))
        seen, since = self._last[rank]
        now = time.monotonic()
        if count != seen:
            self._last[rank] = (count, now)
            return 0.0
        return now - since


class HangWatchdog:
    """Cuts a hung test body under torchrun: dump stacks, publish, report, exit.

    ``on_hang`` receives this rank's stack dump; it must publish the hang and,
    on the reporting rank, finish the reports. The process then exits, since
    a thread stuck in a collective cannot be interrupted.
    """

    EXIT_CODE = 3

    def __init__(self, timeout_s: float, on_hang: Callable[[str], Any]) -> None:
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, args=(timeout_s, on_hang), daemon=True)

    def __enter__(self) -> HangWatchdog:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()

    def _watch(self, timeout_s: float, on_hang: Callable[[str], Any]) -> None:
        if self._done.wait(timeout_s):
            return
        with tempfile.TemporaryFile() as dump:
            faulthandler.dump_traceback(file=dump, all_threads=True)
            dump.seek(0)
            stacks = dump.read().decode(errors="replace")
        try:
            on_hang(stacks)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(self.EXIT_CODE)
