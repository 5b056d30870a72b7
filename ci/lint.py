"""The project's lint: ruff's checks and its format, then mypy (strict; pyproject.toml names
its files). Every step runs, and the exit status is 1 if any failed.

    python -m ci.lint

``tox -e lint`` runs it; ``.ci/run`` runs it in the unit environment, with the lint tools
added there.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PATHS = ("reference_impl", "harness", "conformance", "ci", "tests")
STEPS: tuple[tuple[str, ...], ...] = (
    ("ruff", "check", *PATHS),
    ("ruff", "format", "--check", *PATHS),
    ("mypy",),
)


def main() -> int:
    failed = [
        " ".join(step)
        for step in STEPS
        if subprocess.run([sys.executable, "-m", *step], cwd=ROOT, check=False).returncode
    ]
    for step in failed:
        print(f"lint: {step} failed", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
