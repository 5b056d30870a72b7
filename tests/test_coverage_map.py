"""The coverage map: read from the ranks' coverage.py data, stored in blocks, updated module
by module and kept fresh, and covered greedily by the quick tier."""

from __future__ import annotations

from pathlib import Path

import coverage
import pytest

from ci.gate.coverage import TIER_RELEASE, map_path, record
from ci.gate.coverage import map as coverage_map
from ci.gate.coverage.cover import Executed, cover
from ci.gate.coverage.raw import contexts, executors, imported
from ci.gate.coverage.record import digests, merged, stale_modules
from ci.gate.tier import collected_ids
from harness.coverage import COVERAGE_DIR

A = "conformance/checks/test_a.py::t[w2-ddp]"
B = "conformance/checks/test_a.py::t[w4-ddp]"
C = "conformance/checks/test_b.py::u[w2]"


def _map(executing: dict[tuple[str, tuple[int, int]], set[str]], ran=(A, B, C)):
    return coverage_map.build(
        torch="2.13.0",
        world_sizes="1,2,4",
        ran=ran,
        executors={pair: frozenset(ids) for pair, ids in executing.items()},
        imported={"nn/modules/module.py"},
        digests={"conformance/checks/test_a.py": "x"},
    )


def test_index_runs_encode_and_decode() -> None:
    assert coverage_map.runs([9, 3, 4, 5]) == [3, 3, 9, 1]
    assert coverage_map.from_runs([3, 3, 9, 1]) == {3, 4, 5, 9}
    assert coverage_map.runs([]) == []


def test_arcs_that_the_same_ids_executed_form_one_block() -> None:
    built = _map(
        {
            ("distributed/x.py", (1, 2)): {A, B},
            ("distributed/x.py", (2, 3)): {A, B},
            ("distributed/x.py", (2, -1)): {A},
            ("distributed/y.py", (1, 2)): {A, B},
        }
    )
    by_file = {
        (block.file, block.arcs): {built.ids[i] for i in block.ids} for block in built.blocks
    }
    assert by_file == {
        ("distributed/x.py", ((1, 2), (2, 3))): {A, B},
        ("distributed/x.py", ((2, -1),)): {A},
        ("distributed/y.py", ((1, 2),)): {A, B},
    }
    assert built.ids == (A, B, C)  # C ran and executed nothing measured
    assert built.ids_executing("distributed/x.py") == {A, B}
    assert built.ids_executing("distributed/z.py") == set()


def test_a_map_comes_back_from_its_file_as_saved(tmp_path) -> None:
    built = _map({("distributed/x.py", (1, 2)): {A, C}, ("distributed/x.py", (-1, 1)): {B}})
    coverage_map.save(built, tmp_path / "m.json.xz")
    loaded = coverage_map.load(tmp_path / "m.json.xz")
    assert (loaded.ids, loaded.blocks, loaded.imported) == (built.ids, built.blocks, built.imported)
    assert (loaded.torch, dict(loaded.digests)) == ("2.13.0", {"conformance/checks/test_a.py": "x"})
    assert loaded.executors() == built.executors()


def _data_files(directory: Path, root: Path) -> list[Path]:
    """Real coverage.py data files, as two ranks write them: arcs under each test's id, and
    between tests under the empty context, which is nobody's."""
    planner = str(root / "distributed" / "planner.py")
    for rank, by_context in enumerate(
        ({A: {(1, 2), (2, 3)}, "": {(7, 8)}}, {A: {(2, 5)}, B: {(1, 2)}})
    ):
        data = coverage.CoverageData(basename=str(directory / f"rank{rank}"))
        for context, arcs in by_context.items():
            data.set_context(context)
            data.add_arcs({planner: arcs})
        data.write()
    return sorted(directory.glob("rank*"))


