"""A spawned world: N rank processes, their process group, and one test at a time.

The controller owns the rendezvous store and an authenticated listener on
loopback. Each rank is a fresh interpreter (``python -m harness._rank``) or a child
forked from its rank's template (``_forkserver``), in its own process session, so killing a
world kills everything it started.
A rank's death is seen at once through a pidfd; a hang ends at the test's
deadline, after every live rank has dumped its Python stacks.
"""

from __future__ import annotations

import contextlib
import os
import queue
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection, Listener, wait
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Any

import harness
from harness import _env, machine, memory, outcomes
from harness import _messages as msg
from harness._capture import STREAMS, read_capture, stack_dump_path
from harness._forkserver import ForkedRank, ForkServerError, ForkServers
from harness._outcome import WorldOutcome, describe_exit
from harness._spec import WorldSettings, WorldSpec
from harness.outcomes import RankStatus

LOOPBACK = "127.0.0.1"
# How long survivors may still finish after a rank died before they count as hung.
CRASH_GRACE_S = 2.0
# How long the others may still finish after a rank failed: a rank that raised leaves its
# peers waiting in the next collective it would have joined, which they never leave; a test
# body's ranks end within a second of each other otherwise.
FAILED_GRACE_S = 5.0
# The same grace where pytest will report any failure of the test as expected: the run keeps
# only that the test failed, so what the others would still report changes nothing.
EXPECTED_FAILURE_GRACE_S = 1.0
# How long a rank gets to write its stacks after the dump signal.
STACK_DUMP_WAIT_S = 2.0


class WorldStartError(RuntimeError):
    """The world's ranks could not all join the process group."""


class _RankProcess:
    """A rank's process (spawned, or forked from a template), its exit watch (pidfd) and
    its connection."""

    def __init__(self, rank: int, popen: subprocess.Popen[bytes] | ForkedRank) -> None:
        self.rank = rank
        self.popen = popen
        self.exit_fd = os.pidfd_open(popen.pid)
        self.conn: Connection | None = None

    def exit_status(self) -> int | None:
        return self.popen.poll()

    def kill(self) -> None:
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGKILL)
        self.popen.wait()
        if self.conn is not None:
            self.conn.close()
        os.close(self.exit_fd)


