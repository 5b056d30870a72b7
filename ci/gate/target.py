"""The execution target of a gate run: what was judged, on what, by which suite."""

from __future__ import annotations

import datetime
import platform
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from harness.machine import MachineSignature, rank_threads, this_machine

SUITE_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class ExecutionTarget:
    """The facts a report states first, so that two reports can be told apart."""

    torch_version: str
    torch_git_hash: str
    cuda_version: str | None
    nccl_version: str | None
    backend: str
    device: str
    device_count: int
    world_sizes: tuple[int, ...]
    suite_commit: str
    python_version: str
    host: str
    date: str
    device_type: str = "cpu"  # reports from before device types were recorded ran on CPUs
    # What the ranks' computed bits depend on: one machine, or each machine that ran shards
    # of a merged run (none in reports from before it was recorded).
    machines: tuple[MachineSignature, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ExecutionTarget:
        return cls(
            **{
                **data,
                "world_sizes": tuple(data["world_sizes"]),
                "machines": tuple(map(MachineSignature.from_json, data.get("machines", ()))),
            }
        )


def detect(
    backend: str, device_type: str, world_sizes: tuple[int, ...], suite_commit: str
) -> ExecutionTarget:
    """The target of a run of ``backend`` worlds on ``device_type`` of ``world_sizes`` in this
    process, testing the suite at ``suite_commit`` (taken when the run starts: see
    ``suite_commit()``)."""
    import torch

    from harness import devices

    names = devices.device_names(device_type)
    return ExecutionTarget(
        torch_version=torch.__version__,
        torch_git_hash=torch.version.git_version,
        cuda_version=torch.version.cuda,
        nccl_version=_nccl_version() if torch.cuda.is_available() else None,
        backend=backend,
        device=names[0] if names else f"CPU: {_cpu_model()}",
        device_count=len(names),
        world_sizes=world_sizes,
        suite_commit=suite_commit,
        python_version=platform.python_version(),
        host=platform.node(),
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        device_type=device_type,
        machines=(this_machine(device_type, threads=rank_threads()),),
    )


def _nccl_version() -> str | None:
    import torch

    try:
        return ".".join(map(str, torch.cuda.nccl.version()))  # type: ignore[no-untyped-call]
    except (AttributeError, RuntimeError):
        return None


def _cpu_model() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def suite_commit() -> str:
    """The suite's git commit, with ``-dirty`` when its tree has changes; ``unknown`` outside
    a checkout."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(SUITE_ROOT), *args],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout.strip()

    try:
        commit = git("rev-parse", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return commit + ("-dirty" if dirty else "")
