"""The mutation catalogue and runner: every mutant applies and misbehaves as named, and
``python -m ci.mutation`` reports a kill by the test that saw it and a survivor as such."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import textwrap
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from ci.gate.target import SUITE_ROOT
from ci.mutation import cli as mutation
from ci.mutation import report
from ci.mutation.mutants import MODELLED_MODULES, UPSTREAM_MODULES, catalogue, missing_target
from ci.mutation.run import RunResult, RunSettings, raised_in_a_mutant

pytestmark = pytest.mark.slow


def _python(code: str) -> str:
    """Run ``code`` in a fresh interpreter (mutants patch torch for good); its stdout."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=SUITE_ROOT, capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_catalogue_has_forty_mutants_covering_every_modelled_module():
    mutants = catalogue()
    assert len(mutants) >= 40
    assert {mutant.upstream for mutant in mutants.values()} == set(UPSTREAM_MODULES)
    assert all(mutant.tests for mutant in mutants.values())


def test_every_mutant_replaces_its_target_in_its_module():
    """Every mutant whose target this build has (the modelled modules' in every release)."""
    replaced = json.loads(
        _python("""
            import json
            from ci.mutation.mutants import apply, catalogue, missing_target
            mutants = catalogue().items()
            print(json.dumps({n: apply(m) for n, m in mutants if missing_target(m) is None}))
        """)
    )
    for name, mutant in catalogue().items():
        if mutant.upstream in MODELLED_MODULES:
            assert name in replaced, name
        if name in replaced:
            assert mutant.upstream in replaced[name], name
            if not mutant.everywhere:
                assert replaced[name] == [mutant.upstream]


def test_a_target_the_build_lacks_is_named_and_its_mutant_counted_absent():
    mutant = catalogue()["flatten_joins_keys_with_slashes"]
    assert missing_target(mutant) is None
    lacking = replace(mutant, target="no_such_function")
    assert missing_target(lacking) == (
        f"torch {_torch_version()}'s {mutant.upstream} has no no_such_function"
    )
    outcome = mutation._unrun(lacking)
    assert outcome is not None
    assert (outcome.status, outcome.detail) == (report.ABSENT, missing_target(lacking))
    killed = report.MutantOutcome("a", "upstream.py", "a bug", report.KILLED, killed_by="t.py::a")
    assert report.kill_rate([killed, outcome]) == (1, 1)
    markdown = report.markdown_report([killed, outcome], "settings")
    assert "1 of 1 non-equivalent mutants (1 absent from this build, not counted)" in markdown


def test_a_module_the_build_lacks_is_named_and_one_that_fails_to_import_raises(monkeypatch):
    mutant = catalogue()["flatten_joins_keys_with_slashes"]
    monkeypatch.setitem(sys.modules, mutant.upstream, None)  # an import of it now fails
    assert missing_target(mutant) == f"torch {_torch_version()} has no module {mutant.upstream}"
    monkeypatch.undo()

    def import_failing_inside(name: str) -> None:
        raise ModuleNotFoundError("No module named 'a_dependency'", name="a_dependency")

    monkeypatch.setattr(importlib, "import_module", import_failing_inside)
    with pytest.raises(ModuleNotFoundError, match="a_dependency"):
        missing_target(mutant)


def _torch_version() -> str:
    import torch

    return torch.__version__


def test_local_mutants_misbehave_as_named():
    """The mutants of single-process utilities, called directly: each bug is really there."""
    _python("""
        import torch
        from torch.distributed import _state_dict_utils as utils
        from ci.mutation.mutants import apply, catalogue

        mutants = catalogue()
        flat, _ = utils._flatten_state_dict({"a": {"b": torch.ones(1)}})
        assert list(flat) == ["a.b"]
        apply(mutants["flatten_joins_keys_with_slashes"])
        flat, mapping = utils._flatten_state_dict({"a": {"b": torch.ones(1)}})
        assert list(flat) == ["a/b"], flat

        source = {"w": torch.ones(2)}
        apply(mutants["copy_returns_the_sources_tensors"])
        companion = {"w": torch.zeros(2)}
        assert utils._copy_state_dict(source, companion)["w"] is source["w"]

        apply(mutants["similarity_ignores_dtypes"])
        assert utils._check_state_dict_similarity({"w": torch.ones(2)}, {"w": torch.ones(2).half()})

        apply(mutants["cpu_state_dict_aliases_cpu_tensors"])
        assert utils._create_cpu_state_dict(source)["w"] is source["w"]

        apply(mutants["unflatten_turns_lists_into_dicts"])
        restored = utils._unflatten_state_dict({"l.0": 1}, {"l.0": ("l", 0)})
        assert restored == {"l": {"0": 1}}, restored
    """)


def test_async_checkpointing_mutants_misbehave_as_named():
    """The stagers' and the thread checkpointer's mutants, called directly."""
    mutants = catalogue()
    names = ("kept_stager_skips_the_copy_after_the_first_save", "stager_returns_the_live_state")
    names += ("blocking_stager_offloads_without_copying", "async_save_failure_swallowed")
    missing = sorted({why for name in names if (why := missing_target(mutants[name]))})
    if missing:
        pytest.skip("; ".join(missing))
    _python("""
        import torch
        from torch.distributed.checkpoint import _async_thread_executor as executor
        from torch.distributed.checkpoint._state_dict_stager import StateDictStager
        from torch.distributed.checkpoint.staging import BlockingAsyncStager
        from ci.mutation.mutants import apply, catalogue

        mutants = catalogue()
        live = {"w": torch.ones(2)}
        kept = StateDictStager()
        kept.stage(live)
        apply(mutants["kept_stager_skips_the_copy_after_the_first_save"])
        live["w"].add_(1)
        assert kept.stage(live)["w"].tolist() == [1.0, 1.0]  # the first save's values

        apply(mutants["stager_returns_the_live_state"])
        assert StateDictStager().stage(live)["w"] is live["w"]

        apply(mutants["blocking_stager_offloads_without_copying"])
        assert BlockingAsyncStager().stage(live)["w"] is live["w"]

        try:
            executor.save_wrapper({}, checkpoint_id=None, no_dist=True)
        except RuntimeError:
            pass
        else:
            raise AssertionError("a save with nowhere to write must fail")
        apply(mutants["async_save_failure_swallowed"])
        assert executor.save_wrapper({}, checkpoint_id=None, no_dist=True) is None
    """)


