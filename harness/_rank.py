"""The main loop of a rank process in spawn mode.

Started by the controller as ``python -m harness._rank``, which reads the
authentication key from stdin, or forked from a template (``_forkserver``), which
hands it over. The rank connects back to the controller, joins the process group,
then runs test bodies one at a time until told to stop.
"""

from __future__ import annotations

import faulthandler
import os
import pickle
import signal
import sys
import traceback
from datetime import timedelta
from multiprocessing.connection import Client, Connection
from pathlib import Path

import pytest

from harness import _messages as msg
from harness import devices, outcomes
from harness._capture import FdCapture, stack_dump_path
from harness._context import WorldContext
from harness._env import CONTROLLER_ADDRESS, RANK, WORLD_DIR
from harness._groups import KeptMeshes
from harness._outcome import describe_exception
from harness._preload import import_preloads, import_torch
from harness.coverage import during_test, rank_coverage
from harness.outcomes import RankStatus

STACK_DUMP_SIGNAL = signal.SIGUSR1


def _export_launcher_variables(init: msg.Init, rank: int) -> None:
    """Give code that reads a launcher's variables (preloads, torch) this rank's, from the
    one message that says what the world is (spawned worlds live on one node)."""
    size = str(init.spec.size)
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=size, LOCAL_WORLD_SIZE=size)


def _join_world(init: msg.Init, rank: int) -> None:
    """Initialise the default process group through the controller's store, which
    ``MASTER_ADDR`` and ``MASTER_PORT`` name, as every launcher's do."""
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR=init.store_host, MASTER_PORT=str(init.store_port))

    devices.bind(init.spec.device_type, init.spec.device_index(rank))  # one node
    store = dist.TCPStore(
        init.store_host,
        init.store_port,
        world_size=init.spec.size,
        is_master=False,
        timeout=timedelta(seconds=init.settings.pg_timeout_s),
    )
    dist.init_process_group(
        init.spec.backend,
        store=store,
        rank=rank,
        world_size=init.spec.size,
        timeout=timedelta(seconds=init.settings.pg_timeout_s),
    )


def _reset_between_tests(meshes: KeptMeshes, passed: bool, counted: bool) -> int:
    """Undo per-test global state; return the process-group counter.

    Groups made by the test go (``KeptMeshes.after_test``), so they neither leak nor change
    the next test. The counter only grows, so ranks that created the same groups report the
    same value.
    """
    import torch

    count = meshes.after_test(passed, counted)
    _forget_compiled_graphs()
    torch.set_grad_enabled(True)
    return count


def _forget_compiled_graphs() -> None:
    """Drop what torch.compile traced in earlier tests: a graph traced through a DTensor
    collective holds its group's name, and releases such as 2.8 reuse it for a later test's
    equal mesh, whose groups have other names. Until a test compiled, there is nothing to drop.
    """
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is not None:
        dynamo.reset()


def _collective_counts(meshes: KeptMeshes) -> tuple[int, ...] | None:
    """How many collectives (and point-to-point operations, under gloo) this rank has run on
    the default group and on each kept mesh's groups, or None where the backend does not
    count them or the test destroyed one of those groups."""
    import torch.distributed as dist

    kept = meshes.groups()
    if kept is None:  # a test destroyed one: the meshes go (``KeptMeshes.after_test``)
        return None
    counts = []
    for group in dict.fromkeys((dist.group.WORLD, *kept)):
        count = getattr(group, "_get_sequence_number_for_group", None)
        if not callable(count):
            return None
        try:
            counts.append(int(count()))
        except RuntimeError:  # a backend without sequence numbers
            return None
    return tuple(counts)


