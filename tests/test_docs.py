"""The reference docs keep their budgets: short enough to read, a map of files first, no
commit hashes (history belongs in ``CHANGELOG.md`` and ``docs/history/``), short sentences."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOP = ROOT / "README.md"
PACKAGE_NAMES = ("reference_impl", "harness", "conformance", "ci")
PACKAGES = [ROOT / name / "README.md" for name in PACKAGE_NAMES]
REFERENCE = [TOP, *PACKAGES, ROOT / "conformance" / "CATALOGUE.md"]
LONGEST_SENTENCE_WORDS = 60
LONG_SENTENCE_WORDS = 35
LONG_SENTENCES_AT_MOST = 0.10  # "35 words or fewer as a rule"
# Seven or more hex digits with a digit and a letter among them: how a commit is named.
COMMIT = re.compile(r"\b(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b")


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT))


def prose(markdown: str) -> str:
    """The text of a Markdown page without code blocks, tables, headings and inline code."""
    text = re.sub(r"(?ms)^```.*?^```", "", markdown)
    text = re.sub(r"(?m)^\s*(\|.*|#.*|<!--.*)$", "", text)
    return re.sub(r"`[^`]*`", "code", text)


def sentences(markdown: str) -> list[str]:
    """The sentences of a page's prose: list items and paragraphs split at full stops."""
    blocks = re.split(r"\n\s*\n|\n\s*[-*] |\n\s*\d+\. ", prose(markdown))
    found = []
    for block in blocks:
        joined = " ".join(re.sub(r"^\s*(?:[-*]|\d+\.)\s+", "", block).split())
        found += [s for s in re.split(r"(?<=[.!?:;])\s+(?=[A-Z(`*\[])", joined) if s.strip()]
    return found


def test_the_top_readme_fits_ten_kilobytes() -> None:
    assert len(TOP.read_bytes()) <= 10_000


@pytest.mark.parametrize("readme", PACKAGES, ids=_name)
def test_a_package_readme_fits_25_kilobytes_and_opens_with_a_map_of_its_files(readme) -> None:
    text = readme.read_text()
    assert len(text.encode()) <= 25_000
    opening = text.split("\n## ", 1)[0]
    assert "| where | what |" in opening, f"{_name(readme)} opens without its map of files"


@pytest.mark.parametrize("page", REFERENCE, ids=_name)
def test_a_reference_doc_names_no_commit(page) -> None:
    assert COMMIT.findall(page.read_text()) == []


@pytest.mark.parametrize("page", REFERENCE, ids=_name)
def test_a_reference_docs_sentences_are_short_as_a_rule(page) -> None:
    found = sentences(page.read_text())
    lengths = [len(sentence.split()) for sentence in found]
    longest = max(zip(lengths, found, strict=True))
    assert longest[0] <= LONGEST_SENTENCE_WORDS, longest[1]
    long_share = sum(n > LONG_SENTENCE_WORDS for n in lengths) / len(lengths)
    assert long_share <= LONG_SENTENCES_AT_MOST


def test_the_sentence_reader_splits_prose_and_leaves_code_out() -> None:
    page = "# Title\n\nOne two. Three `a. B` four!\n\n```\nNot. Prose.\n```\n- Item one.\n"
    assert sentences(page) == ["One two.", "Three code four!", "Item one."]


def test_a_commit_is_seven_hex_digits_with_a_digit_and_a_letter() -> None:
    assert COMMIT.findall("at 9fc6562, in deadbeef, 2026113, sha 43e70b2a") == [
        "9fc6562",
        "43e70b2a",
    ]