def _mutation_run(tmp_path: Path, mutant: str, test: str) -> dict[str, object]:
    out = tmp_path / mutant
    done = subprocess.run(
        [
            sys.executable, "-m", "ci.mutation", f"--mutants={mutant}", f"--tests={test}",
            "--world-sizes=2", "--world-timeout=60", f"--out={out}",
        ],
        cwd=SUITE_ROOT, capture_output=True, text=True, check=False, timeout=600,
    )  # fmt: skip
    (outcome,) = json.loads((out / "mutation.json").read_text())
    outcome["returncode"] = done.returncode
    outcome["markdown"] = (out / "mutation.md").read_text()
    return outcome


UTILS = "conformance/checks/test_state_dict_utils.py"
FLATTEN_TEST = f"{UTILS}::test_flatten_and_unflatten_match_the_oracle"
COPY_TEST = f"{UTILS}::test_copy_matches_the_oracle_and_returns_the_companions_tensors"


@pytest.mark.timeout(900)
def test_a_mutant_is_killed_by_the_test_that_sees_it(tmp_path):
    outcome = _mutation_run(tmp_path, "flatten_joins_keys_with_slashes", FLATTEN_TEST)
    assert outcome["status"] == "killed", outcome
    assert outcome["killed_by"] == FLATTEN_TEST + "[w2]"
    assert outcome["returncode"] == 0  # 1 of 1 killed reaches the target
    assert "**Kill rate: 1 of 1 non-equivalent mutants (100.0%).**" in str(outcome["markdown"])


@pytest.mark.timeout(900)
def test_a_mutant_no_test_sees_survives_and_misses_the_target(tmp_path):
    outcome = _mutation_run(tmp_path, "flatten_joins_keys_with_slashes", COPY_TEST)
    assert outcome["status"] == "survived", outcome
    assert outcome["killed_by"] is None
    assert outcome["returncode"] == 1


def test_an_exception_raised_in_a_mutants_own_code_is_no_kill():
    """Only the frame that raised counts: a test assertion, or torch raising after a mutant
    frame called it, is a kill; an exception raised inside ``ci/mutants`` is the mutant's bug."""
    broken = (
        "ci/mutants/state_dict_utils.py:58: in offload\n...\nci/mutants/_trees.py:38: TypeError"
    )
    seen = "ci/mutants/fsdp_state_dict_utils.py:31: in replace\n...\ntorch/x.py:9: AssertionError"
    assert raised_in_a_mutant(broken)
    assert not raised_in_a_mutant(seen)
    assert not raised_in_a_mutant("conformance/checks/test_x.py:12: AssertionError")


def _killed(name: str, test: str) -> report.MutantOutcome:
    return report.MutantOutcome(name, "upstream.py", "a bug", report.KILLED, killed_by=test)


def _baseline(result: RunResult, calls: list[list[str]]) -> Callable[..., RunResult]:
    """A stand-in for the run without any mutant: records which tests it was asked for."""

    def run(tests: list[str], mutant: object, *args: object, **kwargs: object) -> RunResult:
        assert mutant is None, "the baseline runs without a mutant"
        calls.append(tests)
        return result

    return run


def test_a_kill_by_a_test_that_fails_without_the_mutant_is_unverified(monkeypatch, tmp_path):
    outcomes = [_killed("a", "t.py::sees_a"), _killed("b", "t.py::broken")]
    calls: list[list[str]] = []
    result = RunResult(1, [("t.py::broken", "KeyError: 'w'")], 1.0, tmp_path / "log")
    monkeypatch.setattr(mutation, "run_tests", _baseline(result, calls))
    mutation.verify_killers(outcomes, RunSettings(), tmp_path)
    assert calls == [["t.py::broken", "t.py::sees_a"]]
    assert [o.status for o in outcomes] == [report.KILLED, report.UNVERIFIED]
    assert outcomes[1].detail == "it fails without the mutant too: KeyError: 'w'"


@pytest.mark.parametrize(("returncode", "why"), [(None, "timed out"), (3, "exited 3")])
def test_a_baseline_run_cut_off_verifies_no_kill(monkeypatch, tmp_path, returncode, why):
    outcomes = [_killed("a", "t.py::sees_a"), _killed("b", "t.py::sees_b")]
    result = RunResult(returncode, [], 1.0, tmp_path / "log")
    monkeypatch.setattr(mutation, "run_tests", _baseline(result, []))
    mutation.verify_killers(outcomes, RunSettings(), tmp_path)
    assert {o.status for o in outcomes} == {report.UNVERIFIED}
    assert all(f"the run without the mutant {why}" in o.detail for o in outcomes)


def test_no_kill_means_no_baseline_run(monkeypatch, tmp_path):
    calls: list[list[str]] = []
    result = RunResult(0, [], 1.0, tmp_path / "log")
    monkeypatch.setattr(mutation, "run_tests", _baseline(result, calls))
    survivor = report.MutantOutcome("a", "upstream.py", "a bug", report.SURVIVED)
    mutation.verify_killers([survivor], RunSettings(), tmp_path)
    assert calls == []
    assert survivor.status == report.SURVIVED
