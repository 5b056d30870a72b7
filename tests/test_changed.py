"""``--changed-against``: a build compared with its base file by file, and the ids that execute
what differs, from wheels and installed trees."""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path

import pytest

from ci.gate import changed, cli
from ci.gate.coverage import TIER_RELEASE, map_path
from ci.gate.coverage import map as coverage_map
from ci.gate.tier import tier_ids
from harness.coverage import torch_root

A = "conformance/checks/test_a.py::t[w2-ddp]"
B = "conformance/checks/test_b.py::u[w4]"
FILES = {
    "version.py": b"__version__ = '2.13.0+cpu'\n",
    "distributed/checkpoint/planner.py": b"def plan():\n    return 1\n",
    "distributed/checkpoint/unused.py": b"x = 1\n",
    "nn/functional.py": b"def relu(x):\n    return x\n",
    "_vendored/untouched.py": b"y = 2\n",
    "lib/libtorch_cpu.so": b"\x7fELF...",
    "include/ATen/ATen.h": b"#pragma once\n",
}


def _wheel(path: Path, files: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        record = []
        for name, data in files.items():
            archive.writestr(f"torch/{name}", data)
            record.append(f"torch/{name},{changed.digest(data)},{len(data)}")
        record.append("torch-2.13.0.dist-info/RECORD,,")
        archive.writestr("torch-2.13.0.dist-info/RECORD", "\n".join(record) + "\n")
    return path


def _tree(root: Path, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        (root / "torch" / name).parent.mkdir(parents=True, exist_ok=True)
        (root / "torch" / name).write_bytes(data)
    return root


def _map(tmp_path: Path) -> coverage_map.CoverageMap:
    built = coverage_map.build(
        torch="2.13.0",
        world_sizes="1,2,4",
        ran=[A, B],
        executors={("distributed/checkpoint/planner.py", (1, 2)): frozenset({A})},
        imported={"nn/functional.py", "distributed/checkpoint/planner.py"},
        digests={},
    )
    coverage_map.save(built, tmp_path / "maps" / "torch-2.13.0.json.xz")
    return built


@pytest.fixture
def maps(tmp_path, monkeypatch) -> Path:
    _map(tmp_path)
    monkeypatch.setattr(
        changed, "map_path", lambda release: tmp_path / "maps" / f"torch-{release}.json.xz"
    )
    return tmp_path / "maps"


def test_a_digest_is_spelled_as_a_wheels_record_spells_it() -> None:
    assert changed.digest(b"") == "sha256=47DEQpj8HBSa-_TImW-5JCeuQeRkm5NMpJWZG3hSuFU"
    assert hashlib.sha256(b"").hexdigest().startswith("e3b0c442")


def test_a_wheel_and_an_installed_tree_are_compared_file_by_file(tmp_path) -> None:
    wheel = changed.tree_of(
        str(_wheel(tmp_path / "torch-2.13.0-cp311-none-any.whl", FILES)), tmp_path
    )
    fork_files = {**FILES, "distributed/checkpoint/planner.py": b"def plan():\n    return 2\n"}
    del fork_files["_vendored/untouched.py"]
    fork_files["distributed/checkpoint/new.py"] = b"z = 3\n"
    fork_files["version.py"] = b"__version__ = '2.13.0a0+fork'\n"  # a fork's own build
    fork = changed.tree_of(str(_tree(tmp_path / "fork", fork_files)), tmp_path)
    assert (wheel.version, fork.version) == ("2.13.0", "2.13.0")  # the same release's map
    assert list(changed.differences(wheel, fork)) == [
        ("_vendored/untouched.py", "removed"),
        ("distributed/checkpoint/new.py", "added"),
        ("distributed/checkpoint/planner.py", "changed"),
        ("version.py", "changed"),
    ]


def test_each_changed_file_gets_the_verdict_of_what_reaches_it(tmp_path) -> None:
    coverage = _map(tmp_path)
    verdicts = {path: changed.verdict_of(path, coverage) for path in FILES}
    assert verdicts == {
        "version.py": "not imported",
        "distributed/checkpoint/planner.py": "executed",
        "distributed/checkpoint/unused.py": "unexecuted",  # measured, run by no id
        "nn/functional.py": "imported",  # imported, not traced
        "_vendored/untouched.py": "not imported",
        "lib/libtorch_cpu.so": "native",
        "include/ATen/ATen.h": "not code",
    }
    assert changed.verdict_of("lib/libc10.so.2.13", coverage) == "native"


def _select(tmp_path: Path, **edits: bytes) -> changed.Selection:
    base = changed.tree_of_directory(_tree(tmp_path / "base", FILES) / "torch")
    fork = changed.tree_of_directory(_tree(tmp_path / "fork", {**FILES, **edits}) / "torch")
    return changed.select("torch==2.13.0", base, fork)


def test_a_changed_traced_file_runs_the_ids_that_execute_it(tmp_path, maps) -> None:
    selection = _select(tmp_path / "t", **{"distributed/checkpoint/planner.py": b"pass\n"})
    assert selection.whole_gate_because == []
    assert selection.ids == {A}
    assert selection.coverage == "torch-2.13.0.json.xz"
    report = changed.render(selection, quick=5)
    assert "| `torch/distributed/checkpoint/planner.py` | changed | executed | 1 |" in report
    assert f"- `{A}`" in report
    untouched = _select(tmp_path / "u", **{"distributed/checkpoint/unused.py": b"pass\n"})
    assert (untouched.ids, untouched.whole_gate_because) == (set(), [])


@pytest.mark.parametrize(
    ("edit", "because"),
    [
        ("lib/libtorch_cpu.so", "1 native files differ"),
        ("nn/functional.py", "1 imported files differ"),
    ],
)
def test_a_changed_native_library_or_untraced_import_runs_the_whole_gate(
    tmp_path, maps, edit, because
) -> None:
    selection = _select(tmp_path, **{edit: b"changed"})
    assert selection.whole_gate_because == [because]
    assert "The whole gate ran: " + because in changed.render(selection, quick=5)


def test_without_a_map_of_either_release_the_whole_gate_runs(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(changed, "map_path", lambda release: tmp_path / "none" / release)
    selection = _select(tmp_path, **{"distributed/checkpoint/planner.py": b"pass\n"})
    assert selection.files == [
        changed.ChangedFile("distributed/checkpoint/planner.py", "changed", "unmapped")
    ]
    assert selection.whole_gate_because == ["1 unmapped files differ"]
    assert "Coverage: no map of torch 2.13.0." in changed.render(selection, quick=5)


def _patched_copy(root: Path, path: str, old: str, new: str) -> Path:
    """An installed tree that differs from the torch under test in one file: links to every
    file of it but ``path``, a copy with ``old`` replaced by ``new``."""
    installed = torch_root()
    for source in installed.rglob("*"):
        if source.is_file() and "__pycache__" not in source.parts:
            target = root / "torch" / source.relative_to(installed)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(source)
    patched = root / "torch" / path
    text = patched.read_text()
    assert old in text
    patched.unlink()
    patched.write_text(text.replace(old, new, 1))
    return root


@pytest.mark.slow
def test_a_patched_copy_of_a_checkpoint_file_runs_the_ids_that_execute_it(tmp_path) -> None:
    """The torch under test against a tree patched in DCP's plan deduplication, as a fork
    differs: that file alone differs, and the gate runs the ids the committed map says execute
    it, and the quick tier."""
    path = "distributed/checkpoint/_dedup_save_plans.py"
    base = _patched_copy(tmp_path / "base", path, "def ", "def _unused(): pass\n\n\ndef ")
    chosen, tier = cli.changed_selection(str(base), "1,2,4", tmp_path / "out")
    selection = json.loads((tmp_path / "out" / "changed.json").read_text())
    assert [(changed["path"], changed["verdict"]) for changed in selection["files"]] == [
        (path, "executed")
    ]
    executors = coverage_map.load(map_path(TIER_RELEASE)).ids_executing(path)
    assert executors
    assert tier == "changed"
    assert chosen == sorted(executors | set(tier_ids("quick")))


def test_the_gate_runs_the_chosen_ids_in_place_of_the_suite(tmp_path) -> None:
    after = ["-x", "--changed-against=torch==2.13.0"]
    assert cli.option_among("--changed-against", after) == ("torch==2.13.0", ["-x"])
    args = cli._parser().parse_args(["--world-sizes", "1,2", "--", "-x"])
    args.selected = [A, B]
    command = cli.pytest_command(args, tmp_path)
    assert [arg for arg in command if arg.startswith("conformance")] == [A, B]
    assert "-x" in command
