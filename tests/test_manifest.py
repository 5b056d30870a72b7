"""Manifests of known divergences: parsing, matching, and reporting unused entries."""

from __future__ import annotations

from pathlib import Path

import pytest
from packaging.version import Version

from conformance._manifest import UPSTREAM_MANIFEST, Manifest, parse, release_of, resolve


def test_entries_parse_and_match_node_ids(tmp_path: Path) -> None:
    path = tmp_path / "m.txt"
    path.write_text(
        "# comment\n\nconformance/x.py::test_a[[]w*] | a reason | https://example.org/a#frag\n"
    )
    (entry,) = parse(path).entries
    assert entry.link == "https://example.org/a#frag"
    assert entry.matches("conformance/x.py::test_a[w2]")
    assert not entry.matches("conformance/x.py::test_ab[w2]")
    assert entry.source == f"{path}:3"


@pytest.mark.parametrize(
    "line",
    [
        "only a pattern",
        "p | reason",
        "p |  | link",
        "hang | p | reason | link",
        "releases >=2.x | p | reason | link",
        "recorded 2.13.0 two",
    ],
)
def test_malformed_entries_name_their_line(tmp_path: Path, line: str) -> None:
    path = tmp_path / "m.txt"
    path.write_text(line + "\n")
    with pytest.raises(ValueError, match=rf"{path}:1"):
        parse(path)


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


def _catalogue(tmp_path: Path) -> Manifest:
    path = tmp_path / "upstream.txt"
    path.write_text(
        "recorded 2.13.0 2.6.0 2.15.0\n"
        "releases >=2.6 | t.py::open_since_2_6 | r | https://example.org/1\n"
        "releases >=2.6,<2.15 | t.py::fixed_in_2_15 | r | https://example.org/2\n"
        "releases ==2.13.* | skip | t.py::hangs_in_2_13 | r | https://example.org/3\n"
    )
    return parse(path)


def _patterns(manifests: list[Manifest], version: str) -> list[str]:
    return [entry.pattern for entry in resolve(manifests, version).entries]


def test_entries_hold_by_the_release_of_the_build(tmp_path: Path) -> None:
    catalogue = [_catalogue(tmp_path)]
    assert _patterns(catalogue, "2.13.0+cpu") == [
        "t.py::open_since_2_6",
        "t.py::fixed_in_2_15",
        "t.py::hangs_in_2_13",
    ]
    assert _patterns(catalogue, "2.15.0a0+gitabc") == ["t.py::open_since_2_6"]
    assert _patterns(catalogue, "2.5.1") == []
    assert _patterns(catalogue, "2.8.0+npu") == ["t.py::open_since_2_6", "t.py::fixed_in_2_15"]


def test_a_recorded_release_infers_nothing(tmp_path: Path) -> None:
    resolution = resolve([_catalogue(tmp_path)], "2.13.0+cu126")
    assert resolution.recorded
    assert resolution.inferred == []


def test_an_unrecorded_newer_build_gets_the_entries_still_open_as_inferred(
    tmp_path: Path,
) -> None:
    fork = tmp_path / "fork.txt"
    fork.write_text("t.py::our_own_bug | ours | https://example.org/ours\n")
    resolution = resolve([_catalogue(tmp_path), parse(fork)], "2.16.0.dev20261101")
    assert not resolution.recorded
    assert resolution.newest_recorded == Version("2.15.0")
    assert [e.pattern for e in resolution.entries] == ["t.py::open_since_2_6", "t.py::our_own_bug"]
    assert [e.pattern for e in resolution.inferred] == ["t.py::open_since_2_6"]


def test_a_release_older_than_every_recorded_one_predates_the_suite(tmp_path: Path) -> None:
    older = resolve([_catalogue(tmp_path)], "2.5.1+cu124")
    assert older.predates_the_suite
    assert older.oldest_recorded == Version("2.6.0")
    assert not resolve([_catalogue(tmp_path)], "2.7.0").predates_the_suite
    assert not resolve([_catalogue(tmp_path)], "2.6.0").predates_the_suite


def test_the_header_says_how_the_release_resolved(tmp_path: Path) -> None:
    from conformance.conftest import release_line

    catalogue = [_catalogue(tmp_path)]
    assert release_line(resolve(catalogue, "2.13.0+cpu")) == (
        "known divergences: torch release 2.13.0 (recorded)"
    )
    assert release_line(resolve(catalogue, "2.16.0a0+gitabc")) == (
        "known divergences: torch release 2.16.0 is not recorded (newest recorded: 2.15.0); "
        "1 entries inferred from their release ranges"
    )
    assert release_line(resolve(catalogue, "2.5.1")) == (
        "known divergences: torch release 2.5.1 predates the oldest recorded release (2.6.0), "
        "the oldest this suite serves: failures may be the suite's own"
    )


def test_the_upstream_manifest_parses_and_records_releases() -> None:
    manifest = parse(UPSTREAM_MANIFEST)
    assert manifest.recorded
    assert all(entry.releases for entry in manifest.entries)


def _suite(pytester: pytest.Pytester, manifest: str, **modules: str) -> str:
    """A pytester suite with the manifest plugin, ``modules`` and ``manifest``; the manifest's
    ``--manifest`` argument."""
    pytester.makeconftest("pytest_plugins = ['conformance.conftest']")
    pytester.makepyfile(**modules)
    path = pytester.path / "m.txt"
    path.write_text(manifest)
    return f"--manifest={path}"


def test_unused_entries_are_reported(pytester: pytest.Pytester) -> None:
    manifest = _suite(
        pytester,
        "test_a.py::test_a | known | https://example.org\ntest_a.py::gone | old | https://example.org\n",
        test_a="def test_a():\n    assert False\n",
    )
    result = pytester.runpytest(manifest)
    result.assert_outcomes(xfailed=1)
    result.stdout.fnmatch_lines(
        ["*manifest entries that match no test*", "*m.txt:2: test_a.py::gone"]
    )


def test_skip_entries_skip_without_running(pytester: pytest.Pytester) -> None:
    manifest = _suite(
        pytester,
        "skip | test_a.py::test_hangs | hangs rank 0 | https://example.org/h\n",
        test_a="def test_hangs():\n    raise SystemExit('ran')\n",
    )
    result = pytester.runpytest(manifest, "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*manifest: hangs rank 0 (https://example.org/h)*"])


def test_a_run_of_chosen_ids_does_not_call_entries_stale(pytester: pytest.Pytester) -> None:
    manifest = _suite(
        pytester,
        "test_a.py::test_b | known | https://example.org\n",
        test_a="def test_a():\n    pass\n\ndef test_b():\n    assert False\n",
    )
    result = pytester.runpytest(manifest, "test_a.py::test_a")
    result.assert_outcomes(passed=1)
    assert "match no test" not in result.stdout.str()


def test_entries_of_modules_outside_the_run_are_not_judged(pytester: pytest.Pytester) -> None:
    manifest = _suite(
        pytester,
        "test_b.py::test_b | not run here | https://example.org\n"
        "test_gone.py::test_c | module deleted | https://example.org\n",
        test_a="def test_a():\n    pass\n",
        test_b="def test_b():\n    pass\n",
    )
    result = pytester.runpytest(manifest, "test_a.py")
    result.stdout.fnmatch_lines(["*m.txt:2: test_gone.py::test_c"])
    assert "m.txt:1" not in result.stdout.str()
