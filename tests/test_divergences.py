"""Manifests of known divergences: TOML records, each holding for tests over releases once or
several times, matching, resolution by release, fitted ranges, and the suite's own manifest
against the ids the suite collects."""

from __future__ import annotations

from pathlib import Path

import pytest
from packaging.version import Version

from conformance import UPSTREAM_MANIFEST
from conformance.divergences import (
    Divergence,
    Holding,
    Manifest,
    ManifestError,
    fit_range,
    id_matches,
    load,
    release_of,
    resolve,
    to_toml,
)

RECORD = """
[[divergence]]
id = "a-known-bug"
link = "https://example.org/a#frag"
reason = "what goes wrong"
tests = ["conformance/x.py::test_a[w*]"]
"""


def _write(tmp_path: Path, text: str, name: str = "m.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_record_loads_and_matches_ids_with_literal_brackets(tmp_path: Path) -> None:
    path = _write(tmp_path, RECORD)
    (divergence,) = load(path).divergences
    assert divergence.link == "https://example.org/a#frag"
    (known,) = divergence.known_in(Version("2.13.0"))
    assert known.kind == "xfail"
    assert known.matches("conformance/x.py::test_a[w2]")
    assert not known.matches("conformance/x.py::test_ab[w2]")
    assert known.source == f"{path}#a-known-bug"


@pytest.mark.parametrize(
    ("pattern", "nodeid", "matches"),
    [
        ("m.py::t[w2-ddp]", "m.py::t[w2-ddp]", True),
        ("m.py::t[w2-ddp]", "m.py::t[w2-dd]", False),
        ("m.py::t[w?-*]", "m.py::t[w4-fsdp2-full]", True),
        ("m.py::t[w?-*]", "m.py::t[w14-fsdp2]", False),
        ("m.py::t[w[24]]", "m.py::t[w2]", False),  # no character classes: literal brackets
        ("m.py::t[w[24]]", "m.py::t[w[24]]", True),
        ("m.py::t.x", "m.py::tyx", False),  # a dot is a dot
    ],
)
def test_only_star_and_question_mark_are_wildcards(
    pattern: str, nodeid: str, matches: bool
) -> None:
    assert id_matches(pattern, nodeid) is matches


@pytest.mark.parametrize(
    ("replace", "by", "message"),
    [
        ('link = "https://example.org/a#frag"', 'link = "TODO"', "link must be a URL"),
        ('id = "a-known-bug"', 'id = "A known bug"', "id must be lowercase words"),
        ('reason = "what goes wrong"', 'reason = " "', "needs a reason"),
        ('tests = ["conformance/x.py::test_a[w*]"]', "tests = []", "at least one test"),
        ('reason = "what goes wrong"', 'reason = "r"\nskip = "slow"', "skip must be one of"),
        ('reason = "what goes wrong"', 'reason = "r"\nreleases = ">=2.x"', "PEP 440 specifier"),
        ('reason = "what goes wrong"', 'reason = "r"\npattern = "p"', "unknown fields"),
        ('link = "https://example.org/a#frag"\n', "", "missing fields \\['link'\\]"),
    ],
)
def test_a_malformed_record_is_refused_naming_it(
    tmp_path: Path, replace: str, by: str, message: str
) -> None:
    path = _write(tmp_path, RECORD.replace(replace, by))
    with pytest.raises(ManifestError, match=message) as refused:
        load(path)
    assert str(path) in str(refused.value)


def test_an_id_given_twice_and_a_file_not_toml_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match=r"more than one divergence: \['a-known-bug'\]"):
        load(_write(tmp_path, RECORD + RECORD))
    old = _write(tmp_path, "t.py::test | reason | https://example.org\n", "old.txt")
    with pytest.raises(ManifestError, match="not a TOML manifest"):
        load(old)


HOLDS_TWICE = """
[[divergence]]
id = "empty-shard-load"
link = "https://example.org/e"
reason = "rank 3 holds no chunk"
[[divergence.holds]]
releases = ">=2.8"
tests = ["m.py::load[w4-fsdp1_full_shard_*]"]
[[divergence.holds]]
releases = ">=2.6"
skip = "hang"
tests = ["m.py::resume[w4-*]"]
"""


