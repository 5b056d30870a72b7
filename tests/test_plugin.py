"""The world plugin as a test author sees it: ids, options, reports, fixtures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness._items import deadline
from harness._options import WorldOptions
from tests._inner import InnerRun, run_inner

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def features(tmp_path_factory: pytest.TempPathFactory) -> InnerRun:
    return run_inner("inner_plugin.py", tmp_path_factory.mktemp("plugin"), "--world-sizes", "1,2,4")


@pytest.mark.parametrize(
    "name",
    [
        "test_context_fields[w1]",
        "test_context_fields[w2]",
        "test_context_fields[w4]",
        "test_ranks_run_with_hash_seeds_of_their_own[w2]",
        "test_what_a_rank_imported_is_out_of_the_collectors_sight[w2]",
        "test_ranks_start_with_large_tensors_kept_out_of_the_heap[w2]",
        "test_parametrized[w2-dtype0-3]",
        "test_parametrized[w2-dtype1-5]",
        "test_shared_tmp_path[w2]",
        "test_shared_tmp_path[w4]",
        "test_mesh_2d[w4]",
        "test_subgroups_of_earlier_tests_are_gone[w2]",
        "test_subgroups_of_earlier_tests_are_gone[w4]",
        "test_dtensor_ops_on_a_mesh_equal_to_an_earlier_tests[w4-1]",
        "test_dtensor_ops_on_a_mesh_equal_to_an_earlier_tests[w4-2]",
        "test_plain",
    ],
)
def test_feature_passes(features: InnerRun, name: str) -> None:
    assert features.outcome(name) == "passed", features.message(name)


def test_world_meshes_are_kept_while_tests_pass(features: InnerRun) -> None:
    test = "test_world_meshes_are_kept_while_tests_pass[w2-{}]"
    steps = ("made", "kept", "makes_a_group", "fresh_after_a_group", "destroys_its_group")
    steps += ("fresh_after_destroying", "kept_after_failing")
    fresh_worlds = ("fresh_world_after_failing_out_of_step", "fresh_world_after_a_failed_make")
    for step in (*steps, *fresh_worlds):
        assert features.outcome(test.format(step)) == "passed", features.message(test.format(step))
    assert features.outcome(test.format("fails")) == "failed"
    assert features.outcome(test.format("fails_out_of_step")) == "failed"
    failed_make = test.format("kept_object_fails_to_be_made_on_rank_1")
    assert features.outcome(failed_make) == "failed"
    assert "rank 0 hung, rank 1 failed" in features.message(failed_make)
    assert "RuntimeError: rank 1 cannot make it" in features.message(failed_make)


def test_combinations_that_do_not_apply_are_not_collected(features: InnerRun) -> None:
    ran = sorted(name for name in features.cases if "parts_divide" in name)
    assert ran == [
        "test_only_where_the_parts_divide_the_world[w2-2]",
        "test_only_where_the_parts_divide_the_world[w4-2]",
        "test_only_where_the_parts_divide_the_world[w4-4]",
    ]
    assert all(features.outcome(name) == "passed" for name in ran)
    assert "3 world test ids not applicable at their world size (not collected)" in (
        features.output
    )


def test_subgroup_cleanup_keeps_the_world(features: InnerRun) -> None:
    # The world is recycled only after failures; a passing test that made
    # subgroups leaves a reusable world whose subgroups were destroyed.
    assert features.outcome("test_creates_subgroups[w4]") == "passed"


def test_failing_assert_shows_values_per_rank(features: InnerRun) -> None:
    name = "test_assertion_shows_values[w2]"
    assert features.outcome(name) == "failed"
    message = features.message(name)
    assert "rank 1 failed, rank 0 passed" in message
    assert "assert {'rank': 1, 'ok': True} == {'rank': 0, 'ok': True}" in message
    assert "{'rank': 1} != {'rank': 0}" in message  # pytest's own comparison explanation
    assert "inner_plugin.py:44: AssertionError" in message


def test_captured_output_is_labelled_by_rank(features: InnerRun) -> None:
    assert "Captured stdout (rank 0) call" in features.output
    assert "printed by rank 0" in features.output
    assert "Captured stdout (rank 1) call" in features.output
    assert "printed by rank 1" in features.output


def test_xfail_marker_applies_to_world_failures(features: InnerRun) -> None:
    assert features.outcome("test_xfail_on_one_rank[w2]") == "skipped"  # junit's xfail
    assert "XFAIL inner_plugin.py::test_xfail_on_one_rank[w2] - a known divergence" in (
        features.output
    )
    assert features.outcome("test_strict_xfail_that_passes[w2]") == "failed"


def test_imperative_xfail_on_every_rank_is_an_xfail(features: InnerRun) -> None:
    assert "XFAIL inner_plugin.py::test_imperative_xfail[w2] - every rank says so" in (
        features.output
    )


def test_controller_fixtures_are_refused_by_name(features: InnerRun) -> None:
    name = "test_asks_for_a_controller_fixture[w2]"
    assert features.outcome(name) == "failed"
    assert "also asks for fixture(s): tmp_path" in features.message(name)


def test_plain_tests_keep_pytest_timeout(features: InnerRun) -> None:
    name = "test_plain_guarded_by_pytest_timeout"
    assert features.outcome(name) == "failed"
    assert "Timeout" in features.message(name)


# ----- collection and options: no world is spawned -----------------------------

WORLD_TESTS = """
import json

