"""Rank processes forked from templates that imported torch and the session's test modules.

A fresh interpreter spends seconds importing torch, its distributed packages and the test
modules before its first test; four ranks on a small machine spend them four times over, at
every world the session starts. A template process per rank index does that once, then forks
a rank for each world. The rank is the template's child in a session of its own; the
controller watches it through a pidfd and asks the template for its exit status once it ended.

Each rank index has its own template because a rank's ``PYTHONHASHSEED`` (set at interpreter
start) differs by rank. A template imports, in a rank's order: the preloads
(``HARNESS_PRELOAD``), torch's process groups, pytest's configuration, then each test module
with its asserts rewritten. What it cannot import it leaves to the rank, which imports it
again and reports the error as a rank started afresh would.

``ForkServers`` starts each template with ``serve`` and its end of a socket pair.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import subprocess
import sys
import traceback
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING

from harness._outcome import describe_exit

if TYPE_CHECKING:
    from harness._spec import WorldSettings


class ForkServerError(RuntimeError):
    """A template could not start, or stopped answering."""


@dataclass(frozen=True)
class _Setup:
    """Controller → template, once: what to import before the first fork."""

    sys_path: list[str]
    rootdir: str
    inifile: str | None
    verbosity: int
    modules: tuple[tuple[str, str], ...]  # (module name, path) of the session's world tests


@dataclass(frozen=True)
class _Fork:
    """Controller → template: start a rank with this environment, its output in ``log``."""

    env: dict[str, str]
    log: str
    authkey: bytes


@dataclass(frozen=True)
class _Reap:
    """Controller → template: the exit status of a rank that has ended."""

    pid: int


_READY = "ready"
# Not ``-m harness._forkserver``: the messages must unpickle as this module's classes.
_TEMPLATE_MAIN = "import sys; from harness._forkserver import serve; serve(int(sys.argv[1]))"


class ForkedRank:
    """The controller's handle of a forked rank: ``pid``, ``poll`` and ``wait`` as a
    ``subprocess.Popen``'s, its exit status read from the template that forked it."""

    def __init__(self, pid: int, server: _Template) -> None:
        self.pid = pid
        self._server = server
        self._exit_fd = os.pidfd_open(pid)
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None and _readable(self._exit_fd, 0.0):
            self.returncode = self._server.reap(self.pid)
            os.close(self._exit_fd)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None and not _readable(self._exit_fd, timeout):
            raise subprocess.TimeoutExpired(f"rank process {self.pid}", timeout or 0.0)
        returncode = self.poll()
        assert returncode is not None
        return returncode


def _readable(fd: int, timeout: float | None) -> bool:
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(None if timeout is None else int(timeout * 1000)))


