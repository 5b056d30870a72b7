"""What a build changed against the release it builds on, and which ids execute it.

``python -m ci.gate --changed-against BASE`` compares the torch under test with BASE (a pip
requirement, a wheel, or a directory holding an installed ``torch/``) file by file: the
sha256 of every file of the ``torch`` package, as BASE's wheel records it or as read from
disk. Each differing file gets a verdict:

- ``native``: a native library (``.so``, ``.dll``, ``.dylib``, ``.pyd``). Any code may reach
  it, so the whole gate runs.
- ``executed``: a Python file whose arcs the coverage map records. The ids that executed it
  run, beside the quick tier.
- ``unexecuted``: a measured file that no id of the gate executes. No check can see it; the
  quick tier runs.
- ``imported``: a Python file the ranks import that the map does not trace (``torch/nn``,
  ``torch/_dynamo``...). The whole gate runs.
- ``not imported``: a Python file no rank imports; ``not code``: any other file (headers,
  stubs, data). Neither runs anything.

- ``unmapped``: a Python file, where no map of BASE's release or the build's is recorded.
  The whole gate runs.

The map is BASE's release's, else that of the build under test's release.
"""

from __future__ import annotations

import base64
import csv
import fnmatch
import hashlib
import io
import json
import re
import subprocess
import sys
import zipfile
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

from ci.gate.coverage import map_path
from ci.gate.coverage.map import CoverageMap, load
from ci.gate.report_markdown import table
from conformance.divergences import release_of
from harness.coverage import MEASURED

How = Literal["changed", "added", "removed"]
Verdict = Literal[
    "native", "executed", "unexecuted", "imported", "unmapped", "not imported", "not code"
]
LISTED = 30  # ids listed per file in changed.md
WHOLE_GATE: frozenset[Verdict] = frozenset({"native", "imported", "unmapped"})
_NATIVE = re.compile(r"\.(so(\.[\d.]+)?|dll|dylib|pyd)$")
_VERSION = re.compile(r"""^__version__\s*=\s*['"]([^'"]+)['"]""", re.MULTILINE)


@dataclass(frozen=True)
class Tree:
    """The files of one torch package: path relative to ``torch/`` -> wheel-style digest."""

    version: str
    digests: Mapping[str, str]


@dataclass(frozen=True)
class ChangedFile:
    """One file that differs, how (``changed``, ``added``, ``removed``), and its verdict."""

    path: str
    how: How
    verdict: Verdict
    ids: tuple[str, ...] = ()  # the ids that executed it (``executed`` only)


@dataclass
class Selection:
    """What ``--changed-against`` runs, and why."""

    base: str
    base_version: str
    build_version: str
    coverage: str  # the map the ids were taken from, or why none was
    files: list[ChangedFile] = field(default_factory=list)
    whole_gate_because: list[str] = field(default_factory=list)

    @property
    def ids(self) -> set[str]:
        return {nodeid for changed in self.files for nodeid in changed.ids}


def digest(data: bytes) -> str:
    """A file's digest as a wheel's RECORD spells it."""
    raw = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _version_of(source: str | None) -> str:
    """The release of the ``__version__`` a ``version.py`` sets (``2.13.0a0+fork`` -> 2.13.0)."""
    found = _VERSION.search(source or "")
    return str(release_of(found.group(1))) if found else "unknown"


def tree_of_directory(root: Path) -> Tree:
    """An installed torch package (``root`` is the ``torch/`` directory)."""
    digests = {
        path.relative_to(root).as_posix(): digest(path.read_bytes())
        for path in sorted(root.rglob("*"))
        if path.is_file() and "__pycache__" not in path.parts
    }
    version_file = root / "version.py"
    return Tree(_version_of(version_file.read_text() if version_file.exists() else None), digests)


def tree_of_wheel(wheel: Path) -> Tree:
    """A torch wheel, read from its RECORD without unpacking it."""
    with zipfile.ZipFile(wheel) as archive:
        (record,) = [name for name in archive.namelist() if name.endswith(".dist-info/RECORD")]
        rows = csv.reader(io.StringIO(archive.read(record).decode()))
        digests = {
            path.removeprefix("torch/"): hashed
            for path, hashed, *_ in rows
            if path.startswith("torch/") and hashed and "__pycache__" not in path
        }
        version = _version_of(archive.read("torch/version.py").decode())
    return Tree(version, digests)


