"""Manifests as TOML files: reading them (``tomllib``; ``tomli`` on Python 3.10) and writing
records back in the same form.

A record holds for its tests directly, or for several sets of them, each its own table::

    [[divergence]]
    id = "fsdp1-full-offload"            # a short name a person chose
    link = "https://github.com/pytorch/pytorch/issues/188989"
    reason = "what upstream does wrong, stated once"
    releases = ">=2.6,<2.14.1"           # PEP 440, over the build's release; absent: every one
    tests = ["conformance/checks/test_x.py::test_y[w2-*]"]

    [[divergence]]
    id = "empty-fsdp1-shard-load"
    link = "..."
    reason = "..."
    [[divergence.holds]]
    releases = ">=2.8"
    tests = ["..."]
    [[divergence.holds]]
    releases = ">=2.6"
    skip = "hang"                        # absent: an expected failure (strict xfail)
    tests = ["..."]
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from conformance.divergences._model import Divergence, Holding, Manifest, ManifestError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

_NAMES = {"id", "link", "reason"}
_HOLDING = {"releases", "skip", "tests"}


def load(path: Path, root: Path | None = None) -> Manifest:
    """The manifest at ``path``; ``root`` is where its tests' paths lie (default: the rootdir
    of the run that applies it)."""
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as error:
        raise ManifestError(f"{path}: not a TOML manifest ({error})") from None
    unknown = sorted(set(data) - {"recorded", "divergence"})
    if unknown:
        raise ManifestError(f"{path}: unknown top-level keys {unknown}")
    try:
        recorded = sorted(Version(str(release)) for release in data.get("recorded", []))
    except InvalidVersion as error:
        raise ManifestError(f"{path}: recorded takes release numbers ({error})") from None
    divergences = [
        _divergence(record, number, path, root)
        for number, record in enumerate(data.get("divergence", []), start=1)
    ]
    ids = [divergence.id for divergence in divergences]
    twice = sorted({i for i in ids if ids.count(i) > 1})
    if twice:
        raise ManifestError(f"{path}: ids given to more than one divergence: {twice}")
    return Manifest(path, divergences, recorded)


def _divergence(record: object, number: int, path: Path, root: Path | None) -> Divergence:
    where = f"{path}: divergence {number}"
    if not isinstance(record, dict):
        raise ManifestError(f"{where}: expected a table")
    if "id" in record:
        where = f"{path}#{record['id']}"
    unknown = sorted(set(record) - _NAMES - _HOLDING - {"holds"})
    missing = sorted(_NAMES - set(record))
    if unknown or missing:
        raise ManifestError(f"{where}: unknown fields {unknown}, missing fields {missing}")
    direct = _HOLDING & set(record)
    if direct and "holds" in record:
        raise ManifestError(
            f"{where}: give {sorted(direct)} in the record or in its [[divergence.holds]] "
            "tables, not both"
        )
    own = {name: value for name, value in record.items() if name in _HOLDING}
    tables = record.get("holds", [own])
    if not isinstance(tables, list) or not tables:
        raise ManifestError(f"{where}: holds must be one or more [[divergence.holds]] tables")
    return Divergence(
        id=str(record["id"]),
        link=str(record["link"]),
        reason=" ".join(str(record["reason"]).split()),
        holdings=tuple(_holding(table, where) for table in tables),
        source=where,
        root=root,
    )


def _holding(table: Any, where: str) -> Holding:
    if not isinstance(table, dict):
        raise ManifestError(f"{where}: a holding must be a table")
    extra = sorted(set(table) - _HOLDING)
    if extra:
        raise ManifestError(f"{where}: unknown fields {extra}")
    tests = table.get("tests")
    if not isinstance(tests, list):
        raise ManifestError(f"{where}: tests must be a list of test ids or patterns")
    releases = str(table.get("releases", ""))
    return Holding(tests=tuple(tests), releases=releases, skip=table.get("skip"))


def _string(text: str) -> str:
    """``text`` as a TOML basic string."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    return '"' + "".join(c if c.isprintable() else f"\\u{ord(c):04x}" for c in escaped) + '"'


def _wrapped(text: str, width: int = 92) -> str:
    """``text`` as a TOML multi-line string, one line per ``width`` characters, whose line
    ends join with one space (a line-ending backslash trims the newline and indent)."""
    words, lines, line = _string(text)[1:-1].split(" "), [], ""
    for word in words:
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    lines.append(line)
    if len(lines) == 1:
        return f'"{lines[0]}"'
    body = " \\\n    ".join(lines)
    return f'"""\\\n    {body}"""'


def _holding_lines(holding: Holding) -> list[str]:
    lines = [f"releases = {_string(holding.releases)}"] if holding.releases else []
    if holding.skip:
        lines.append(f"skip = {_string(holding.skip)}")
    return [*lines, "tests = [", *(f"    {_string(test)}," for test in holding.tests), "]"]


def to_toml(
    divergences: Iterable[Divergence], recorded: Iterable[Version] = (), header: str = ""
) -> str:
    """The manifest text of ``divergences``, in order: a record that holds once carries its
    tests itself, one that holds several times a ``[[divergence.holds]]`` table for each."""
    out = [f"# {line}".rstrip() for line in header.splitlines()]
    releases = list(recorded)
    if releases:
        out += ["", f"recorded = [{', '.join(_string(str(r)) for r in releases)}]"]
    for divergence in divergences:
        out += ["", "[[divergence]]", f"id = {_string(divergence.id)}"]
        out.append(f"link = {_string(divergence.link)}")
        out.append(f"reason = {_wrapped(divergence.reason)}")
        if len(divergence.holdings) == 1:
            out += _holding_lines(divergence.holdings[0])
            continue
        for holding in divergence.holdings:
            out += ["[[divergence.holds]]", *_holding_lines(holding)]
    return "\n".join(out).lstrip("\n") + "\n"
