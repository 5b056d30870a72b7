"""Mutants of DCP's experimental checkpointer (``torch/distributed/checkpoint/_experimental/``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ci.mutation.mutants._mutant import EXPERIMENTAL_READER, mutant_maker

Fn = Callable[..., Any]
EXPERIMENTAL = "conformance/checks/test_experimental_checkpointer.py"


def _no_missing_keys(original: Fn) -> Fn:
    def read(self: Any, *args: Any, **kwargs: Any) -> tuple[Any, list[str]]:
        state_dict, _ = original(self, *args, **kwargs)
        return state_dict, []

    return read


MUTANTS = [
    mutant_maker(EXPERIMENTAL_READER, EXPERIMENTAL)(
        "experimental_reader_reports_no_missing_keys",
        "CheckpointReader.read",
        "a read into a template finds no key missing: a strict load of a template with a key "
        "the checkpoint lacks loads the rest and leaves that key empty without a word",
        _no_missing_keys,
    ),
]