def test_the_ranks_data_files_are_read_by_context(tmp_path) -> None:
    root = tmp_path / "torch"
    files = _data_files(tmp_path, root)
    (tmp_path / "imports-rank0-pid1.txt").write_text(
        "distributed/planner.py\nnn/modules/module.py\n"
    )
    assert contexts(files) == {A, B}
    assert executors(files, root, [A, B]) == {
        ("distributed/planner.py", (1, 2)): {A, B},
        ("distributed/planner.py", (2, 3)): {A},
        ("distributed/planner.py", (2, 5)): {A},
    }
    assert imported(tmp_path) == {"distributed/planner.py", "nn/modules/module.py"}


def test_a_resumed_recording_runs_only_the_ids_its_data_lacks(tmp_path, monkeypatch) -> None:
    data = tmp_path / "out" / "data"
    data.mkdir(parents=True)
    _data_files(data, tmp_path / "torch")
    monkeypatch.setenv(COVERAGE_DIR, "")  # restored after the test: the run sets it
    given: list[list[str]] = []
    monkeypatch.setattr(record.cli, "main", lambda argv: given.append(argv) or 0)
    monkeypatch.setattr(record.GateResults, "load", lambda path: path)
    record._run_gate(tmp_path / "out", "1", [], resume=True)
    assert given[-1][-2:] == [f"--deselect={A}", f"--deselect={B}"]
    assert len(list(data.glob("rank*"))) == 2  # kept
    record._run_gate(tmp_path / "out", "1", [], resume=False)
    assert not [arg for arg in given[-1] if arg.startswith("--deselect")]
    assert list(data.glob("rank*")) == []  # a new recording starts empty


def test_the_cover_adds_the_most_arcs_per_second_until_the_members_arcs_are_all_run() -> None:
    executed = Executed(
        elements={A: frozenset({0, 1}), B: frozenset({0, 1, 2}), C: frozenset({2})},
        weights=(10, 5, 1),
    )
    seconds = {A: 1.0, B: 4.0, C: 0.5}
    assert cover([A, B, C], executed, [], seconds.__getitem__) == [A, C]
    assert cover([A, B, C], executed, [B], seconds.__getitem__) == []  # B runs them all
    assert cover([A, C], executed, [], seconds.__getitem__) == [A, C]


def test_an_update_replaces_the_stale_modules_part_alone() -> None:
    old = _map({("distributed/x.py", (1, 2)): {A, C}, ("distributed/x.py", (2, 3)): {B}})
    new = _map({("distributed/x.py", (5, 6)): {A}}, ran=(A, B))
    joined = merged(old, new, ["conformance/checks/test_a.py"])
    assert joined.executors() == {
        ("distributed/x.py", (1, 2)): {C},  # C's kept; A's now from the new run
        ("distributed/x.py", (5, 6)): {A},
    }
    assert joined.ids == (A, B, C)
    with pytest.raises(ValueError, match=r"of torch 2\.12\.1, this run of 2\.13\.0"):
        merged(coverage_map.CoverageMap("2.12.1", "1,2,4", (), (), frozenset()), new, [])


def test_a_module_with_changed_source_or_ids_is_stale() -> None:
    now = digests()
    module = "conformance/checks/test_dcp_round_trips.py"
    recorded = coverage_map.CoverageMap(
        "2.13.0", "1,2,4", (f"{module}::t[w2]",), (), frozenset(), {**now, module: "old"}
    )
    assert stale_modules(recorded, [f"{module}::t[w2]"]) == [module]
    fresh = coverage_map.CoverageMap("2.13.0", "1,2,4", (f"{module}::t[w2]",), (), frozenset(), now)
    assert stale_modules(fresh, [f"{module}::t[w2]"]) == []
    other = "conformance/checks/test_safetensors.py"
    assert stale_modules(fresh, [f"{module}::t[w2]", f"{other}::n[w1]"]) == [other]


@pytest.mark.slow
def test_the_committed_map_of_the_tier_release_is_fresh() -> None:
    recorded = coverage_map.load(map_path(TIER_RELEASE))
    stale = stale_modules(recorded, collected_ids())
    assert stale == [], (
        f"the coverage map of torch {TIER_RELEASE} is stale for {stale}: under that torch, "
        "python -m ci.gate.coverage --update"
    )
