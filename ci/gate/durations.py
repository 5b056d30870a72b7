"""The recorded durations the gate fits its deadlines to and weighs shards by, from a gate
run's results.

    python -m ci.gate.durations gate-report/gloo4/results.json [--out ci/gate/durations.json] \
        [--means-out ci/gate/mean-durations.json] [--update]

Writes, for each world test function, the longest duration of its ids that ran to the end
(passed, or failed as expected, neither hung nor crashed): ``{"path::test_function":
seconds}``. The gate passes the file to the harness (``--world-deadlines``), which gives those
tests ten times their recorded duration, at least 30 s: a release with a hang nobody recorded
yet loses that much per hang, not the 300 s default. Beside it, the mean duration of each
test function's ids at each world size, whatever their outcome (``{"path::test_function[w4]":
seconds}``; a test of no world by its function alone), by which ``--gate-shard`` and ``--jobs``
weigh each id: an id at 4 ranks costs more than the same test at 2, a skipped id next to
nothing, a hang its deadline (the longest would weigh a function with one slow id as if every
id were slow). ``--update`` keeps the recorded functions the run did not hold (a run of some
modules only), so new tests get their durations without a whole gate run.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ci.gate.node_ids import function_of, world_size_in
from ci.gate.results import GateResults

RECORDED = Path(__file__).resolve().parent / "durations.json"
MEANS = Path(__file__).resolve().parent / "mean-durations.json"
_RAN_TO_THE_END = ("passed", "xfailed", "xpassed")


def weight_key(nodeid: str) -> str:
    """What an id is weighed by: its test function at the world size it names
    (``path::test_f[w4]``), or its function alone for a test of no world."""
    size = world_size_in(nodeid)
    return function_of(nodeid) if size is None else f"{function_of(nodeid)}[w{size}]"


def _by_function(results: GateResults) -> dict[str, list[float]]:
    """The durations of each world test function's ids that ran to the end."""
    measured: dict[str, list[float]] = {}
    for test in results.tests:
        if test.world_size is not None and test.outcome in _RAN_TO_THE_END and not test.cut_short:
            measured.setdefault(function_of(test.nodeid), []).append(test.duration_s)
    return measured


def durations(results: GateResults) -> dict[str, float]:
    """The longest duration of each world test function's ids that ran to the end."""
    measured = _by_function(results)
    return {function: round(max(measured[function]), 2) for function in sorted(measured)}


def mean_durations(results: GateResults) -> dict[str, float]:
    """The mean duration of each test function's ids at each world size (``weight_key``),
    every id counted whatever its outcome."""
    measured: dict[str, list[float]] = {}
    for test in results.tests:
        measured.setdefault(weight_key(test.nodeid), []).append(test.duration_s)
    return {key: round(sum(seconds) / len(seconds), 3) for key, seconds in sorted(measured.items())}


def updated(recorded: dict[str, float], measured: dict[str, float]) -> dict[str, float]:
    """``recorded`` with ``measured``'s functions replaced or added, in name order."""
    return dict(sorted({**recorded, **measured}.items()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ci.gate.durations", description=__doc__.split("\n")[0]
    )
    parser.add_argument("results", type=Path, help="a gate run's results.json")
    parser.add_argument("--out", type=Path, default=RECORDED, help="the longest, for deadlines")
    parser.add_argument("--means-out", type=Path, default=MEANS, help="the means, for shards")
    parser.add_argument(
        "--update", action="store_true", help="keep the files' functions the run did not hold"
    )
    args = parser.parse_args(argv)
    results = GateResults.load(args.results)
    written = ((args.out, durations(results)), (args.means_out, mean_durations(results)))
    for path, recorded in written:
        if args.update and path.exists():
            recorded = updated(json.loads(path.read_text()), recorded)
        path.write_text(json.dumps(recorded, indent=1) + "\n")
        print(f"durations: {len(recorded)} test functions written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
