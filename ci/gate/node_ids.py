"""What a pytest node id of the suite says, read in one place: its file, module, test
function, parameters and world size (``conformance/checks/test_x.py::test_y[w4-ddp-adam]``)."""

from __future__ import annotations

import re
from collections.abc import Iterable

_WORLD_SIZE = re.compile(r"\[w(\d+)")  # ``[w4-ddp]``: the world size an id names


def path_of(nodeid: str) -> str:
    """``conformance/checks/test_x.py::t[w2]`` -> ``conformance/checks/test_x.py``."""
    return nodeid.split("::", 1)[0]


def module_of(nodeid: str) -> str:
    """``conformance/checks/test_x.py::t[w2]`` -> ``test_x``."""
    return path_of(nodeid).rsplit("/", 1)[-1].removesuffix(".py")


def name_of(nodeid: str) -> str:
    """``conformance/checks/test_x.py::t[w2-ddp]`` -> ``t[w2-ddp]``."""
    return nodeid.partition("::")[2]


def function_of(nodeid: str) -> str:
    """``conformance/checks/test_x.py::t[w2-ddp]`` -> ``conformance/checks/test_x.py::t``."""
    return nodeid.split("[", 1)[0]


def params_of(nodeid: str) -> list[str]:
    """``...::t[w2-ddp-adam]`` -> ``["w2", "ddp", "adam"]``; ``[]`` for an id of none."""
    inside = nodeid.partition("[")[2].rstrip("]")
    return inside.split("-") if inside else []


def parallelisms_of(nodeid: str, parallelisms: Iterable[str]) -> list[str]:
    """The parameters of an id that name one of ``parallelisms``, in the id's order."""
    known = set(parallelisms)
    return [param for param in params_of(nodeid) if param in known]


def world_size_in(nodeid: str) -> int | None:
    """The world size an id names (``[w4-...]``); None for a test of no world."""
    found = _WORLD_SIZE.search(nodeid)
    return int(found.group(1)) if found else None


def world_size_of(nodeid: str) -> int:
    """The world size an id runs at: the one it names, 1 for a test of no world."""
    return world_size_in(nodeid) or 1


def at_world_sizes(nodeids: Iterable[str], world_sizes: str) -> list[str]:
    """The ids that run at one of ``world_sizes`` (as the gate takes them: ``"1,2,4"``)."""
    sizes = {int(size) for size in world_sizes.split(",")}
    return [nodeid for nodeid in nodeids if world_size_of(nodeid) in sizes]