import pytest

@pytest.mark.world(1, 2, 4)
def test_sizes(world):
    pass

@pytest.mark.world(2)
@pytest.mark.parametrize("x", ["a", "b"])
def test_param(world, x):
    pass

def test_plain():
    pass
"""


def collected_ids(result: pytest.RunResult) -> list[str]:
    return [line.split("::", 1)[1] for line in result.outlines if "::" in line]


def test_one_item_per_size_with_the_size_in_its_id(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(WORLD_TESTS)
    result = pytester.runpytest("--collect-only", "-q")
    assert collected_ids(result) == [
        "test_plain",
        "test_sizes[w1]",
        "test_sizes[w2]",
        "test_param[w2-a]",
        "test_param[w2-b]",
        "test_sizes[w4]",
    ]


def test_world_sizes_option_deselects_other_sizes(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(WORLD_TESTS)
    result = pytester.runpytest("--collect-only", "-q", "--world-sizes", "4")
    assert collected_ids(result) == ["test_plain", "test_sizes[w4]"]
    result.stdout.fnmatch_lines(["*4 deselected*"])


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--world-sizes", "two"], "--world-sizes takes comma-separated integers"),
        (["--world-sizes", "0"], "--world-sizes needs positive sizes"),
        (["--world-timeout", "0"], "--world-timeout must be positive"),
        (["--world-max", "0"], "--world-max must be at least 1"),
        (
            ["--world-ranks-per-device", "0"],
            "--world-ranks-per-device: ranks per device must be a positive integer, got 0",
        ),
        (["--world-hash-seed", "-1"], "--world-hash-seed takes 0 to 2147483647, got -1"),
    ],
)
def test_bad_options_are_usage_errors(
    pytester: pytest.Pytester, args: list[str], error: str
) -> None:
    pytester.makepyfile(WORLD_TESTS)
    result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert error in result.stderr.str()


def test_marked_test_without_world_argument_is_refused(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest
        @pytest.mark.world(2)
        def test_no_arg():
            pass
        """
    )
    result = pytester.runpytest("--collect-only")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(
        ["*test_no_arg: a test marked world must take the `world` argument"]
    )


