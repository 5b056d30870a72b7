"""A clock for pytest-benchmark that replays durations measured elsewhere.

pytest-benchmark times a function in the controller; state-dict operations must be timed
inside the world (barrier, time, maximum over ranks). The ranks measure, and the
benchmark's timer is this clock: each replayed round advances it by one measured duration,
so pytest-benchmark's statistics, JSON and comparisons describe the ranks' timings.
"""

from __future__ import annotations

from collections import deque


class ReplayClock:
    def __init__(self) -> None:
        self._now = 0.0
        self._pending: deque[float] = deque()

    def now(self) -> float:
        """The timer pytest-benchmark reads before and after each round."""
        return self._now

    def load(self, durations: list[float]) -> int:
        """Queue the measured durations; returns how many rounds to replay."""
        if self._pending:
            raise RuntimeError(f"{len(self._pending)} durations were never replayed")
        if not durations or any(d < 0 for d in durations):
            raise ValueError(f"durations must be non-empty and non-negative, got {durations}")
        self._pending.extend(durations)
        return len(durations)

    def replay_round(self) -> None:
        """The benchmarked function: one round, as long as the ranks measured it."""
        self._now += self._pending.popleft()


CLOCK = ReplayClock()