def tree_of(base: str, scratch: Path) -> Tree:
    """BASE: a wheel, a directory holding ``torch/`` (or the package itself), or a pip
    requirement, whose wheel is downloaded into ``scratch`` (without dependencies)."""
    path = Path(base)
    if path.is_file():
        return tree_of_wheel(path)
    if path.is_dir():
        return tree_of_directory(path / "torch" if (path / "torch").is_dir() else path)
    scratch.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    subprocess.run([*command, "--dest", str(scratch), base], check=True)
    wheels = sorted(scratch.glob("torch-*.whl"), key=lambda wheel: wheel.stat().st_mtime)
    if not wheels:
        raise FileNotFoundError(f"pip download {base} left no torch wheel in {scratch}")
    return tree_of_wheel(wheels[-1])


def differences(base: Tree, build: Tree) -> Iterable[tuple[str, How]]:
    """Every file whose digest differs, in path order."""
    for path in sorted(set(base.digests) | set(build.digests)):
        if path not in base.digests:
            yield path, "added"
        elif path not in build.digests:
            yield path, "removed"
        elif base.digests[path] != build.digests[path]:
            yield path, "changed"


def verdict_of(path: str, coverage: CoverageMap | None) -> Verdict:
    """What reaches ``path`` by the map (None: no map of either release is recorded)."""
    if _NATIVE.search(path):
        return "native"
    if not path.endswith(".py"):
        return "not code"
    if coverage is None:
        return "unmapped"
    if path in coverage.files:
        return "executed"
    if any(fnmatch.fnmatch(path, pattern) for pattern in MEASURED):
        return "unexecuted"
    return "imported" if path in coverage.imported else "not imported"


def select(base_spec: str, base: Tree, build: Tree) -> Selection:
    """What differs between ``base`` and ``build``, and what must run for each."""
    versions = list(dict.fromkeys((base.version, build.version)))
    recorded = [map_path(version) for version in versions if map_path(version).exists()]
    coverage = load(recorded[0]) if recorded else None
    selection = Selection(
        base_spec,
        base.version,
        build.version,
        coverage=recorded[0].name if recorded else f"no map of torch {' or '.join(versions)}",
    )
    for path, how in differences(base, build):
        verdict = verdict_of(path, coverage)
        ids: tuple[str, ...] = ()
        if coverage is not None and verdict == "executed":
            ids = tuple(sorted(coverage.ids_executing(path)))
        selection.files.append(ChangedFile(path, how, verdict, ids))
    for verdict in sorted(WHOLE_GATE):
        count = sum(changed.verdict == verdict for changed in selection.files)
        if count:
            selection.whole_gate_because.append(f"{count} {verdict} files differ")
    return selection


def render(selection: Selection, quick: int) -> str:
    """The Markdown report of a selection: the changed files, and what ran for each."""
    lines = [
        f"# Changed against {selection.base}",
        "",
        f"torch {selection.build_version} against {selection.base_version}: "
        f"{len(selection.files)} files differ. Coverage: {selection.coverage}.",
        "",
    ]
    if selection.whole_gate_because:
        lines += ["The whole gate ran: " + "; ".join(selection.whole_gate_because) + ".", ""]
    else:
        lines += [
            f"Ran {len(selection.ids)} ids that execute a changed file, and the quick tier "
            f"({quick} ids).",
            "",
        ]
    lines += table(
        ["file", "how", "verdict", "ids that execute it"],
        [
            [f"`torch/{changed.path}`", changed.how, changed.verdict, str(len(changed.ids))]
            for changed in selection.files
        ],
    )
    for changed in [changed for changed in selection.files if changed.ids]:
        lines += ["", f"## `torch/{changed.path}`: {len(changed.ids)} ids", ""]
        lines += [f"- `{nodeid}`" for nodeid in changed.ids[:LISTED]]
        if len(changed.ids) > LISTED:
            lines.append(f"- and {len(changed.ids) - LISTED} more (changed.json lists them)")
    return "\n".join(lines) + "\n"


def save(selection: Selection, out: Path, quick: int) -> list[Path]:
    """``changed.md`` and ``changed.json`` in ``out``."""
    markdown, document = out / "changed.md", out / "changed.json"
    out.mkdir(parents=True, exist_ok=True)
    markdown.write_text(render(selection, quick))
    document.write_text(json.dumps(asdict(selection), indent=1) + "\n")
    return [markdown, document]
