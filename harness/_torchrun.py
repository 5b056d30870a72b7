"""Torchrun mode: every rank runs pytest itself; outcomes are agreed through the store.

Under ``torchrun --nproc-per-node N -m pytest ...`` (one node or many) each
rank collects the same tests and runs the world tests whose size equals the
launched world. After each test body, every rank publishes its result in the
rendezvous store; each rank reads all of them, and rank 0 reports the
verdict. A hung rank cannot be replaced under torchrun: at the deadline its
watchdog dumps the Python stacks, publishes a hang, and rank 0 finishes the
reports (junit XML, terminal summary) before the launch ends.
"""

from __future__ import annotations

import faulthandler
import os
import pickle
import shutil
import sys
import tempfile
import threading
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from harness import _env, devices, outcomes
from harness import _messages as msg
from harness._context import WorldContext
from harness._outcome import WorldOutcome
from harness._spec import WorldSpec

_FINISH_WAIT_S = 600.0
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

    def __init__(self, backend: str, device_type: str) -> None:
        import torch.distributed as dist

        self.rank = int(os.environ["RANK"])
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.spec = WorldSpec(backend, int(os.environ["WORLD_SIZE"]), device_type)
        devices.bind(self.spec.device_type, self.local_rank)
        if not dist.is_initialized():
            dist.init_process_group(self.spec.backend)
        client = dist.TCPStore(
            os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False
        )
        self._store = dist.PrefixStore("harness/outcomes/", client)
        self._sequence = 0
        self._shared_tmp = Path(
            os.environ.get("HARNESS_SHARED_TMP")
            or Path(tempfile.gettempdir()) / f"harness-torchrun-{os.environ['MASTER_PORT']}"
        )

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
            dist.barrier(device_ids=[self.local_rank])
        else:
            dist.barrier()

    def finish(self) -> None:
        """Rank 0 announces that its reports are written; the others wait for that."""
        if self.is_reporter:
            self._store.set("finished", "1")
        else:
            self._store.wait(["finished"], timedelta(seconds=_FINISH_WAIT_S))

    def publish(self, result: msg.RankResult) -> None:
        """Put this rank's result for the current test in the store."""
        payload = pickle.dumps(result)
        self._store.set(f"{self._sequence}/{self.rank}", payload)  # type: ignore[arg-type]  # bytes are fine

    def agree(self, result: msg.RankResult, timeout_s: float) -> WorldOutcome:
        """Publish ``result``, wait for every rank's, and return the joint outcome.

        Ranks that publish nothing within ``timeout_s`` are reported as hung.
        """
        self.publish(result)
        results: dict[int, msg.RankResult] = {}
        for rank in range(self.spec.size):
            key = f"{self._sequence}/{rank}"
            try:
                self._store.wait([key], timedelta(seconds=timeout_s))
                results[rank] = pickle.loads(self._store.get(key))
            except RuntimeError:
                results[rank] = msg.RankResult(
                    rank=rank,
                    status=outcomes.HUNG,
                    longrepr=f"rank {rank} reported no result within {timeout_s:g} s",
                )
        self._sequence += 1
        return WorldOutcome(spec=self.spec, results=results)


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
