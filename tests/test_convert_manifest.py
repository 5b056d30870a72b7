"""The converter from the line format: patterns without glob escaping, one record per
divergence, and every id's outcome on every release the same before and after."""

from __future__ import annotations

import fnmatch
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from ci.gate import convert_manifest
from ci.gate.convert_manifest import LineEntry, convert, read_line_format, unescaped, unsafe
from harness.manifest import Divergence, id_matches, load, to_toml

# The suite's own manifest as it was last kept in the line format.
LINE_FORMAT = Path(__file__).parent / "data" / "upstream-line-format.txt"


@pytest.mark.parametrize(
    ("glob", "ids", "patterns"),
    [
        ("m.py::t[[]w2-*[]]", [], ["m.py::t[w2-*]"]),
        ("m.py::t[[]w[24]-*[]]", [], ["m.py::t[w2-*]", "m.py::t[w4-*]"]),
        ("m.py::t[[]w?-[bd]*[]]", [], ["m.py::t[w?-b*]", "m.py::t[w?-d*]"]),
        (
            "m.py::t[[]w?-[!m]*[]]",
            ["m.py::t[w2-missing]", "m.py::t[w2-shape]", "m.py::t[w4-dtype]", "o.py::t[w2-x]"],
            ["m.py::t[w?-d*]", "m.py::t[w?-s*]"],
        ),
    ],
)
def test_globs_become_patterns_without_escaping(
    glob: str, ids: list[str], patterns: list[str]
) -> None:
    assert unescaped(glob, ids) == patterns


def test_a_negated_class_without_ids_asks_for_them() -> None:
    with pytest.raises(SystemExit, match="pass the collected ids with --ids"):
        unescaped("m.py::t[[]w?-[!m]*[]]", [])


def test_entries_of_one_reason_link_range_and_kind_become_one_record() -> None:
    def entry(pattern: str, releases: str = ">=2.6", kind: str = "xfail") -> LineEntry:
        return LineEntry(pattern, "hang: rank 0 waits", "https://e.org/1", kind, releases, "m:1")

    records = convert(
        [
            entry("a.py::t[[]w2[]]", kind="skip"),
            entry("b.py::u[[]w4[]]", kind="skip"),
            entry("c.py::v", releases=">=2.8", kind="skip"),
            entry("d.py::w"),
        ],
        [],
    )
    assert [(r.id, r.tests, r.releases, r.skip) for r in records] == [
        ("hang-rank-0-waits", ("a.py::t[w2]", "b.py::u[w4]"), ">=2.6", "hang"),
        ("hang-rank-0-waits-2", ("c.py::v",), ">=2.8", "hang"),
        ("hang-rank-0-waits-3", ("d.py::w",), ">=2.6", None),
    ]


@pytest.mark.parametrize(
    ("reason", "why"),
    [
        ("hang: FSDP1 on a subgroup", "hang"),
        ("rank 0 segfaults while the others wait", "hang"),
        ("fails at random (2 of 6 runs)", "flaky"),
        ("the world's rank 1 aborts", "crash"),
    ],
)
def test_a_skip_says_why_running_it_is_unsafe(reason: str, why: str) -> None:
    assert unsafe(reason) == why


def _line_outcomes(
    entries: list[LineEntry], ids: list[str], release: Version
) -> dict[str, list[tuple[str, str, str]]]:
    outcomes: dict[str, list[tuple[str, str, str]]] = {nodeid: [] for nodeid in ids}
    for entry in entries:
        if SpecifierSet(entry.releases).contains(release, prereleases=True):
            for nodeid in fnmatch.filter(ids, entry.pattern):
                outcomes[nodeid].append((entry.kind, " ".join(entry.reason.split()), entry.link))
    return {nodeid: sorted(set(found)) for nodeid, found in outcomes.items()}


def _record_outcomes(
    divergences: list[Divergence],
    matched: dict[str, list[str]],
    ids: list[str],
    release: Version,
) -> dict[str, list[tuple[str, str, str]]]:
    outcomes: dict[str, list[tuple[str, str, str]]] = {nodeid: [] for nodeid in ids}
    for divergence in divergences:
        if divergence.holds_for(release):
            for test in divergence.tests:
                for nodeid in matched[test]:
                    outcomes[nodeid].append((divergence.kind, divergence.reason, divergence.link))
    return {nodeid: sorted(set(found)) for nodeid, found in outcomes.items()}


@pytest.mark.slow
def test_every_id_keeps_its_outcome_on_every_release(
    conformance_ids: list[str], tmp_path: Path
) -> None:
    recorded, entries = read_line_format(LINE_FORMAT)
    ids_file = tmp_path / "ids.txt"
    ids_file.write_text("\n".join(conformance_ids))
    out = tmp_path / "upstream.toml"
    assert convert_manifest.main([str(LINE_FORMAT), "--out", str(out), "--ids", str(ids_file)]) == 0
    converted = load(out)
    assert converted.recorded == recorded
    assert len(converted.divergences) < len(entries)
    # What each test of a record names, by the manifest's own matching: once, not per release.
    tests = {test for divergence in converted.divergences for test in divergence.tests}
    matched = {test: [n for n in conformance_ids if id_matches(test, n)] for test in tests}
    between = [Version(v) for v in ("2.5.0", "2.7.1", "2.11.0", "2.14.0", "2.16.0")]
    for release in [*recorded, *between]:
        before = _line_outcomes(entries, conformance_ids, release)
        after = _record_outcomes(converted.divergences, matched, conformance_ids, release)
        changed = [nodeid for nodeid in conformance_ids if before[nodeid] != after[nodeid]]
        assert not changed, f"{release}: {len(changed)} ids change, e.g. {changed[:3]}"
    assert any(before.values())  # the comparison saw marked ids


def test_a_converted_record_writes_and_matches_like_its_globs() -> None:
    (record,) = convert(
        [LineEntry("m.py::t[[]w[24]-*[]]", "r", "https://e.org/r", "xfail", "", "m:1")], []
    )
    assert to_toml([record]).count("m.py::t[w") == 2
    assert id_matches(record.tests[0], "m.py::t[w2-ddp]")
    assert not record.matches("m.py::t[w1-ddp]")
