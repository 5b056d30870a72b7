"""The capability probe: what the gate will and will not exercise on this torch and machine.

    python -m ci.gate.probe [--json]

prints the torch under test, its accelerator and devices, every backend it has registered
(with the modules ``HARNESS_PRELOAD`` names imported first), which world sizes each can run
here, and each state-dict API the gate exercises with its signature, or MISSING (the gate
records its tests as skips naming it).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import sys
from typing import Any

from conformance import EXERCISED_APIS, lookup
from harness import devices, import_preloads

GATE_WORLD_SIZES = (1, 2, 4, 8)


def _signature(found: Any) -> str:
    """Parameter names and defaults, without the annotations that would fill a screen."""
    try:
        signature = inspect.signature(found)
    except (TypeError, ValueError):
        return "(signature not introspectable)"
    empty = inspect.Parameter.empty
    parameters = [p.replace(annotation=empty) for p in signature.parameters.values()]
    return str(signature.replace(parameters=parameters, return_annotation=empty))


def apis() -> list[dict[str, str | None]]:
    """Each exercised API with its signature, or ``None`` where the build lacks it."""
    rows: list[dict[str, str | None]] = []
    for module, name in EXERCISED_APIS:
        try:
            signature: str | None = _signature(lookup(module, name))
        except (ImportError, AttributeError):
            signature = None
        rows.append({"api": f"{module}.{name}", "signature": signature})
    return rows


def capabilities() -> dict[str, Any]:
    """The torch build, its accelerator and backends, and the worlds each backend can run."""
    import torch

    accelerator = devices.accelerator()
    backends = {name: devices.is_available(name) for name in devices.registered_backends()}
    return {
        "torch": torch.__version__,
        "torch_git_hash": torch.version.git_version,
        "torch_path": os.path.dirname(torch.__file__),
        "cuda": torch.version.cuda,
        "accelerator": accelerator,
        "devices": devices.device_names(accelerator) if accelerator else [],
        "cpu_cores": os.cpu_count(),
        "backends": backends,
        "runnable_world_sizes": {
            name: _runnable_world_sizes(name) if available else []
            for name, available in backends.items()
        },
        "apis": apis(),
    }


def _runnable_world_sizes(backend: str) -> list[int]:
    """The gate's world sizes that ``backend`` can run here, on the device type ``auto`` gives
    it: all of them on the CPU, as many as there are devices elsewhere."""
    try:
        _, device_type = devices.resolve(backend, devices.AUTO)
    except ValueError:
        return []
    count = devices.device_count(device_type)
    return [size for size in GATE_WORLD_SIZES if count is None or size <= count]


def render(caps: dict[str, Any]) -> str:
    names = ", ".join(caps["devices"]) or "none"
    lines = [
        f"torch under test: {caps['torch']} (git {caps['torch_git_hash']}) at {caps['torch_path']}",
        f"accelerator: {caps['accelerator'] or 'none'}; devices: {names}; "
        f"CUDA: {caps['cuda'] or 'none'}; CPU cores: {caps['cpu_cores']}",
        "backends: "
        + ", ".join(f"{n} {'yes' if ok else 'no'}" for n, ok in caps["backends"].items()),
    ]
    for backend, sizes in caps["runnable_world_sizes"].items():
        runnable = ", ".join(map(str, sizes)) or "none"
        lines.append(f"{backend} worlds runnable here at sizes: {runnable}")
    lines.append("state-dict APIs the gate exercises:")
    for row in caps["apis"]:
        signature = row["signature"]
        lines.append(
            f"  {row['api']}{signature}"
            if signature is not None
            else f"  {row['api']}: MISSING (its tests skip)"
        )
    missing = sum(1 for row in caps["apis"] if row["signature"] is None)
    lines.append(f"{len(caps['apis']) - missing} of {len(caps['apis'])} APIs present")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ci.gate.probe", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    args = parser.parse_args(argv)
    import_preloads()  # a vendor's backend and device are registered by its module
    caps = capabilities()
    print(json.dumps(caps, indent=1) if args.json else render(caps))
    return 0


if __name__ == "__main__":
    sys.exit(main())
