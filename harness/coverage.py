"""Per-test coverage of torch's code in a rank process, for ``python -m ci.gate.coverage``.

Where ``HARNESS_TORCH_COVERAGE`` names a directory, each rank process traces the lines and
branches it executes in torch's measured files (``MEASURED``) and files them under the
node id of the test that ran them (a coverage.py context). Switching contexts writes the
arcs of the test that ended into the data file, so a rank killed later loses none of what
earlier tests executed; ``Coverage.save`` is never called, since it hashes the whole file
each time (a whole gate's rank would spend seconds a test on it). Beside it each rank lists the
files of every torch module it has imported (``imports-*.txt``): what a change can reach
without the tracer seeing it. Elsewhere nothing is imported and nothing is traced.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

COVERAGE_DIR = "HARNESS_TORCH_COVERAGE"
# torch's files whose execution is recorded, relative to the torch package: its state-dict
# and checkpoint code, and the wrappers whose state dicts it makes. Left out: code every
# tensor operation or call runs (DTensor's dispatch and sharding rules, nn.Module's calls,
# c10d's collectives), which would slow the recording further; a change there runs the whole
# gate (ci/gate/changed.py).
MEASURED = (
    "distributed/checkpoint/*",
    "distributed/_state_dict_utils.py",
    "distributed/fsdp/*",
    "distributed/_composable/*",
    "distributed/_shard/*",
    "distributed/tensor/_api.py",
    "distributed/tensor/_utils.py",
    "distributed/tensor/placement_types.py",
    "distributed/tensor/parallel/*",
    "distributed/pipelining/*",
    "optim/optimizer.py",
)


def torch_root() -> Path:
    """The directory of the torch package, found without importing it."""
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        raise RuntimeError("torch is not importable")
    return Path(spec.origin).parent


class RankCoverage:
    """A rank's tracer: started once, switched to each test's node id while it runs."""

    def __init__(self, directory: str, rank: int) -> None:
        import coverage

        root = torch_root()
        self._root = root
        self._imports = Path(directory) / f"imports-rank{rank}-pid{os.getpid()}.txt"
        self._imported: set[str] = set()
        self._modules_seen = 0  # how many modules sys.modules held when last listed
        self._coverage: Any = coverage.Coverage(
            data_file=str(Path(directory) / f"rank{rank}"),
            data_suffix=True,  # one file per process: host, pid and a random part
            branch=True,
            include=[str(root / pattern) for pattern in MEASURED],
            config_file=False,
        )
        self._coverage.start()

    @contextmanager
    def during(self, nodeid: str) -> Iterator[None]:
        self._coverage.switch_context(nodeid)
        try:
            yield
        finally:
            self._coverage.switch_context("")  # writes the test's arcs into the data file
            self._list_imports()

    def _list_imports(self) -> None:
        """Append the torch files imported since the last test; a test that imported nothing
        new costs one length check, not a walk of some 5,000 modules."""
        if len(sys.modules) == self._modules_seen:
            return
        self._modules_seen = len(sys.modules)
        files = {getattr(module, "__file__", None) for module in list(sys.modules.values())}
        inside = {
            Path(file).relative_to(self._root).as_posix()
            for file in files
            if isinstance(file, str) and file.startswith(str(self._root) + os.sep)
        }
        new = inside - self._imported
        if new:
            with self._imports.open("a") as listing:
                listing.writelines(f"{path}\n" for path in sorted(new))
            self._imported |= new


def rank_coverage(rank: int) -> RankCoverage | None:
    """This rank's tracer where the environment asks for one."""
    directory = os.environ.get(COVERAGE_DIR)
    return RankCoverage(directory, rank) if directory else None


def during_test(tracer: RankCoverage | None, nodeid: str) -> AbstractContextManager[None]:
    """Record what the test ``nodeid`` executes under its id, where a tracer runs."""
    return tracer.during(nodeid) if tracer is not None else nullcontext()