def test_a_record_holds_for_several_sets_of_tests_each_over_its_releases(tmp_path: Path) -> None:
    (divergence,) = load(_write(tmp_path, HOLDS_TWICE)).divergences
    assert [(h.releases, h.skip) for h in divergence.holdings] == [
        (">=2.8", None),
        (">=2.6", "hang"),
    ]
    (known,) = divergence.known_in(Version("2.7.1"))
    assert (known.kind, known.reason, known.tests) == (
        "skip",
        "rank 3 holds no chunk",
        ("m.py::resume[w4-*]",),
    )
    assert [k.kind for k in divergence.known_in(Version("2.13.0"))] == ["xfail", "skip"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            HOLDS_TWICE.replace(
                'reason = "rank 3 holds no chunk"\n', 'reason = "r"\ntests = ["m.py::x"]\n'
            ),
            "not both",
        ),
        (
            HOLDS_TWICE.replace('skip = "hang"\n', 'skip = "hang"\nnote = "n"\n'),
            r"unknown fields \['note'\]",
        ),
        (HOLDS_TWICE.replace('tests = ["m.py::resume[w4-*]"]\n', ""), "tests must be a list"),
    ],
)
def test_a_malformed_holding_is_refused_naming_its_record(
    tmp_path: Path, text: str, message: str
) -> None:
    with pytest.raises(ManifestError, match=message) as refused:
        load(_write(tmp_path, text))
    assert "#empty-shard-load" in str(refused.value)


def test_records_written_as_toml_load_back_the_same(tmp_path: Path) -> None:
    written = [
        Divergence(
            id="hangs-with-a-quote",
            link="https://example.org/h",
            reason='rank 0 waits in "barrier" \\ forever ' + "and a long tail " * 12,
            holdings=(
                Holding(("m.py::t[w4-*]", "m.py::u[w2]"), releases=">=2.6,<2.14.1", skip="hang"),
                Holding(("m.py::w[w2]",), releases=">=2.8"),
            ),
        ),
        Divergence(
            id="plain", link="https://example.org/p", reason="r", holdings=(Holding(("m.py::v",)),)
        ),
    ]
    path = _write(tmp_path, to_toml(written, [Version("2.13.0")], header="a header\nof two"))
    manifest = load(path)
    assert manifest.recorded == [Version("2.13.0")]
    assert [(d.id, d.link, d.reason, d.holdings) for d in manifest.divergences] == [
        (d.id, d.link, " ".join(d.reason.split()), d.holdings) for d in written
    ]


@pytest.mark.parametrize(
    ("version", "release"),
    [
        ("2.13.0", "2.13.0"),
        ("2.13.0+cpu", "2.13.0"),
        ("2.15.0+cu132", "2.15.0"),
        ("2.15.0a0+gitabc1234", "2.15.0"),
        ("2.16.0.dev20261101", "2.16.0"),
        ("2.16.0rc2", "2.16.0"),
        ("2.8.0+npu", "2.8.0"),
        ("2.14.1", "2.14.1"),
    ],
)
def test_a_build_resolves_to_its_release(version: str, release: str) -> None:
    assert release_of(version) == Version(release)


def test_a_version_that_is_not_pep_440_is_refused() -> None:
    with pytest.raises(ValueError, match="'fork-build-7' is not a PEP 440 version"):
        release_of("fork-build-7")


def _record(record_id: str, releases: str = "", skip: str = "") -> str:
    return (
        f'[[divergence]]\nid = "{record_id}"\nlink = "https://example.org/{record_id}"\n'
        f'reason = "r"\ntests = ["t.py::{record_id}"]\n'
        + (f'releases = "{releases}"\n' if releases else "")
        + (f'skip = "{skip}"\n' if skip else "")
    )


def _catalogue(tmp_path: Path) -> Manifest:
    return load(
        _write(
            tmp_path,
            'recorded = ["2.13.0", "2.6.0", "2.15.0"]\n'
            + _record("open-since-2-6", ">=2.6")
            + _record("fixed-in-2-15", ">=2.6,<2.15")
            + _record("hangs-in-2-13", "==2.13.*", skip="hang"),
            "upstream.toml",
        )
    )


def _ids(manifests: list[Manifest], version: str) -> list[str]:
    return [known.id for known in resolve(manifests, version).known]


