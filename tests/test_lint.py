"""``python -m ci.lint`` runs every step, and fails, naming it, where any step fails."""

from __future__ import annotations

import pytest

from ci import lint


def test_every_step_runs_and_a_failed_step_fails_the_lint(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    failing, passing = ("json.tool", "--no-such-option"), ("pip", "--version")
    monkeypatch.setattr(lint, "STEPS", (failing, passing))
    assert lint.main() == 1
    out, err = capfd.readouterr()
    assert out.startswith("pip ")  # the step after the failed one ran
    assert "lint: json.tool --no-such-option failed" in err
    monkeypatch.setattr(lint, "STEPS", (passing,))
    assert lint.main() == 0