def test_world_fixture_without_marker_fails_clearly(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_unmarked(world):\n    pass\n")
    result = pytester.runpytest()
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*needs @pytest.mark.world(sizes...)*"])


NCCL_TEST = """
import json

import pytest
@pytest.mark.world(2)
def test_on_gpus(world):
    pass
"""


def test_nccl_world_without_devices_is_skipped_with_the_reason(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(NCCL_TEST)
    result = pytester.runpytest("--world-backend", "nccl", "-rs")
    result.assert_outcomes(skipped=1)
    out = result.stdout.str()
    assert "this torch build has no nccl backend" in out or "cuda devices (one per rank)" in out


def test_require_devices_turns_the_skip_into_a_failure(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(NCCL_TEST)
    result = pytester.runpytest("--world-backend", "nccl", "--world-require-devices")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*(--world-require-devices)*"])


SLEEPER = """import time
import pytest


@pytest.mark.world(1)
def test_sleeps(world):
    time.sleep({seconds})


@pytest.mark.world(1)
@pytest.mark.xfail(reason="known to hang", strict=True)
def test_known_to_hang(world):
    time.sleep(120)
"""


def _sleeper(pytester: pytest.Pytester, seconds: float) -> Path:
    """A module whose test sleeps ``seconds``, and durations that record it at 0.1 s."""
    pytester.makepyfile(test_slow=SLEEPER.format(seconds=seconds))
    recorded = pytester.path / "recorded.json"
    recorded.write_text(
        json.dumps({"test_slow.py::test_sleeps": 0.1, "test_slow.py::test_known_to_hang": 0.1})
    )
    return recorded


def test_a_hang_at_a_recorded_deadline_is_confirmed_under_the_full_one(
    pytester: pytest.Pytester,
) -> None:
    """A test recorded at 0.1 s that now hangs is cut at the floor, then run again alone under
    --world-timeout, whose cut is the verdict; a known hang is not run twice."""
    recorded = _sleeper(pytester, 120)
    result = pytester.runpytest_subprocess(
        f"--world-deadlines={recorded}", "--world-deadline-floor=2", "--world-timeout=4",
        "-p", "no:cacheprovider", "-rxX",
    )  # fmt: skip
    result.assert_outcomes(failed=1, xfailed=1)
    result.stdout.fnmatch_lines(
        [
            "*run twice: cut at its deadline of 2 s, fitted to its recorded duration (rank 0 "
            "still running), then run again alone under 4 s*",
            "*did not finish within the 4 s deadline*",
        ]
    )
    assert result.stdout.str().count("RunAgainWarning: cut at") == 1  # not the known hang


def test_a_test_slower_here_than_recorded_passes_on_its_second_run(
    pytester: pytest.Pytester,
) -> None:
    """Cut at a deadline fitted to another machine's duration is no verdict: the second run,
    under --world-timeout, passes."""
    recorded = _sleeper(pytester, 3)
    result = pytester.runpytest_subprocess(
        f"--world-deadlines={recorded}", "--world-deadline-floor=1", "--world-timeout=30",
        "-p", "no:cacheprovider", "-k", "sleeps",
    )  # fmt: skip
    result.assert_outcomes(passed=1, warnings=1)
    result.stdout.fnmatch_lines(["*RunAgainWarning: cut at its deadline of 1 s*"])


class _Marked:
    """A collected test as ``deadline`` reads it: its id and markers."""

    def __init__(self, *marks: pytest.Mark) -> None:
        self.nodeid = "t.py::t[w2]"
        self.marks = {mark.name: mark for mark in marks}

    def get_closest_marker(self, name: str) -> pytest.Mark | None:
        return self.marks.get(name)


@pytest.mark.parametrize(
    ("marks", "seconds", "unfitted_s"),
    [
        ((pytest.mark.world(2).mark,), 30.0, 300.0),
        ((pytest.mark.world(2, timeout=20).mark,), 20.0, 20.0),
        ((pytest.mark.world(2).mark, pytest.mark.world_alone(timeout=60).mark), 30.0, 60.0),
        ((pytest.mark.world(2).mark, pytest.mark.world_alone(timeout=10).mark), 10.0, 10.0),
    ],
)
def test_a_deadline_is_fitted_only_below_what_the_test_has_without_durations(
    marks: tuple[pytest.Mark, ...], seconds: float, unfitted_s: float
) -> None:
    """Recorded at 1 s: fitted to the 30 s floor, unless the marker sets its own timeout or a
    world_alone cap is lower; a cut at a fitted deadline is confirmed under ``unfitted_s``."""
    options = WorldOptions(recorded_s={"t.py::t": 1.0})
    limit = deadline(_Marked(*marks), options)  # type: ignore[arg-type]
    assert (limit.seconds, limit.unfitted_s) == (seconds, unfitted_s)
    assert limit.fitted == (seconds < unfitted_s)


@pytest.mark.parametrize(
    ("recorded", "expected"),
    [(None, 300.0), (0.5, 30.0), (4.0, 40.0), (100.0, 300.0)],
)
def test_deadlines_are_ten_times_the_recorded_duration_within_floor_and_timeout(
    recorded: float | None, expected: float
) -> None:
    options = WorldOptions(recorded_s={} if recorded is None else {"t.py::t": recorded})
    assert options.deadline_s("t.py::t[w2]") == expected


@pytest.mark.parametrize(
    ("content", "error"),
    [
        ("[1, 2]", "expected an object of test ids"),
        ('{"t.py::t[w2]": "slow"}', "'t.py::t\\[w2\\]' needs a duration in seconds"),
        ("{not json", "--world-deadlines"),
    ],
)
def test_a_malformed_durations_file_is_a_usage_error(
    pytester: pytest.Pytester, content: str, error: str
) -> None:
    recorded = pytester.path / "recorded.json"
    recorded.write_text(content)
    pytester.makepyfile("def test_plain():\n    pass\n")
    result = pytester.runpytest(f"--world-deadlines={recorded}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.re_match_lines([f".*{error}.*"])
