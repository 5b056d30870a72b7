"""A pytest plugin (``-p tests.inner.torch_without_apis``) that plays a torch build lacking
every API the suite judges, or only those named in ``GATE_TEST_MISSING_APIS``
(comma-separated ``module.name``)."""

from __future__ import annotations

import os
from typing import Any

from conformance import _upstream

_MISSING = {name for name in os.environ.get("GATE_TEST_MISSING_APIS", "").split(",") if name}
_real_lookup = _upstream.lookup


def _lookup(module: str, name: str) -> Any:
    if not _MISSING or f"{module}.{name}" in _MISSING:
        raise AttributeError(f"this build has no {module}.{name}")
    return _real_lookup(module, name)


_upstream.lookup = _lookup
