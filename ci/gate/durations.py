"""The recorded durations the gate fits its deadlines to, from a gate run's results.

    python -m ci.gate.durations gate-report/gloo4/results.json [--out ci/gate/durations.json] \
        [--update]

Writes, for each world test function, the longest duration of its ids that ran to the end
(passed, or failed as expected): ``{"path::test_function": seconds}``. The gate passes the
file to the harness (``--world-deadlines``), which gives those tests ten times their
recorded duration, at least 30 s: a release with a hang nobody recorded yet loses that much
per hang, not the 300 s default. ``--update`` keeps the recorded functions the run did not
hold (a run of some modules only), so new tests get their durations without a whole gate run.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ci.gate.results import GateResults

RECORDED = Path(__file__).resolve().parent / "durations.json"
_RAN_TO_THE_END = ("passed", "xfailed", "xpassed")


def durations(results: GateResults) -> dict[str, float]:
    """The longest duration of each world test function's ids that ran to the end."""
    longest: dict[str, float] = {}
    for test in results.tests:
        if test.world_size is not None and test.outcome in _RAN_TO_THE_END and not test.cut_short:
            function = test.nodeid.split("[", 1)[0]
            longest[function] = max(longest.get(function, 0.0), test.duration_s)
    return {function: round(seconds, 2) for function, seconds in sorted(longest.items())}


def updated(recorded: dict[str, float], measured: dict[str, float]) -> dict[str, float]:
    """``recorded`` with ``measured``'s functions replaced or added, in name order."""
    return dict(sorted({**recorded, **measured}.items()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ci.gate.durations", description=__doc__.split("\n")[0]
    )
    parser.add_argument("results", type=Path, help="a gate run's results.json")
    parser.add_argument("--out", type=Path, default=RECORDED)
    parser.add_argument(
        "--update", action="store_true", help="keep --out's functions the run did not hold"
    )
    args = parser.parse_args(argv)
    recorded = durations(GateResults.load(args.results))
    if args.update and args.out.exists():
        recorded = updated(json.loads(args.out.read_text()), recorded)
    args.out.write_text(json.dumps(recorded, indent=1) + "\n")
    print(f"durations: {len(recorded)} test functions written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