class RankLoop:
    """One rank's side of the controller conversation."""

    def __init__(self, conn: Connection, init: msg.Init, rank: int) -> None:
        from harness import _rank_pytest

        self.conn = conn
        self.init = init
        self.rank = rank
        self.config = _rank_pytest.make_config(
            init.settings.rootdir, init.settings.inifile, init.settings.verbosity
        )
        self.capture = FdCapture(os.environ[WORLD_DIR], rank)
        self.meshes = KeptMeshes()
        self.coverage = rank_coverage(rank)
        _rank_pytest.install_assertion_explanations(self.config)

    def run_forever(self) -> None:
        while True:
            message = self.conn.recv()
            if isinstance(message, msg.Shutdown):
                return
            self.conn.send(self.run_test(message))

    def run_test(self, call: msg.TestRequest) -> msg.RankResult:
        """Run one test body; say how it ended (``BodyEnded``) before cleaning up after it,
        then return the result with the counters read in clean-up."""
        import torch

        from harness import _rank_pytest

        world = WorldContext(
            spec=self.init.spec,
            rank=self.rank,
            local_rank=self.rank,
            shared_dir=Path(call.tmp_path),
            launcher="spawn",
            meshes=self.meshes,
            tell_controller=self.conn.send,
        )
        default_dtype = torch.get_default_dtype()
        with self.capture.during_test(), during_test(self.coverage, call.nodeid):
            try:
                module = _rank_pytest.import_test_module(
                    call.module_name, call.module_path, self.config
                )
                test = _rank_pytest.resolve_test(module, call.qualname)
                test(world=world, **pickle.loads(call.params))
                status: RankStatus = outcomes.PASSED
                text, headline = "", ""
            except pytest.skip.Exception as exc:
                status, text, headline = outcomes.SKIPPED, str(exc.msg), ""
            except pytest.xfail.Exception as exc:
                status, text, headline = outcomes.XFAILED, str(exc.msg), ""
            except BaseException as exc:
                status = outcomes.FAILED
                text = _rank_pytest.format_failure(
                    exc, call.module_path, self.config, native=call.failure_expected
                )
                headline = describe_exception(exc)
            finally:
                torch.set_default_dtype(default_dtype)
        self.conn.send(msg.BodyEnded(rank=self.rank, status=status))
        counts = _collective_counts(self.meshes)
        return msg.RankResult(
            rank=self.rank,
            status=status,
            longrepr=text,
            pg_count=_reset_between_tests(
                self.meshes, status == outcomes.PASSED, counted=counts is not None
            ),
            collectives=counts,
            headline=headline,
            captured=self.capture.captured(),
            respawn=world.after_test.respawn,
        )


def _connect(rank: int, authkey: bytes) -> Connection:
    """Connect to the controller (authenticated) and say which rank this is."""
    host, port = os.environ[CONTROLLER_ADDRESS].rsplit(":", 1)
    conn = msg.without_delay(Client((host, int(port)), authkey=authkey))
    conn.send(rank)
    return conn


def run(authkey: bytes) -> None:
    """A rank's life, in a fresh interpreter or forked from a template (``_forkserver``):
    connect, join the world, run tests until told to stop."""
    rank = int(os.environ[RANK])
    faulthandler.enable(all_threads=True)
    stacks = open(stack_dump_path(os.environ[WORLD_DIR], rank), "w")  # noqa: SIM115 - kept open
    faulthandler.register(STACK_DUMP_SIGNAL, file=stacks, all_threads=True)
    conn = _connect(rank, authkey)
    init: msg.Init = conn.recv()
    sys.path[:] = init.settings.sys_path
    _export_launcher_variables(init, rank)
    try:
        import_preloads()
        import_torch()
        _join_world(init, rank)
        loop = RankLoop(conn, init, rank)
    except BaseException:
        conn.send(msg.InitFailed(rank=rank, traceback=traceback.format_exc()))
        raise
    conn.send(msg.Ready(rank=rank))
    loop.run_forever()
    import torch.distributed as dist

    dist.destroy_process_group()
    conn.close()


if __name__ == "__main__":
    run(bytes.fromhex(sys.stdin.readline().strip()))  # the controller writes the key first
