"""The suite reaches the torch APIs it judges through ``conformance._upstream`` alone, at call
time: a build that lacks any of them still collects every test, and skips exactly the tests
that call what it lacks, naming it."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from ci.gate.target import SUITE_ROOT
from conformance import _upstream
from conformance._upstream import fsdp, fully_shard_on, with_parameters
from conformance.cells import PARALLELISMS
from tests._inner import collect_conformance

pytestmark = pytest.mark.slow

# Under judgement: every submodule of torch.distributed and torch.nn.parallel. The core
# ``torch.distributed`` (process groups, collectives) is the ground the harness stands on.
JUDGED_PREFIXES = ("torch.distributed.", "torch.nn.parallel")
THE_ONE_PATH = SUITE_ROOT / "conformance" / "_upstream.py"


def _suite_modules() -> list[Path]:
    paths = sorted((SUITE_ROOT / "conformance").rglob("*.py"))
    return [path for path in paths if path != THE_ONE_PATH]


def _judged(module: str) -> bool:
    return module.startswith(JUDGED_PREFIXES) or module == "torch.nn.parallel"


def _type_checking_blocks(tree: ast.Module) -> set[int]:
    """Line numbers inside ``if TYPE_CHECKING:`` blocks, whose imports never run."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING"):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def _dotted(node: ast.expr) -> str:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts))


def direct_uses(source: str) -> Iterator[tuple[int, str]]:
    """Each import of a judged torch module, and each ``torch.distributed.<sub>.<name>``
    reached by attribute, with its line."""
    tree = ast.parse(source)
    skipped = _type_checking_blocks(tree)
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skipped:
            continue
        if isinstance(node, ast.ImportFrom) and node.module:
            if _judged(node.module) or (node.module == "torch.distributed" and node.level == 0):
                yield node.lineno, f"from {node.module} import ..."
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if _judged(alias.name):
                    yield node.lineno, f"import {alias.name}"
        elif isinstance(node, ast.Attribute):
            dotted = _dotted(node)
            if dotted.count(".") >= 3 and _judged(dotted):
                yield node.lineno, dotted


def test_the_scan_sees_every_kind_of_direct_use() -> None:
    source = (
        "import torch.distributed.checkpoint as dcp\n"
        "from torch.distributed.fsdp import fully_shard\n"
        "from torch.nn.parallel import DistributedDataParallel\n"
        "from torch.distributed import checkpoint\n"
        "def f():\n"
        "    from torch.distributed.tensor import DTensor\n"
        "    return torch.distributed.tensor.DTensor\n"
        "import torch.distributed as dist\n"
        "from torch import nn\n"
        "if TYPE_CHECKING:\n"
        "    from torch.distributed.tensor import DTensor\n"
    )
    assert [line for line, _ in direct_uses(source)] == [1, 2, 3, 4, 6, 7]


def test_the_suite_imports_no_judged_torch_api() -> None:
    found = [
        f"{path.relative_to(SUITE_ROOT)}:{line}: {what}"
        for path in _suite_modules()
        for line, what in direct_uses(path.read_text())
    ]
    assert not found, "look these up through conformance._upstream:\n" + "\n".join(found)


def test_a_build_without_any_judged_api_collects_the_whole_suite(
    conformance_ids: list[str],
) -> None:
    without = collect_conformance("-p", "tests.inner.torch_without_apis")
    assert without == conformance_ids
    assert len(without) > 1000


def test_a_missing_api_skips_the_tests_that_call_it_naming_it() -> None:
    missing = "torch.distributed._state_dict_utils._flatten_state_dict"
    module = "conformance/checks/test_state_dict_utils.py"
    calls_it = f"{module}::test_flatten_then_unflatten_keeps_empty_containers"
    does_not = f"{module}::test_similarity_check_sees_a_dtype_change_alone[w1-int64]"
    plugin = "tests.inner.torch_without_apis"  # the controller's lookups and, preloaded, the ranks'
    completed = subprocess.run(
        [sys.executable, "-m", "pytest", calls_it, does_not, "-p", plugin, "-rs"],
        cwd=SUITE_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "GATE_TEST_MISSING_APIS": missing, "HARNESS_PRELOAD": plugin},
    )
    assert completed.returncode == 0, completed.stdout[-4000:]
    assert f"has no {missing}" in completed.stdout
    assert "1 passed, 1 skipped" in completed.stdout


def test_an_option_the_release_lacks_is_a_skip_naming_it() -> None:
    def older(state_dict: object, *, strict: bool = True) -> None:
        """A function of a release before cpu_offload existed."""

    with pytest.raises(pytest.skip.Exception, match="older has no parameter cpu_offload"):
        with_parameters(older, "strict", "cpu_offload")
    assert with_parameters(older, "strict") is older


def test_fsdp2_on_cpu_needs_cpu_streams_that_record_events(monkeypatch: pytest.MonkeyPatch) -> None:
    assert fully_shard_on(torch.device("cpu")) is fsdp.fully_shard
    monkeypatch.delattr(torch.cpu.Stream, "record_event")
    with pytest.raises(pytest.skip.Exception, match="cannot run fully_shard on CPU devices"):
        fully_shard_on(torch.device("cpu"))
    # Every FSDP2 cell says so before building anything, so all ranks skip alike.
    with pytest.raises(pytest.skip.Exception, match="cannot run fully_shard"):
        PARALLELISMS["fsdp2_tp"].skip_unless_runnable(torch.device("cpu"))
    PARALLELISMS["ddp"].skip_unless_runnable(torch.device("cpu"))


def test_the_probe_lists_every_namespace_the_suite_declares() -> None:
    """A namespace left out of ``MODULES`` is missing from ``python -m ci.gate.probe``."""
    declared = [
        name for name, value in vars(_upstream).items() if isinstance(value, _upstream.TorchModule)
    ]
    unlisted = [
        name
        for name in declared
        if not any(getattr(_upstream, name) is m for m in _upstream.MODULES)
    ]
    assert unlisted == [], f"declared in conformance._upstream but not in MODULES: {unlisted}"
