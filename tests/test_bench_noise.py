"""The noise measurement: spreads between runs and within them, and the shared factor."""

from __future__ import annotations

import numpy as np
import pytest

from ci.bench.noise import spreads, summary


def _runs(shared: list[float], own: float, seed: int) -> list[dict[str, list[float]]]:
    """Runs of two benchmarks whose run times move by ``shared[r]`` together, plus ``own``
    independent noise each; rounds agree within 1%."""
    rng = np.random.default_rng(seed)
    found = []
    for factor in shared:
        run = {}
        for name, base in (("a", 0.01), ("b", 0.02)):
            median = base * np.exp(factor + own * rng.standard_normal())
            run[name] = list(median * (1 + 0.01 * rng.standard_normal(9)))
        found.append(run)
    return found


def test_a_factor_shared_by_every_benchmark_of_a_run_is_told_apart() -> None:
    slow_and_fast = [0.2, -0.2, 0.2, -0.2, 0.1, -0.1]
    by_name = {s.name: s for s in spreads(_runs(slow_and_fast, own=0.0, seed=1))}
    assert by_name["a"].between_runs == pytest.approx(np.std(slow_and_fast, ddof=1), rel=0.05)
    assert by_name["a"].between_without_shared < 0.01
    assert by_name["a"].within_run == pytest.approx(0.01, rel=0.5)
    assert by_name["b"].run_time_s == pytest.approx(0.02, rel=0.05)


def test_a_run_is_timed_by_its_median_round_as_the_comparison_times_it() -> None:
    """Runs whose fastest rounds differ and whose median rounds agree do not spread: a run's
    time is its median round, as in the comparison's summaries."""
    early, late = [0.010, 0.020, 0.020, 0.030], [0.016, 0.020, 0.020, 0.021]
    runs = [{"a": early if index % 2 else late} for index in range(6)]
    (found,) = spreads(runs)
    assert found.between_runs == 0.0
    assert found.run_time_s == pytest.approx(0.020)


def test_independent_noise_stays_once_the_shared_factor_is_removed() -> None:
    found = spreads(_runs([0.0] * 12, own=0.05, seed=2))
    assert all(0.02 < s.between_without_shared < 0.1 for s in found)
    overall = summary(found)
    assert overall["benchmarks"] == 2
    assert 0.02 < overall["between_runs"] < 0.1


def test_too_little_to_measure_is_refused() -> None:
    with pytest.raises(ValueError, match="at least two runs"):
        spreads(_runs([0.0], own=0.0, seed=3))
    tiny = [{"a": [1e-5, 1e-5]}, {"a": [1e-5, 1.1e-5]}]
    with pytest.raises(ValueError, match="no benchmark took 1 ms or more"):
        summary(spreads(tiny))
