"""A section of a README that a command generates, between two HTML comment markers."""

from __future__ import annotations


def with_section(text: str, begin: str, end: str, body: str) -> str:
    """``text`` with what lies between the markers ``begin`` and ``end`` replaced by ``body``
    (on lines of its own); raises ``ValueError`` naming the markers where ``text`` lacks them."""
    head, found_begin, rest = text.partition(begin)
    _, found_end, tail = rest.partition(end)
    if not found_begin or not found_end:
        raise ValueError(f"the README lacks the markers {begin!r} ... {end!r}")
    return f"{head}{begin}\n{body}\n{end}{tail}"