def test_records_hold_by_the_release_of_the_build(tmp_path: Path) -> None:
    catalogue = [_catalogue(tmp_path)]
    assert _ids(catalogue, "2.13.0+cpu") == ["open-since-2-6", "fixed-in-2-15", "hangs-in-2-13"]
    assert _ids(catalogue, "2.15.0a0+gitabc") == ["open-since-2-6"]
    assert _ids(catalogue, "2.5.1") == []
    assert _ids(catalogue, "2.8.0+npu") == ["open-since-2-6", "fixed-in-2-15"]


def test_a_recorded_release_infers_nothing(tmp_path: Path) -> None:
    resolution = resolve([_catalogue(tmp_path)], "2.13.0+cu126")
    assert resolution.recorded
    assert resolution.inferred == []


def test_an_unrecorded_newer_build_gets_the_records_still_open_as_inferred(
    tmp_path: Path,
) -> None:
    fork = load(_write(tmp_path, _record("our-own-bug"), "fork.toml"))
    resolution = resolve([_catalogue(tmp_path), fork], "2.16.0.dev20261101")
    assert not resolution.recorded
    assert resolution.newest_recorded == Version("2.15.0")
    assert [known.id for known in resolution.known] == ["open-since-2-6", "our-own-bug"]
    assert [d.id for d in resolution.inferred] == ["open-since-2-6"]


def test_a_release_older_than_every_recorded_one_predates_the_suite(tmp_path: Path) -> None:
    older = resolve([_catalogue(tmp_path)], "2.5.1+cu124")
    assert older.predates_the_suite
    assert older.oldest_recorded == Version("2.6.0")
    assert not resolve([_catalogue(tmp_path)], "2.7.0").predates_the_suite
    assert not resolve([_catalogue(tmp_path)], "2.6.0").predates_the_suite


def test_a_resolution_says_how_the_release_resolved(tmp_path: Path) -> None:
    catalogue = [_catalogue(tmp_path)]
    assert resolve(catalogue, "2.13.0+cpu").describe() == "torch release 2.13.0 (recorded)"
    assert resolve(catalogue, "2.16.0a0+gitabc").describe() == (
        "torch release 2.16.0 is not recorded: newer than every recorded release (newest: "
        "2.15.0); 1 known divergences inferred from their release ranges"
    )
    assert resolve(catalogue, "2.11.0+cu130").lies_between == (Version("2.6.0"), Version("2.13.0"))
    assert (
        resolve(catalogue, "2.11.0+cu130")
        .describe()
        .startswith(
            "torch release 2.11.0 is not recorded: it lies between recorded 2.6.0 and 2.13.0; "
        )
    )
    assert resolve(catalogue, "2.15.0").lies_between is None
    assert resolve(catalogue, "2.5.1").describe() == (
        "torch release 2.5.1 predates the oldest recorded release (2.6.0), the oldest this "
        "suite serves: failures may be the suite's own"
    )


def test_unused_records_are_those_of_judged_modules_that_match_no_id(tmp_path: Path) -> None:
    (tmp_path / "test_a.py").write_text("")
    (tmp_path / "test_b.py").write_text("")
    manifest = load(
        _write(
            tmp_path,
            _record("known").replace("t.py::known", "test_a.py::test_a")
            + _record("gone").replace("t.py::gone", "test_a.py::gone")
            + _record("not-run").replace("t.py::not-run", "test_b.py::test_b")
            + _record("deleted").replace("t.py::deleted", "test_gone.py::test_c"),
        )
    )
    resolution = resolve([manifest], "2.13.0")
    unused = resolution.unused(["test_a.py::test_a"], tmp_path)
    assert [d.id for d in unused] == ["gone", "deleted"]


V = Version


@pytest.mark.parametrize(
    ("showings", "fitted"),
    [
        ({V("2.6.0"): "fails", V("2.8.0"): "fails", V("2.13.0"): "fails"}, ">=2.6"),
        ({V("2.6.0"): "fails", V("2.8.0"): "fails", V("2.14.1"): "passes"}, ">=2.6,<2.14.1"),
        ({V("2.6.0"): "passes", V("2.8.0"): "fails", V("2.13.0"): "fails"}, ">=2.8"),
        ({V("2.6.0"): "not run", V("2.8.0"): "fails", V("2.15.0"): "-"}, ">=2.8"),
        ({V("2.6.0"): "passes", V("2.14.1"): "fails"}, ">=2.14.1"),
    ],
)
def test_a_range_is_fitted_from_the_runs(showings: dict[Version, str], fitted: str) -> None:
    assert fit_range(showings) == fitted  # type: ignore[arg-type]


