"""pytest's machinery inside a rank process: assertion rewriting and reports.

A rank does not run a pytest session. It builds pytest's configuration once
(same rootdir and ini file as the controller), imports test modules with
pytest's assertion rewriting, and formats exceptions with pytest's own
``ExceptionInfo``, so a failing ``assert`` on a rank reads as it would in a
plain pytest run. pytest offers no public API for rewriting outside a
session; the few private names used are confined to this module and
covered by the harness's end-to-end tests.
"""

from __future__ import annotations

import ast
import functools
import gc
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from _pytest.assertion import util as assertion_util
from _pytest.assertion.rewrite import rewrite_asserts
from _pytest.config import _prepareconfig


@functools.cache
def make_config(rootdir: str, inifile: str | None, verbosity: int) -> pytest.Config:
    """A configured pytest ``Config`` matching the controller's project settings (made once
    per process: a rank forked from a template gets the template's)."""
    # The rank handles faulthandler itself: its dumps must follow fd 2 into each
    # test's capture file, which pytest's faulthandler plugin would prevent.
    args = ["--rootdir", rootdir, "-p", "no:cacheprovider", "-p", "no:faulthandler"]
    if inifile:
        args += ["-c", inifile]
    if verbosity > 0:
        args.append("-" + "v" * verbosity)
    config = _prepareconfig(args)
    config._do_configure()
    return config


def install_assertion_explanations(config: pytest.Config) -> None:
    """Let rewritten asserts explain comparisons through ``pytest_assertrepr_compare``."""

    def explain(op: str, left: object, right: object) -> str | None:
        for lines in config.hook.pytest_assertrepr_compare(
            config=config, op=op, left=left, right=right
        ):
            lines = list(lines)
            if lines:
                escaped = [line.replace("\n", "\\n") for line in lines]
                return "\n~".join(escaped).replace("%", "%%")
        return None

    assertion_util._reprcompare = explain


def import_test_module(name: str, path: str, config: pytest.Config) -> ModuleType:
    """Import the test module at ``path`` as ``name``, with asserts rewritten.

    The module is imported once per rank process and then reused, as pytest
    reuses it within a session. What the rank holds once it is imported (torch, the
    suite's modules: some 300,000 objects) is moved out of the garbage collector's sight,
    so that a full collection, which a peak-memory probe makes before each operation it
    measures, scans only what tests made since: 2 ms instead of 160.
    """
    if name in sys.modules:
        return sys.modules[name]
    source = Path(path).read_bytes()
    tree = ast.parse(source, filename=path)
    rewrite_asserts(tree, source, path, config)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None:
        raise ImportError(f"cannot import test module {name!r} from {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        exec(compile(tree, path, "exec", dont_inherit=True), module.__dict__)
    except BaseException:
        del sys.modules[name]
        raise
    gc.collect()  # what earlier tests left in cycles is freed, not kept for good
    gc.freeze()
    return module


def resolve_test(module: ModuleType, qualname: str) -> Callable[..., Any]:
    """The test callable named ``qualname`` (``test_f`` or ``TestClass.test_m``)."""
    owner_name, _, attr = qualname.rpartition(".")
    if not owner_name:
        return getattr(module, attr)  # type: ignore[no-any-return]
    owner = getattr(module, owner_name)
    return getattr(owner(), attr)  # type: ignore[no-any-return]


def format_failure(
    exc: BaseException, module_path: str, config: pytest.Config, native: bool = False
) -> str:
    """pytest's report of ``exc`` from the test function down, in pytest's style.

    As pytest does, the traceback starts at the test module, hides frames
    marked ``__tracebackhide__``, and in the default ``auto`` style shows the
    first and last entries long and the ones between short. ``native`` (for a failure
    pytest reports as expected and shows no text of) formats it as Python does: the long
    style parses each frame's source file, 10 to 30 ms a failure in torch's modules.
    """
    excinfo = pytest.ExceptionInfo.from_exception(exc)
    traceback = excinfo.traceback.cut(path=module_path).filter(excinfo)
    style = config.getoption("tbstyle", "auto")
    if native:
        style = "native"
    if style == "auto":
        style = "long"
        if len(traceback) > 2:
            middle = [entry.with_repr_style("short") for entry in traceback[1:-1]]
            traceback = type(traceback)([traceback[0], *middle, traceback[-1]])
    excinfo.traceback = traceback
    return str(
        excinfo.getrepr(
            style=style,
            showlocals=bool(config.getoption("showlocals", False)),
            funcargs=True,
            truncate_locals=config.get_verbosity() < 2,
        )
    )
