"""The map of upstream's tests names checks that exist, and its page and counts are fresh."""

from __future__ import annotations

from pathlib import Path

import pytest

from conformance import _upstream_map


def _write_map(tmp_path: Path, entry: str) -> Path:
    path = tmp_path / "map.toml"
    path.write_text(
        f'[[file]]\npath = "test/distributed/test_x.py"\ncommit = "abc"\n\n[[file.test]]\n{entry}\n'
    )
    return path


def test_every_check_the_map_names_exists() -> None:
    files = _upstream_map.load()
    assert _upstream_map.unknown_checks(files, _upstream_map.existing_checks()) == []


def test_the_page_is_fresh() -> None:
    assert _upstream_map.PAGE.read_text() == _upstream_map.page(_upstream_map.load()), (
        "conformance/UPSTREAM-MAP.md is stale: run python -m conformance._upstream_map"
    )


def test_the_readme_counts_are_fresh() -> None:
    readme = _upstream_map.README.read_text()
    assert readme == _upstream_map.refreshed_readme(readme, _upstream_map.load()), (
        "conformance/README.md's upstream map counts are stale: "
        "run python -m conformance._upstream_map"
    )


def test_a_check_that_no_longer_exists_is_named(tmp_path: Path) -> None:
    (tmp_path / "test_kept.py").write_text(
        "def test_kept():\n    pass\n\ndef helper():\n    pass\n"
    )
    path = _write_map(
        tmp_path,
        'name = "T.test_x"\nstatus = "covered"\n'
        'checks = ["test_kept.py::test_kept", "test_kept.py::test_gone", "test_kept.py::helper"]',
    )
    unknown = _upstream_map.unknown_checks(
        _upstream_map.load(path), _upstream_map.existing_checks(tmp_path)
    )
    assert unknown == [
        "test/distributed/test_x.py: T.test_x -> test_kept.py::test_gone",
        "test/distributed/test_x.py: T.test_x -> test_kept.py::helper",
    ]


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ('status = "done"', r"T\.test_x: status 'done' is none of"),
        ('status = "covered"', r"'covered' tests name the checks"),
        ('status = "partly"\nchecks = ["m.py::test_a"]', r"'partly' tests say 'missing'"),
        ('status = "not covered"', r"'not covered' tests say 'reason'"),
        (
            'status = "out of scope"\nreason = "r"\nchecks = ["m.py::test_a"]',
            r"'out of scope' tests name no checks",
        ),
        (
            'status = "covered"\nchecks = ["m.py::test_a"]\nreason = "r"',
            r"unexpected fields \['reason'\]",
        ),
        (
            'status = "covered"\nchecks = ["m.py::test_a"]\nkept = "k"',
            r"unexpected fields \['kept'\]",
        ),
    ],
)
def test_an_entry_that_breaks_its_status_rules_is_refused_naming_it(
    tmp_path: Path, entry: str, message: str
) -> None:
    path = _write_map(tmp_path, f'name = "T.test_x"\n{entry}')
    with pytest.raises(ValueError, match=message):
        _upstream_map.load(path)


def test_the_summary_counts_each_status() -> None:
    test = _upstream_map.UpstreamTest
    files = (
        _upstream_map.UpstreamFile(
            "a.py",
            "c",
            (
                test("T.test_1", "covered", ("m.py::test_a",), ""),
                test("T.test_2", "partly", ("m.py::test_a",), "x"),
                test("T.test_3", "covered", ("m.py::test_b",), ""),
            ),
        ),
        _upstream_map.UpstreamFile("b.py", "c", (test("T.test_4", "not covered", (), "y"),)),
    )
    assert _upstream_map.summary(files) == (
        "4 test functions of 2 upstream files: 2 covered, 1 partly, 0 out of scope, 1 not covered. "
        "Of the partly covered, 0 leave out only what has a stated reason and 1 are open."
    )


def test_a_partly_covered_test_without_a_reason_is_counted_open(tmp_path: Path) -> None:
    path = _write_map(
        tmp_path,
        'name = "T.test_x"\nstatus = "partly"\nchecks = ["m.py::test_a"]\nmissing = "m"\n\n'
        '[[file.test]]\nname = "T.test_y"\nstatus = "partly"\nchecks = ["m.py::test_a"]\n'
        'missing = "m"\nkept = "private: its public effect is judged"',
    )
    files = _upstream_map.load(path)
    assert _upstream_map.open_partly(files) == 1
    assert _upstream_map.summary(files).endswith(
        "Of the partly covered, 1 leave out only what has a stated reason and 1 are open."
    )
    assert "**Kept:** private: its public effect is judged" in _upstream_map.page(files)