class World:
    """A live world of ``spec.size`` ranks that runs test bodies on request."""

    def __init__(
        self, spec: WorldSpec, settings: WorldSettings, templates: ForkServers | None = None
    ) -> None:
        self.spec = spec
        self.settings = settings
        self._templates = templates  # None: each rank is a fresh interpreter
        self.dir = Path(tempfile.mkdtemp(prefix=f"world-{spec.backend}{spec.size}-"))
        self._ranks: list[_RankProcess] = []
        self._store: Any = None
        try:
            self._start()
        except BaseException:
            self.kill()
            raise

    # ----- lifecycle -------------------------------------------------------

    def _start(self) -> None:
        import torch.distributed as dist

        envs = [rank_env(self.settings, rank) for rank in range(self.spec.size)]
        if self._templates is not None:
            try:
                self._templates.start(envs)
            except ForkServerError as error:
                raise WorldStartError(self._start_failure(str(error))) from None
        self._store = dist.TCPStore(LOOPBACK, 0, is_master=True, wait_for_workers=False)
        authkey = secrets.token_bytes(32)
        with Listener((LOOPBACK, 0), authkey=authkey) as listener:
            host, port = listener.address
            for rank in range(self.spec.size):
                self._ranks.append(self._spawn(rank, envs[rank], f"{host}:{port}", authkey))
            self._accept(listener)
        for proc in self._ranks:
            assert proc.conn is not None
            proc.conn.send(self._init_message())
        self._await_ready()

    def _spawn(
        self, rank: int, base_env: dict[str, str], address: str, authkey: bytes
    ) -> _RankProcess:
        """Rank ``rank``'s process, its environment ``base_env`` (``rank_env``) plus the
        world's."""
        env = {**base_env, _env.CONTROLLER_ADDRESS: address, _env.WORLD_DIR: str(self.dir)}
        if self._templates is not None:
            try:
                forked = self._templates.fork(rank, env, self._log_path(rank), authkey)
            except ForkServerError as error:
                raise WorldStartError(self._start_failure(str(error))) from None
            return _RankProcess(rank, forked)
        log = open(self._log_path(rank), "wb")  # noqa: SIM115 - handed to the child
        with log:
            popen = subprocess.Popen(
                [sys.executable, "-m", "harness._rank"],
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        assert popen.stdin is not None
        popen.stdin.write(authkey.hex().encode() + b"\n")
        popen.stdin.close()
        return _RankProcess(rank, popen)

    def _init_message(self) -> msg.Init:
        return msg.Init(self.spec, LOOPBACK, self._store.port, self.settings)

    def _accept(self, listener: Listener) -> None:
        """Accept one authenticated connection per rank; each rank first names itself."""
        accepted: queue.Queue[Connection | BaseException] = queue.Queue()

        def accept_all() -> None:
            for _ in range(self.spec.size):
                try:
                    accepted.put(msg.without_delay(listener.accept()))
                except BaseException as exc:
                    accepted.put(exc)
                    return

        threading.Thread(target=accept_all, daemon=True).start()
        deadline = time.monotonic() + self.settings.startup_timeout_s
        for _ in range(self.spec.size):
            item = self._next_during_start(accepted, deadline)
            if isinstance(item, BaseException):
                raise WorldStartError(self._start_failure(f"a rank failed to connect: {item!r}"))
            rank = item.recv()
            self._ranks[rank].conn = item

    def _next_during_start(
        self, items: queue.Queue[Connection | BaseException], deadline: float
    ) -> Connection | BaseException:
        while True:
            self._raise_if_a_rank_exited()
            if time.monotonic() > deadline:
                raise WorldStartError(self._start_failure("ranks did not connect in time"))
            try:
                return items.get(timeout=0.05)
            except queue.Empty:
                continue

    def _await_ready(self) -> None:
        deadline = time.monotonic() + self.settings.startup_timeout_s
        pending = {p.conn: p for p in self._ranks if p.conn is not None}
        while pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise WorldStartError(self._start_failure("ranks did not join the process group"))
            ready = wait([*pending, *(p.exit_fd for p in self._ranks)], timeout=remaining)
            self._raise_if_a_rank_exited()
            for conn in ready:
                if isinstance(conn, Connection):
                    reply = conn.recv()
                    if isinstance(reply, msg.InitFailed):
                        # The traceback comes with the message: the rank's log may not
                        # hold it yet when the controller reads it.
                        failed = f"rank {reply.rank} failed to join the world:\n{reply.traceback}"
                        raise WorldStartError(self._start_failure(failed.rstrip()))
                    del pending[conn]

    def _raise_if_a_rank_exited(self) -> None:
        for proc in self._ranks:
            status = proc.exit_status()
            if status is not None:
                raise WorldStartError(
                    self._start_failure(f"rank {proc.rank} {describe_exit(status)} while starting")
                )

    def _start_failure(self, what: str) -> str:
        logs = [f"{self.spec.label}: {what}"]
        for rank in range(self.spec.size):
            text = self._log_path(rank).read_text(errors="replace") if self.dir.exists() else ""
            logs.append(f"--- rank {rank} output ---\n{text.rstrip() or '(nothing)'}")
        return "\n".join(logs)

    def _log_path(self, rank: int) -> Path:
        return self.dir / f"rank{rank}.log"

    def exited_ranks(self) -> dict[int, int]:
        """Ranks whose process has ended, with their exit status."""
        statuses = {p.rank: p.exit_status() for p in self._ranks}
        return {rank: status for rank, status in statuses.items() if status is not None}

    def close(self) -> None:
        """Ask every rank to leave cleanly; kill those that do not within a few seconds."""
        for proc in self._ranks:
            if proc.conn is not None and proc.exit_status() is None:
                with contextlib.suppress(OSError):
                    proc.conn.send(msg.Shutdown())
        deadline = time.monotonic() + 5.0
        for proc in self._ranks:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
        self.kill()

    def kill(self) -> None:
        """Kill every rank process and free the world's resources."""
        for proc in self._ranks:
            proc.kill()
        self._ranks = []
        self._store = None
        shutil.rmtree(self.dir, ignore_errors=True)

    # ----- running a test --------------------------------------------------

    def run(self, request: msg.TestRequest) -> WorldOutcome:
        """Run one test body on every rank and collect how each ended."""
        message = ForkingPickler.dumps(request)  # pickled once for every rank
        results: dict[int, msg.RankResult] = {}
        for proc in self._ranks:
            assert proc.conn is not None
            with contextlib.suppress(OSError):  # a dead rank is reported by the exit watch
                proc.conn.send_bytes(message)
        grace_s = EXPECTED_FAILURE_GRACE_S if request.failure_expected else FAILED_GRACE_S
        self._collect(results, time.monotonic() + request.timeout_s, request.timeout_s, grace_s)
        outcome = WorldOutcome(spec=self.spec, results=results)
        for rank, result in sorted(results.items()):
            outcome.captures[rank] = (
                result.captured
                if result.status not in (outcomes.CRASHED, outcomes.HUNG)
                else {s: read_capture(self.dir, rank, s) for s in STREAMS}
            )
        return outcome

    def _collect(
        self,
        results: dict[int, msg.RankResult],
        deadline: float,
        timeout_s: float,
        failed_grace_s: float,
    ) -> None:
        """Gather results until every rank reported, died, or the deadline passed; once a
        rank died or failed, the others get a short grace (``failed_grace_s`` after a
        failure), not the rest of the deadline."""
        cut = _Cut(deadline, f"did not finish within the {timeout_s:g} s deadline")
        body_ended: dict[int, RankStatus] = {}  # ranks whose body ended, still cleaning up
        killable: set[int] = set()  # ranks whose test may kill them (``MayBeKilled``)
        while len(results) < self.spec.size:
            pending = [p for p in self._ranks if p.rank not in results]
            remaining = cut.at - time.monotonic()
            if remaining <= 0:
                self._mark_hung(pending, results, cut.why, body_ended)
                return
            watched: list[Any] = [p.conn for p in pending if p.conn is not None]
            watched += [p.exit_fd for p in pending]
            for ready in wait(watched, timeout=remaining):
                proc = next(p for p in pending if ready in (p.conn, p.exit_fd))
                if proc.rank in results:
                    continue
                result = self._receive(proc)
                if isinstance(result, msg.BodyEnded):
                    body_ended[proc.rank] = result.status
                elif isinstance(result, msg.MayBeKilled):
                    killable.add(proc.rank)
                elif result is None:
                    status = proc.popen.wait()
                    arranged = proc.rank in killable and proc.rank not in body_ended
                    if arranged and status == -signal.SIGKILL:
                        results[proc.rank] = self._killed_as_arranged(proc.rank)
                        continue
                    where = _stopped_in(body_ended.get(proc.rank)) or "during the test"
                    results[proc.rank] = msg.RankResult(
                        rank=proc.rank,
                        status=outcomes.CRASHED,
                        longrepr=f"rank {proc.rank} {describe_exit(status)} {where}",
                    )
                    cut.sooner(CRASH_GRACE_S, "still running after another rank died")
                else:
                    results[proc.rank] = result
                    if result.status == outcomes.FAILED:
                        cut.sooner(
                            failed_grace_s,
                            f"still running {failed_grace_s:g} s after rank {proc.rank} failed",
                        )

    def _killed_as_arranged(self, rank: int) -> msg.RankResult:
        """The result of a rank its test killed with SIGKILL, having said it might: its part
        passed; what it printed is kept; the world goes after the test."""
        return msg.RankResult(
            rank=rank,
            status=outcomes.PASSED,
            longrepr=f"rank {rank} killed by SIGKILL, as its test arranged",
            captured={stream: read_capture(self.dir, rank, stream) for stream in STREAMS},
            respawn=True,
        )

    @staticmethod
    def _receive(proc: _RankProcess) -> msg.BodyEnded | msg.MayBeKilled | msg.RankResult | None:
        """The rank's next message (its body ended, it may be killed, or its result), or None
        if its process is gone."""
        assert proc.conn is not None
        if proc.exit_status() is not None and not proc.conn.poll():
            return None
        try:
            reply: msg.BodyEnded | msg.MayBeKilled | msg.RankResult = proc.conn.recv()
        except (EOFError, OSError):
            return None
        return reply

    def _mark_hung(
        self,
        pending: list[_RankProcess],
        results: dict[int, msg.RankResult],
        why: str,
        body_ended: dict[int, RankStatus],
    ) -> None:
        stacks = self._dump_stacks(pending)
        for proc in pending:
            where = _stopped_in(body_ended.get(proc.rank))
            what = f"rank {proc.rank} {why}" + (f", {where}" if where else "")
            results[proc.rank] = msg.RankResult(
                rank=proc.rank,
                status=outcomes.HUNG,
                longrepr=f"{what}; its Python stacks:\n{stacks[proc.rank]}",
            )

    def _dump_stacks(self, procs: list[_RankProcess]) -> dict[int, str]:
        """Ask each process for its Python stacks (faulthandler) and read them."""
        paths = {p.rank: stack_dump_path(self.dir, p.rank) for p in procs}
        before = {rank: _size(path) for rank, path in paths.items()}
        for proc in procs:
            if proc.exit_status() is None:
                os.kill(proc.popen.pid, signal.SIGUSR1)
        deadline = time.monotonic() + STACK_DUMP_WAIT_S
        sizes = dict(before)
        while time.monotonic() < deadline:
            time.sleep(0.1)
            now = {rank: _size(path) for rank, path in paths.items()}
            if now == sizes and all(now[r] > before[r] for r in now):
                break
            sizes = now
        stacks = {}
        for rank, path in paths.items():
            with open(path, "rb") as f:
                f.seek(before[rank])
                stacks[rank] = f.read().decode(errors="replace").rstrip() or "(no stack dump)"
        return stacks


def rank_env(settings: WorldSettings, rank: int) -> dict[str, str]:
    """The environment of rank ``rank`` in any world of the session (a world adds its
    controller's address and its directory)."""
    env = dict(os.environ)
    package_parent = str(Path(harness.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH", "")) if p)
    env.update({_env.ROLE: _env.RANK_ROLE, _env.RANK: str(rank), "PYTHONUNBUFFERED": "1"})
    env["PYTHONHASHSEED"] = str(settings.hash_seed + rank)
    # Loopback rendezvous, and no oversubscription of a small machine.
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    env.setdefault("OMP_NUM_THREADS", machine.RANK_THREADS)
    for name, value in memory.ALLOCATOR_ENV.items():
        env.setdefault(name, value)  # steady peak-memory readings
    return env


def _stopped_in(body_ended: RankStatus | None) -> str:
    """Where a rank that sent no result stopped, when its body had ended: in clean-up. The
    test still fails (a hung or dead rank never passes); the report keeps the body's outcome
    so that a clean-up fault is not read as a fault of the test's checks."""
    return "" if body_ended is None else f"in clean-up after its test body {body_ended}"


@dataclass
class _Cut:
    """When the ranks still running are called hung, and why: the deadline, brought forward
    by each rank that died or failed to the end of its grace, where that is sooner."""

    at: float
    why: str

    def sooner(self, grace_s: float, why: str) -> None:
        """Cut ``grace_s`` from now, if that is before the cut so far."""
        at = time.monotonic() + grace_s
        if at < self.at:
            self.at, self.why = at, why


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0
