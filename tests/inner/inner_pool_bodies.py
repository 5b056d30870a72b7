"""Bodies that tests/test_pool.py runs through WorldPool directly, without pytest's collection."""

import os

import torch
import torch.distributed as dist


def test_report_pid(world):
    (world.tmp_path / f"pid{world.rank}").write_text(str(os.getpid()))
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == world.size


def test_ask_for_a_fresh_world(world):
    assert world.respawn_after_test()
    test_report_pid(world)


def tcp_peer(fd):
    """The socket on ``fd``, dup'ed, and the address it is connected to, or None."""
    import socket

    try:
        dup = os.dup(fd)
    except OSError:  # closed since it was listed: the listing's own
        return None, None
    try:
        sock = socket.socket(fileno=dup)
    except OSError:  # not a socket
        os.close(dup)
        return None, None
    try:
        return sock, sock.getpeername() if sock.family == socket.AF_INET else None
    except OSError:  # a listening socket
        return sock, None


def test_check_the_controller_connection_sends_at_once(world):
    """The rank's connection to the controller has Nagle's algorithm off (TCP_NODELAY)."""
    import socket

    from harness._env import CONTROLLER_ADDRESS

    host, port = os.environ[CONTROLLER_ADDRESS].rsplit(":", 1)
    found = []
    for name in os.listdir("/proc/self/fd"):
        sock, peer = tcp_peer(int(name))
        if sock is None:
            continue
        with sock:
            if peer == (host, int(port)):
                found.append(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
    assert found == [1], found
    test_report_pid(world)


def test_last_rank_fails_the_others_wait(world):
    if world.rank == world.size - 1:
        raise ValueError(f"injected failure on rank {world.rank}")
    dist.barrier()  # never left: the last rank raised instead of joining it
