"""``python -m ci.gate.coverage``: record the coverage map of the torch under test.

    python -m ci.gate.coverage [--update | --resume] [--jobs N] [--out DIR]

runs the gate at world sizes 1, 2 and 4 with every rank tracing torch's measured files
(``harness/coverage.py``), then writes ``ci/gate/coverage-maps/torch-VERSION.json.xz``. The
map names every id the run ran, the arcs each executed, every torch file a rank imported, and
a digest of each check module. ``--update`` runs only the check modules whose digest changed,
that the map lacks, or whose ids changed, and replaces their part of the committed map: a new
check costs its own run, not the whole gate's. ``--resume`` goes on with a stopped recording
in ``--out``, running only the ids its data files do not hold yet. Tracing makes the gate two
to three times as slow.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

from ci.gate import cli
from ci.gate.coverage import map_path
from ci.gate.coverage.map import Arc, CoverageMap, build, load, save
from ci.gate.coverage.raw import contexts, executors, imported
from ci.gate.node_ids import path_of
from ci.gate.results import GateResults
from ci.gate.target import SUITE_ROOT
from ci.gate.tier import WORLD_SIZES, collected_ids
from conformance.divergences import release_of
from harness.coverage import COVERAGE_DIR, torch_root

CHECKS = SUITE_ROOT / "conformance" / "checks"


def digests() -> dict[str, str]:
    """Each check module's path (as node ids spell it) and the sha256 of its source."""
    return {
        path.relative_to(SUITE_ROOT).as_posix(): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(CHECKS.glob("test_*.py"))
    }


def stale_modules(recorded: CoverageMap, collected: Iterable[str]) -> list[str]:
    """The check modules whose part of ``recorded`` is stale: changed source, or ids the map
    and the suite do not share."""
    now = digests()
    changed = {path for path, digest in now.items() if recorded.digests.get(path) != digest}
    changed |= set(recorded.digests) - set(now)
    differing = set(recorded.ids).symmetric_difference(collected)
    return sorted(changed | {path_of(nodeid) for nodeid in differing})


def _data_files(out: Path) -> list[Path]:
    return sorted((out / "data").glob("rank*"))


def _run_gate(out: Path, jobs: str, paths: list[str], resume: bool) -> GateResults:
    """The gate's run of ``paths`` (every module where none is named), each rank tracing;
    resumed, without the ids the data files of ``out`` already hold."""
    data = out / "data"
    if not resume:
        shutil.rmtree(data, ignore_errors=True)
    data.mkdir(parents=True, exist_ok=True)
    done = sorted(contexts(_data_files(out))) if resume else []
    if done:
        print(f"coverage: resuming; {len(done)} ids are traced already")
    os.environ[COVERAGE_DIR] = str(data)
    argv = ["--world-backend", "gloo", "--world-sizes", WORLD_SIZES, "--jobs", jobs]
    skipped = [f"--deselect={nodeid}" for nodeid in done]
    status = cli.main([*argv, "--out", str(out / "gate"), "--", *paths, *skipped])
    print(f"coverage: the gate exited with {status}; a failing id's arcs count as any other's")
    return GateResults.load(out / "gate" / "results.json")


def recorded_map(out: Path, results: GateResults) -> CoverageMap:
    """The map of a recording's data files and its last run's results (a resumed recording's
    earlier ids are those its data files hold)."""
    files = _data_files(out)
    ran = sorted({test.nodeid for test in results.tests} | contexts(files))
    found = executors(files, torch_root(), ran)
    return build(
        torch=results.target.torch_version,
        world_sizes=WORLD_SIZES,
        ran=ran,
        executors=found,
        imported=imported(out / "data"),
        digests=digests(),
    )


def merged(old: CoverageMap, new: CoverageMap, replaced: list[str]) -> CoverageMap:
    """``old`` with the ids of the ``replaced`` modules taken from ``new``."""
    if old.torch != new.torch:
        raise ValueError(f"the committed map is of torch {old.torch}, this run of {new.torch}")
    kept = {nodeid for nodeid in old.ids if path_of(nodeid) not in replaced}
    combined: dict[tuple[str, Arc], frozenset[str]] = {}
    for pair, executing in old.executors().items():
        combined[pair] = executing & kept
    for pair, executing in new.executors().items():
        combined[pair] = combined.get(pair, frozenset()) | executing
    return build(
        torch=new.torch,
        world_sizes=new.world_sizes,
        ran=kept | set(new.ids),
        executors=combined,
        imported=old.imported | new.imported,
        digests=new.digests,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ci.gate.coverage", description=__doc__)
    parser.add_argument("--update", action="store_true", help="rerun only the stale modules")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="go on with a stopped recording in --out: run only the ids its data lacks",
    )
    parser.add_argument("--jobs", default="auto", help="the gate's --jobs (default: auto)")
    parser.add_argument("--out", type=Path, default=Path("gate-report/coverage"))
    args = parser.parse_args(argv)
    if args.update and args.resume:
        parser.error("--resume goes on with a whole recording; --update makes one of its own")
    import torch

    target = map_path(str(release_of(torch.__version__)))
    paths: list[str] = []
    if args.update:
        if not target.exists():
            parser.error(f"{target} does not exist: record it whole first")
        committed = load(target)
        paths = stale_modules(committed, collected_ids())
        if not paths:
            print(f"coverage: {target} is fresh")
            return 0
        print(f"coverage: rerunning {len(paths)} stale modules: {', '.join(paths)}")
    out: Path = args.out.resolve()
    running = [path for path in paths if (SUITE_ROOT / path).exists()]
    if args.update and not running:  # every stale module was removed
        coverage = merged(committed, replace(committed, ids=(), blocks=()), paths)
    else:
        new = recorded_map(out, _run_gate(out, args.jobs, running, args.resume))
        coverage = merged(committed, new, paths) if args.update else new
    save(coverage, target)
    print(
        f"coverage: wrote {target} ({target.stat().st_size / 1e6:.1f} MB): {len(coverage.ids)} "
        f"ids, {len(coverage.files)} files, {len(coverage.blocks)} blocks"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
