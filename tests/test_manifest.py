"""Manifests of known divergences: parsing, matching, and reporting unused entries."""

from __future__ import annotations

from pathlib import Path

import pytest

from conformance._manifest import default_manifest, parse


def test_entries_parse_and_match_node_ids(tmp_path: Path) -> None:
    path = tmp_path / "m.txt"
    path.write_text(
        "# comment\n\nconformance/x.py::test_a[[]w*] | a reason | https://example.org/a#frag\n"
    )
    (entry,) = parse(path)
    assert entry.link == "https://example.org/a#frag"
    assert entry.matches("conformance/x.py::test_a[w2]")
    assert not entry.matches("conformance/x.py::test_ab[w2]")
    assert entry.source == f"{path}:3"


@pytest.mark.parametrize(
    "line", ["only a pattern", "p | reason", "p |  | link", "hang | p | reason | link"]
)
def test_malformed_entries_name_their_line(tmp_path: Path, line: str) -> None:
    path = tmp_path / "m.txt"
    path.write_text(line + "\n")
    with pytest.raises(ValueError, match=rf"{path}:1"):
        parse(path)


def test_default_manifest_drops_the_local_version_part() -> None:
    found = default_manifest("2.13.0+cpu")
    assert found is not None
    assert found.name == "2.13.0.txt"
    assert default_manifest("0.0.1") is None


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
