"""``python -m ci.gate.golden --out DIR``: the golden set of the torch under test.

Writes ``DIR/<release>/``: the checkpoints of ``conformance/checks/_golden_writer.py``
(DCP, saved and asynchronously saved, from every parallelism family at 1, 2 and 4 ranks;
FSDP1's FULL, SHARDED and LOCAL state dicts; one process's ``torch.save``) and ``record.json``: the
release, torch's version and git hash, the suite's commit, every file's hash and every value
each checkpoint holds. ``--index`` rewrites the table of the sets under ``DIR``
(``README.md``). The gate loads every set under ``conformance/golden/`` (or
``$GATE_GOLDEN_SETS``) into the build under test: ``conformance/checks/test_golden_checkpoints.py``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import torch

from ci.gate.target import SUITE_ROOT, suite_commit
from conformance import golden
from conformance.divergences import release_of
from harness.machine import MachineSignature

INDEX = "README.md"
WRITER_DEADLINE_S = 120  # a writer's test that hangs costs this long, not the default 300 s
INDEX_HEADING = """# Golden checkpoints

Each directory is the set one torch release wrote with `python -m ci.gate.golden --out
conformance/golden` (gloo, CPU): the record names the release, torch's git hash and the
suite's commit; the gate loads every set (`conformance/checks/test_golden_checkpoints.py`). This
table is generated: `python -m ci.gate.golden --out conformance/golden --index`.
"Skipped": checkpoints a known divergence of the release keeps it from writing (the reason in
`record.json`); "failed": checkpoints whose writer failed there (the error in `record.json`).
"Suite": the suite's commit; "computed on": the CPU and ATen capability of the machine
signature in the record.

| release | torch | torch git | suite | written | computed on | checkpoints | skipped | failed |
| --- | --- | --- | --- | --- | --- | --- | --- | --- |
"""


def writer_tests_that(ended: str, junit: Path) -> dict[str, str]:
    """The writer's tests whose junit case ``ended`` so (``skipped``, ``failure``, ``error``),
    each with the first line of its message: checkpoints the set lacks, and why."""
    if not junit.is_file():
        return {}
    found = {}
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        for outcome in case.findall(ended):
            found[case.get("name", "?")] = outcome.get("message", "").split("\n", 1)[0]
    return found


def write_set(out: Path, sizes: str, backend: str, device: str) -> int:
    """Write the torch under test's set under ``out``; pytest's exit status."""
    target = (out / str(release_of(torch.__version__))).resolve()
    if target.exists() and any(target.iterdir()):
        print(f"golden: {target} already holds a set; remove it to write it again", file=sys.stderr)
        return 2
    target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        junit = Path(scratch) / "junit.xml"
        command = [sys.executable, "-m", "pytest", str(golden.WRITER), "-p", "harness.plugin"]
        command += ["-q", "-p", "no:cacheprovider", f"--junitxml={junit}", "--world-sizes", sizes]
        command += ["--world-backend", backend, "--world-device", device]
        command += ["--world-timeout", str(WRITER_DEADLINE_S)]
        env = os.environ | {golden.OUT_VARIABLE: str(target)}
        status = subprocess.run(command, cwd=SUITE_ROOT, env=env, check=False).returncode
        if status not in (0, 1):  # interrupted, or no test ran: nothing to record
            print(f"golden: the writer failed (pytest exit {status}); no record", file=sys.stderr)
            return status
        failed = writer_tests_that("failure", junit) | writer_tests_that("error", junit)
        record = golden.assemble_record(
            target,
            torch_version=torch.__version__,
            torch_git=torch.version.git_version,
            suite_commit=suite_commit(),
            written=datetime.date.today().isoformat(),
            backend=backend,
            device=device,
            skipped=writer_tests_that("skipped", junit),
            failed=failed,
        )
    shutil.rmtree(target / golden.ENTRIES)
    (target / golden.RECORD).write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    written = len(record["checkpoints"])
    print(f"golden: {written} checkpoints of torch {torch.__version__} in {target}")
    for test, why in failed.items():
        print(f"golden: not written, its writer failed: {test}: {why}", file=sys.stderr)
    return status


def index_text(root: Path) -> str:
    """The table of the sets under ``root``: who wrote each, and what it holds."""
    rows = []
    for release in golden.recorded_releases(root):
        found = golden.golden_set(release, root)
        dirty = "-dirty" if found.suite_commit.endswith("-dirty") else ""
        rows.append(
            f"| {release} | {found.torch_version} | `{found.torch_git[:12]}` | "
            f"`{found.suite_commit[:12]}{dirty}` | "
            f"{found.written} | {_computed_on(found.machine)} | "
            f"{len(found.checkpoints)} | {len(found.skipped)} | "
            f"{len(found.failed)} |"
        )
    return INDEX_HEADING + "".join(f"{row}\n" for row in rows)


def _computed_on(machine: MachineSignature | None) -> str:
    return "no trajectory" if machine is None else f"{machine.cpu} ({machine.capability})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ci.gate.golden", description=__doc__)
    parser.add_argument("--out", type=Path, required=True, help="the directory of sets")
    parser.add_argument("--world-sizes", default="1,2,4", help="the writers' world sizes")
    parser.add_argument("--world-backend", default="gloo", help="the worlds' backend (gloo)")
    parser.add_argument("--world-device", default="cpu", help="the worlds' device type (cpu)")
    parser.add_argument(
        "--index", action="store_true", help="only rewrite DIR/README.md, the table of sets"
    )
    args = parser.parse_args(argv)
    if not args.index:
        status = write_set(args.out, args.world_sizes, args.world_backend, args.world_device)
        if status != 0:
            return status
    (args.out / INDEX).write_text(index_text(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
