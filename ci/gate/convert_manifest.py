"""Convert a manifest of the earlier line format into the TOML records of harness.manifest.

    python -m ci.gate.convert_manifest OLD.txt --out NEW.toml [--ids IDS.txt]

The line format held one entry a line, ``[releases SPEC |] [skip |] pattern | reason | link``,
its patterns ``fnmatch`` globs over test ids (``[[]`` for a literal bracket). Entries with
the same reason, link, range and kind become one record whose tests are their patterns,
rewritten without glob escaping: a character class such as ``w[24]`` becomes one pattern per
character; a negated one (``[!m]``) one pattern per character that the ids it matches have
there, read from ``--ids`` (one collected test id a line, as ``pytest --collect-only -q``
prints them). A skip entry's reason says why it must not run (hang, crash, at random). Each
id resolves to the same outcome on every release before and after (tests/test_manifest.py).
"""

from __future__ import annotations

import argparse
import itertools
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from packaging.version import Version

from harness.manifest import Divergence, Unsafe, to_toml

RELEASES, RECORDED = "releases ", "recorded "


@dataclass(frozen=True)
class LineEntry:
    """One entry of the line format."""

    pattern: str
    reason: str
    link: str
    kind: str  # "xfail" or "skip"
    releases: str
    source: str  # file:line


def read_line_format(path: Path) -> tuple[list[Version], list[LineEntry]]:
    """The recorded releases and the entries of a line-format manifest."""
    recorded: list[Version] = []
    entries: list[LineEntry] = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        text, source = line.strip(), f"{path}:{number}"
        if not text or text.startswith("#"):
            continue
        if text.startswith(RECORDED):
            recorded += [Version(word) for word in text.removeprefix(RECORDED).split()]
            continue
        parts = [part.strip() for part in text.split("|")]
        releases = parts.pop(0).removeprefix(RELEASES).strip() if text.startswith(RELEASES) else ""
        kind = parts.pop(0) if len(parts) == 4 else "xfail"
        if len(parts) != 3 or kind not in ("xfail", "skip"):
            raise SystemExit(f"{source}: not a line of the line format: {line!r}")
        entries.append(LineEntry(parts[0], parts[1], parts[2], kind, releases, source))
    return sorted(recorded), entries


# A token of a glob: a literal run, "*", "?", or a class ("[...]"), kept as written.
_TOKEN = re.compile(r"\[\[\]|\[\]\]|\[!?[^]]+\]|\*|\?|[^[*?]+")


def _alternatives(token: str, seen: set[str]) -> list[str]:
    """What a glob token becomes in patterns without escaping: a literal, a wildcard, or
    each character a class stands for (a negated class: those ``seen`` there)."""
    if token == "[[]":
        return ["["]
    if token == "[]]":
        return ["]"]
    if token.startswith("[!"):
        return sorted(seen) or [token]
    if token.startswith("["):
        return list(dict.fromkeys(token[1:-1]))
    return [token]


def unescaped(pattern: str, ids: Iterable[str]) -> list[str]:
    """The patterns without glob escaping that name the ids ``pattern`` names."""
    tokens = _TOKEN.findall(pattern)
    if "".join(tokens) != pattern:
        raise SystemExit(f"cannot read the glob {pattern!r}")
    negated = [i for i, token in enumerate(tokens) if token.startswith("[!")]
    seen: dict[int, set[str]] = {i: set() for i in negated}
    if negated:
        regex = "".join(
            f"({_class_regex(t)})" if i in seen else _token_regex(t) for i, t in enumerate(tokens)
        )
        for found in filter(None, (re.fullmatch(regex, nodeid) for nodeid in ids)):
            for group, index in enumerate(negated, start=1):
                seen[index].add(found[group])
        unresolved = [tokens[i] for i in negated if not seen[i]]
        if unresolved:
            raise SystemExit(
                f"{pattern}: {unresolved} matches no id; pass the collected ids with --ids"
            )
    choices = [_alternatives(token, seen.get(i, set())) for i, token in enumerate(tokens)]
    return ["".join(parts) for parts in itertools.product(*choices)]


def _class_regex(token: str) -> str:
    return "[^" + re.escape(token[2:-1]) + "]" if token.startswith("[!") else f"[{token[1:-1]}]"


def _token_regex(token: str) -> str:
    if token in ("[[]", "[]]"):
        return re.escape(token[1])
    if token.startswith("["):
        return _class_regex(token)
    return {"*": ".*", "?": "."}.get(token) or re.escape(token)


def unsafe(reason: str) -> Unsafe:
    """Why a skip entry must not run, as its reason says."""
    words = reason.lower()
    if "hang" in words or "wait" in words:
        return "hang"
    if "at random" in words or "flaky" in words:
        return "flaky"
    return "crash"


def record_id(reason: str, taken: set[str]) -> str:
    """A short id made of the reason's first words, unique among ``taken``."""
    words = re.findall(r"[a-z0-9]+", reason.lower())
    base = "-".join(words[:7]) or "divergence"
    candidate, number = base, 2
    while candidate in taken:
        candidate, number = f"{base}-{number}", number + 1
    taken.add(candidate)
    return candidate


def convert(entries: list[LineEntry], ids: list[str]) -> list[Divergence]:
    """One record per reason, link, range and kind, in the order of their first entry."""
    groups: dict[tuple[str, str, str, str], list[LineEntry]] = {}
    for entry in entries:
        groups.setdefault((entry.reason, entry.link, entry.releases, entry.kind), []).append(entry)
    taken: set[str] = set()
    return [
        Divergence(
            id=record_id(reason, taken),
            link=link,
            reason=" ".join(reason.split()),
            tests=tuple(dict.fromkeys(p for entry in group for p in unescaped(entry.pattern, ids))),
            releases=releases,
            skip=unsafe(reason) if kind == "skip" else None,
            source=group[0].source,
        )
        for (reason, link, releases, kind), group in groups.items()
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ci.gate.convert_manifest", description=__doc__.split("\n")[0]
    )
    parser.add_argument("manifest", type=Path, help="a manifest in the line format")
    parser.add_argument("--out", type=Path, required=True, help="the TOML manifest to write")
    parser.add_argument("--ids", type=Path, help="collected test ids, one a line")
    args = parser.parse_args(argv)
    ids = args.ids.read_text().split() if args.ids else []
    recorded, entries = read_line_format(args.manifest)
    divergences = convert(entries, [nodeid for nodeid in ids if "::" in nodeid])
    header = f"Known divergences, converted from {args.manifest.name}; format: harness/manifest.py"
    args.out.write_text(to_toml(divergences, recorded, header))
    print(f"convert: {len(entries)} entries became {len(divergences)} records in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