def test_a_divergence_that_comes_back_has_no_single_range() -> None:
    with pytest.raises(ValueError, match=r"fail in 2\.6\.0, 2\.13\.0 but pass in 2\.8\.0"):
        fit_range({V("2.6.0"): "fails", V("2.8.0"): "passes", V("2.13.0"): "fails"})
    with pytest.raises(ValueError, match="failed in no run"):
        fit_range({V("2.6.0"): "passes"})


def test_the_upstream_manifest_records_releases_and_ranges_every_holding() -> None:
    manifest = load(UPSTREAM_MANIFEST)
    assert manifest.recorded
    assert all(h.releases for divergence in manifest.divergences for h in divergence.holdings)


def test_the_upstream_manifest_states_each_reason_once() -> None:
    reasons = [divergence.reason for divergence in load(UPSTREAM_MANIFEST).divergences]
    assert sorted(r for r in set(reasons) if reasons.count(r) > 1) == []


@pytest.mark.slow
def test_every_upstream_record_names_tests_the_suite_collects(conformance_ids: list[str]) -> None:
    unmatched = [
        f"{divergence.id}: {test}"
        for divergence in load(UPSTREAM_MANIFEST).divergences
        for holding in divergence.holdings
        for test in holding.tests
        if not any(id_matches(test, nodeid) for nodeid in conformance_ids)
    ]
    assert not unmatched, "tests no collected id matches:\n" + "\n".join(unmatched)


# ----- in a pytest session ------------------------------------------------------------


def _suite(pytester: pytest.Pytester, records: str, **modules: str) -> str:
    """A pytester suite with the conformance conftest, ``modules`` and a manifest of
    ``records``; the manifest's ``--manifest`` argument."""
    pytester.makeconftest("pytest_plugins = ['conformance.conftest']")
    pytester.makepyfile(**modules)
    path = pytester.path / "m.toml"
    path.write_text(records)
    return f"--manifest={path}"


HANGS = """
[[divergence]]
id = "hangs-rank-0"
link = "https://example.org/h"
reason = "hangs rank 0"
skip = "hang"
tests = ["test_a.py::test_hangs"]

[[divergence]]
id = "known"
link = "https://example.org/k"
reason = "known"
tests = ["test_a.py::test_known"]
"""
MODULE = (
    "def test_hangs():\n    raise SystemExit('ran')\n\n"
    "def test_known():\n    assert False\n\n"
    "def test_fine():\n    pass\n"
)


def test_records_mark_their_tests_skipped_or_expected_to_fail(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest(_suite(pytester, HANGS, test_a=MODULE), "-rs")
    result.assert_outcomes(skipped=1, xfailed=1, passed=1)
    result.stdout.fnmatch_lines(["*manifest: hangs rank 0 (https://example.org/h)*"])


WORLD_MODULE = """
import os
import pytest

@pytest.mark.world(2)
def test_hangs(world):
    pass  # fixed in this build

@pytest.mark.world(2)
def test_still_hangs(world):
    assert world.rank == 1

def test_other():
    pass
"""
LIFTED = """
[[divergence]]
id = "hangs-in-a-world"
link = "https://example.org/w"
reason = "hangs"
skip = "hang"
tests = ["test_w.py::test_*hangs[w2]"]
"""


@pytest.mark.slow
def test_lifted_skips_run_alone_and_show_which_now_pass(pytester: pytest.Pytester) -> None:
    args = (_suite(pytester, LIFTED, test_w=WORLD_MODULE), "--manifest-lift-skips", "-rxX")
    result = pytester.runpytest(*args)
    result.assert_outcomes(failed=1, xfailed=1, deselected=1)
    result.stdout.fnmatch_lines(
        [
            "*_ test_hangs?w2? _*",
            "?XPASS(strict)? skipped (hang) by hangs-in-a-world: hangs (https://example.org/w)",
            "XFAIL test_w.py::test_still_hangs?w2? - skipped (hang) by hangs-in-a-world*",
        ]
    )
