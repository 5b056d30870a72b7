"""Mutants of what a run keeps beside its model and optimizer: a schedule, the loss scaler,
the data loader's position."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ci.mutation.mutants._mutant import (
    DATA_LOADER_SAMPLER,
    GRAD_SCALER,
    LR_SCHEDULER,
    mutant_maker,
)

Fn = Callable[..., Any]
RUN_STATE = (
    "conformance/checks/test_run_state.py::"
    "test_a_resumed_run_draws_and_trains_as_one_that_never_stopped"
)


def _inner_schedulers_not_loaded(original: Fn) -> Fn:
    def load_state_dict(self: Any, state_dict: dict[str, Any]) -> None:
        self.__dict__.update({k: v for k, v in state_dict.items() if k != "_schedulers"})

    return load_state_dict


def _growth_tracker_not_loaded(original: Fn) -> Fn:
    def load_state_dict(self: Any, state_dict: dict[str, Any]) -> None:
        original(self, {**state_dict, "_growth_tracker": 0})

    return load_state_dict


def _a_batch_late(original: Fn) -> Fn:
    def load_state_dict(self: Any, state_dict: dict[str, Any]) -> None:
        original(self, state_dict)
        next(self, None)

    return load_state_dict


MUTANTS = [
    mutant_maker(LR_SCHEDULER, RUN_STATE)(
        "sequential_schedule_forgets_its_schedulers",
        "SequentialLR.load_state_dict",
        "SequentialLR loads its own counters but not its schedulers' states, which restart",
        _inner_schedulers_not_loaded,
        f"{RUN_STATE}[w2-ddp-warmup_cosine-dcp]",
    ),
    mutant_maker(GRAD_SCALER, RUN_STATE)(
        "grad_scaler_forgets_its_growth_tracker",
        "GradScaler.load_state_dict",
        "a loaded GradScaler counts the steps to its next growth from zero",
        _growth_tracker_not_loaded,
        f"{RUN_STATE}[w2-ddp-warmup_cosine-dcp]",
    ),
    mutant_maker(DATA_LOADER_SAMPLER, RUN_STATE)(
        "data_loader_resumes_a_batch_late",
        "_BatchSamplerIterator.load_state_dict",
        "StatefulDataLoader's batch sampler resumes one batch after where it was saved",
        _a_batch_late,
        f"{RUN_STATE}[w2-ddp-warmup_cosine-dcp]",
    ),
]
