"""How close each memory check comes to its bound, over repeated runs of the checks.

    python -m ci.peak_margins [--runs 3] [--world-sizes 2,4] [--out peak-margins.json] \\
        [-- PYTEST_ARGS]

runs ``conformance/checks/test_peak_memory.py`` ``--runs`` times in a row on gloo, each rank
logging every measured call (``CONFORMANCE_PEAK_LOG``), and prints for each operation the
largest measured-to-bound ratio seen (peak over bound with its slack) and where: the margin a
flaky bound would lack. Exits 1 when a run failed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from ci.gate.target import SUITE_ROOT
from conformance import PEAK_LOG

MODULE = "conformance/checks/test_peak_memory.py"


def run_checks(
    runs: int, world_sizes: str, pytest_args: list[str]
) -> tuple[list[dict[str, Any]], int]:
    """Every logged call of ``runs`` runs, each tagged with its run; and how many failed."""
    records: list[dict[str, Any]] = []
    failed = 0
    with tempfile.TemporaryDirectory() as scratch:
        for run in range(runs):
            log = Path(scratch) / f"run{run}.jsonl"
            command = [sys.executable, "-m", "pytest", MODULE, "-q", "-p", "no:cacheprovider"]
            command += ["--world-backend", "gloo", "--world-sizes", world_sizes, *pytest_args]
            print(f"peak_margins: run {run + 1}/{runs}", flush=True)
            completed = subprocess.run(
                command, cwd=SUITE_ROOT, env={**os.environ, PEAK_LOG: str(log)}
            )
            failed += completed.returncode != 0
            lines = log.read_text().splitlines() if log.exists() else []
            records += [{**json.loads(line), "run": run} for line in lines]
    return records, failed


def largest_ratios(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """For each operation, the record with the largest peak-to-limit ratio (ratio added)."""
    worst: dict[str, dict[str, Any]] = {}
    for record in records:
        ratio = record["peak"] / record["limit"]
        if ratio > worst.get(record["operation"], {}).get("ratio", -1.0):
            worst[record["operation"]] = {**record, "ratio": ratio}
    return worst


def table(worst: dict[str, dict[str, Any]], runs: int) -> str:
    lines = [f"largest peak / bound over {runs} runs:", ""]
    lines.append("| operation | ratio | peak MiB | bound MiB | where |")
    lines.append("| --- | ---: | ---: | ---: | --- |")
    for operation, record in sorted(worst.items(), key=lambda item: -item[1]["ratio"]):
        where = f"{record['where']} rank {record['rank']} run {record['run'] + 1}"
        lines.append(
            f"| `{operation}` | {record['ratio']:.3f} | {record['peak'] / 2**20:.1f} | "
            f"{record['limit'] / 2**20:.1f} | {where} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ci.peak_margins", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--world-sizes", default="2,4")
    parser.add_argument("--out", type=Path, default=Path("peak-margins.json"))
    parser.add_argument("pytest_args", nargs="*", help="after --: more arguments for pytest")
    args = parser.parse_args(argv)
    records, failed = run_checks(args.runs, args.world_sizes, args.pytest_args)
    worst = largest_ratios(records)
    print(table(worst, args.runs))
    print(f"\n{len(records)} measured calls; {failed} of {args.runs} runs failed")
    args.out.write_text(
        json.dumps({"runs": args.runs, "largest": worst, "failed_runs": failed}, indent=1)
    )
    return 1 if failed or not records else 0


if __name__ == "__main__":
    sys.exit(main())