class _Template:
    """One template process (the controller's side of it)."""

    def __init__(self, env: dict[str, str], setup: _Setup, log: Path) -> None:
        ours, theirs = socket.socketpair()
        with ours, theirs, open(log, "wb") as out:
            self._popen = subprocess.Popen(
                [sys.executable, "-c", _TEMPLATE_MAIN, str(theirs.fileno())],
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
            self._conn = Connection(ours.detach())
        self._log = log
        self._conn.send(setup)

    def wait_ready(self, timeout_s: float) -> None:
        """Wait until the template has imported what it imports before its first fork."""
        try:
            ready = self._conn.poll(timeout_s) and self._conn.recv() == _READY
        except (EOFError, OSError) as error:
            raise ForkServerError(self._failure(f"ended while starting ({error!r})")) from None
        if not ready:
            raise ForkServerError(self._failure(f"did not get ready within {timeout_s:g} s"))

    def fork(self, env: dict[str, str], log: Path, authkey: bytes) -> ForkedRank:
        pid: int = self._ask(_Fork(env=env, log=str(log), authkey=authkey))
        return ForkedRank(pid, self)

    def reap(self, pid: int) -> int:
        returncode: int = self._ask(_Reap(pid))
        return returncode

    def _ask(self, request: _Fork | _Reap) -> int:
        try:
            self._conn.send(request)
            answer = self._conn.recv()
        except (EOFError, OSError) as error:
            raise ForkServerError(self._failure(f"stopped answering ({error!r})")) from None
        if not isinstance(answer, int):
            raise ForkServerError(self._failure(f"answered {answer!r}"))
        return answer

    def _failure(self, what: str) -> str:
        status = self._popen.poll()
        state = "" if status is None else f", {describe_exit(status)}"
        text = self._log.read_text(errors="replace").rstrip() if self._log.exists() else ""
        return f"the rank template {what}{state}; its output:\n{text or '(nothing)'}"

    def close(self) -> None:
        self._conn.close()  # the template leaves at end of file
        try:
            self._popen.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            self._popen.kill()
            self._popen.wait()


class TemplateWithoutModulesWarning(UserWarning):
    """A template could not import the session's test modules and was started without them."""

    def __init__(self, rank: int, error: ForkServerError) -> None:
        super().__init__(
            f"the template of rank {rank} was started again without the test modules, which "
            f"its ranks will import at their first test: {error}"
        )


class ForkServers:
    """The session's templates, one per rank index, each started when a world first needs
    that rank."""

    def __init__(
        self, directory: Path, settings: WorldSettings, modules: tuple[tuple[str, str], ...]
    ) -> None:
        """Templates whose logs go to ``directory``, that import ``modules`` ((name, path)
        of the test modules whose bodies the ranks will run)."""
        self._dir = directory
        self._setup = _Setup(
            settings.sys_path, settings.rootdir, settings.inifile, settings.verbosity, modules
        )
        self._timeout_s = settings.startup_timeout_s
        self._templates: dict[int, _Template] = {}

    def start(self, envs: list[dict[str, str]]) -> None:
        """Start the templates of ranks ``0 .. len(envs) - 1`` that are not running yet, rank
        r's with ``envs[r]``; they import side by side. A template that ends or hangs while
        importing the test modules (a module that exits or crashes on ranks) is started
        again without them: its ranks import each module at its first test, as spawned ranks
        do, and what breaks there fails that module's tests alone."""
        self._dir.mkdir(parents=True, exist_ok=True)
        starting = {
            rank: self._launch(rank, env, self._setup)
            for rank, env in enumerate(envs)
            if rank not in self._templates
        }
        try:
            for rank, template in starting.items():
                try:
                    template.wait_ready(self._timeout_s)
                except ForkServerError as error:
                    template.close()
                    warnings.warn(TemplateWithoutModulesWarning(rank, error), stacklevel=2)
                    bare = replace(self._setup, modules=())
                    self._launch(rank, envs[rank], bare).wait_ready(self._timeout_s)
        except ForkServerError:
            for rank in starting:
                self._templates.pop(rank).close()
            raise

    def _launch(self, rank: int, env: dict[str, str], setup: _Setup) -> _Template:
        template = _Template(env, setup, self._dir / f"template{rank}.log")
        self._templates[rank] = template
        return template

    def fork(self, rank: int, env: dict[str, str], log: Path, authkey: bytes) -> ForkedRank:
        """A new process for ``rank`` (whose template ``start`` started) whose environment is
        ``env``: what the rank reads after its start is the world's, as a spawned rank's is."""
        return self._templates[rank].fork(env, log, authkey)

    def close(self) -> None:
        """Stop every template (the ranks they forked live on until their worlds end)."""
        while self._templates:
            _, template = self._templates.popitem()
            template.close()


# ----- the template process ------------------------------------------------------------


def _warm(setup: _Setup) -> None:
    """Import what every rank imports before its first test, in a rank's order. A failed
    import is left to the rank, which imports it again and reports the error."""
    from harness import _rank_pytest
    from harness._preload import import_preloads, import_torch

    sys.path[:] = setup.sys_path
    with _left_to_the_rank():
        import_preloads()
    import_torch()  # the bulk of a rank's start

    config = _rank_pytest.make_config(setup.rootdir, setup.inifile, setup.verbosity)
    for name, path in setup.modules:
        with _left_to_the_rank():
            _rank_pytest.import_test_module(name, path, config)


@contextlib.contextmanager
def _left_to_the_rank() -> Iterator[None]:
    """Swallow what an import raised (an error, a module-level skip, an exit): the rank
    imports the module again and meets it where a spawned rank would."""
    try:
        yield
    except KeyboardInterrupt:
        raise
    except BaseException:
        pass


def _become_rank(request: _Fork) -> None:
    """In the forked child: a session of its own, output to its log, then the rank's life."""
    from harness import _rank

    os.setsid()
    log = os.open(request.log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    for fd, target in ((null, 0), (log, 1), (log, 2)):
        os.dup2(fd, target)
    os.close(log)
    os.close(null)
    os.environ.clear()
    os.environ.update(request.env)
    _rank.run(request.authkey)


def _fork(request: _Fork, conn: Connection) -> int:
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        conn.close()
        _become_rank(request)
        code = 0
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def serve(fd: int) -> None:
    """Warm up, then fork ranks and report their exit statuses until the controller, at
    the other end of the socket ``fd``, leaves."""
    conn = Connection(fd)
    _warm(conn.recv())
    conn.send(_READY)
    while True:
        try:
            request = conn.recv()
        except EOFError:
            return
        if isinstance(request, _Fork):
            conn.send(_fork(request, conn))
        else:
            _, status = os.waitpid(request.pid, 0)
            conn.send(os.waitstatus_to_exitcode(status))
