"""Torchrun with two agents on this machine (c10d rendezvous on loopback, two ranks each): the
same ids and outcomes as a spawned world of four, rank 0 alone reports, and a crash or a hang
on the second agent's ranks is reported by rank without losing a result."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ci.gate.target import SUITE_ROOT
from tests._inner import INNER_DIR, Case, read_junit

pytestmark = pytest.mark.slow

MODULE = "conformance/checks/test_dcp_round_trips.py"
# Each family's round trip and two overwrites at 4 ranks (11 ids): worlds of the launched
# size alone, no partner's sub-world.
SELECTION = "not fsdp1 and (restores or replaces)"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def _agent(
    port: int, hosts: bool, local_addr: str, cwd: Path, args: list[str], env: dict[str, str]
) -> subprocess.Popen[str]:
    """One torchrun agent of two. The rendezvous orders agents by address, then process id:
    the one that ``hosts`` it starts first, so it holds group rank 0 unless its address sorts
    after the other's."""
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=2",
        "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id=nodes{port}",
        f"--rdzv-conf=is_host={int(hosts)}", f"--local-addr={local_addr}",
        "-m", "pytest", "-p", "no:cacheprovider", "-p", "harness.plugin", *args,
    ]  # fmt: skip
    return subprocess.Popen(
        command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def two_agents(
    cwd: Path, junit: Path, *pytest_args: str, rank_zero_hosts: bool = True, **env: str
) -> tuple[list[int], str, dict[str, Case]]:
    """Both agents' exit codes (the host's first), their joint output and rank 0's junit
    cases. ``rank_zero_hosts``: the rendezvous (and its store) lives on rank 0's agent."""
    port = _free_port()
    environment = {**os.environ, "HARNESS_SHARED_TMP": str(junit.parent / "shared"), **env}
    environment.pop("PYTEST_ADDOPTS", None)
    args = [*pytest_args, f"--junitxml={junit}"]
    host_addr = "127.0.0.1" if rank_zero_hosts else "127.0.0.2"  # sorts after the other's
    host = _agent(port, True, host_addr, cwd, args, environment)
    deadline = time.monotonic() + 60
    while not _listening(port) and time.monotonic() < deadline:
        time.sleep(0.1)
    other = _agent(port, False, "127.0.0.1", cwd, args, environment)
    outputs = [agent.communicate(timeout=600)[0] for agent in (host, other)]
    assert junit.exists(), "rank 0 wrote no junit XML:\n" + "\n".join(outputs)
    return [host.returncode, other.returncode], "\n".join(outputs), read_junit(junit)


def _inner(
    workdir: Path, misbehave: str, rank_zero_hosts: bool = True
) -> tuple[list[int], str, dict[str, Case]]:
    (workdir / "inner_nodes.py").write_text((INNER_DIR / "inner_nodes.py").read_text())
    return two_agents(
        workdir,
        workdir / "junit.xml",
        "inner_nodes.py",
        "-rA",
        rank_zero_hosts=rank_zero_hosts,
        INNER_MISBEHAVE=misbehave,
    )


def test_a_conformance_module_gives_the_ids_and_outcomes_of_a_spawned_world(
    tmp_path: Path,
) -> None:
    codes, output, by_agents = two_agents(
        SUITE_ROOT, tmp_path / "agents.xml", MODULE, "-q", "-k", SELECTION
    )
    spawned = tmp_path / "spawn.xml"
    subprocess.run(
        [sys.executable, "-m", "pytest", MODULE, "-q", "-p", "no:cacheprovider",
         "--world-sizes=4", "-k", SELECTION, f"--junitxml={spawned}"],
        cwd=SUITE_ROOT, capture_output=True, timeout=900, check=False,
    )  # fmt: skip
    by_spawn = read_junit(spawned)
    assert codes == [0, 0], output
    assert sorted(by_agents) == sorted(by_spawn)
    assert len(by_agents) >= 11
    assert all("[w4" in name for name in by_agents)
    differ = {
        name: (case.outcome, by_spawn[name].outcome)
        for name, case in by_agents.items()
        if case.outcome != by_spawn[name].outcome
    }
    assert not differ
    assert len(re.findall(r"\d+ passed", output)) == 1, "rank 0 alone prints the summary"


@pytest.mark.parametrize(
    ("misbehave", "what"),
    [
        ("crash", "ranks 2, 3 crashed, ranks 0, 1 passed"),
        ("hang", "ranks 2, 3 hung, ranks 0, 1 passed"),
    ],
)
def test_a_rank_lost_on_the_second_agent_is_named_and_no_result_is_lost(
    tmp_path: Path, misbehave: str, what: str
) -> None:
    codes, output, cases = _inner(tmp_path, misbehave)
    assert cases["test_ranks_span_two_agents[w4]"].outcome == "passed"
    lost = cases["test_misbehaves_on_the_second_agent[w4]"]
    assert lost.outcome == "failed"
    assert what in lost.message
    assert "test_after_the_misbehaviour[w4]" not in cases, "the launch ends at a lost rank"
    assert codes != [0, 0], output
    if misbehave == "crash":
        assert "rank 2 died: its heartbeat stopped" in lost.message
    else:
        assert "did not finish within the 5 s deadline" in lost.message
        assert "in test_misbehaves_on_the_second_agent" in lost.message


def test_when_the_rendezvous_host_is_lost_rank_0_still_reports(tmp_path: Path) -> None:
    """The second agent hosts the rendezvous and its ranks crash: the store goes with it, and
    torchrun stops rank 0's agent too; rank 0 reports before it goes."""
    codes, output, cases = _inner(tmp_path, "crash", rank_zero_hosts=False)
    assert cases["test_ranks_span_two_agents[w4]"].outcome == "passed"
    lost = cases["test_misbehaves_on_the_second_agent[w4]"]
    assert lost.outcome == "failed"
    assert "ranks 2, 3 crashed, ranks 0, 1 passed" in lost.message
    assert "test_after_the_misbehaviour[w4]" not in cases
    assert codes != [0, 0], output
