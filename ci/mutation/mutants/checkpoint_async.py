"""Mutants of asynchronous checkpointing: its stagers and its checkpointers."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from torch.distributed._state_dict_utils import _offload_state_dict_to_cpu

from ci.mutation.mutants._mutant import (
    PROCESS_CHECKPOINTER,
    STAGER,
    STAGING,
    THREAD_CHECKPOINTER,
    mutant_maker,
)

Fn = Callable[..., Any]
SAVES = "conformance/checks/test_async_saves.py"
AT_THE_CALL = f"{SAVES}::test_an_async_save_writes_the_state_at_its_call"
FAILURES = "conformance/checks/test_async_save_failures.py"
STAGING_CHECKS = "conformance/checks/test_async_staging.py"
KILLED = "conformance/checks/test_killed_saves.py"


def _stage_returns_the_live_state(original: Fn) -> Fn:
    def stage(self: Any, state_dict: Any, non_blocking: bool = False) -> Any:
        return state_dict

    return stage


def _cached_storage_not_copied_again(original: Fn) -> Fn:
    def stage_storage(self: Any, storage: Any, non_blocking: bool = False) -> Any:
        if storage in self._cached_storage_mapping:
            return self._cached_storage_mapping[storage]
        return original(self, storage, non_blocking=non_blocking)

    return stage_storage


def _blocking_stage_without_a_copy(original: Fn) -> Fn:
    def stage(self: Any, state_dict: Any) -> Any:
        if self.cache_staged_state_dict:
            return original(self, state_dict)
        return _offload_state_dict_to_cpu(state_dict, type_check=self.type_check)

    return stage


def _upload_error_swallowed(original: Fn) -> Fn:
    def save_wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return original(*args, **kwargs)
        except BaseException:
            return None

    return save_wrapper


def _never_notices_its_process_died(original: Fn) -> Fn:
    def _wait_for_response(self: Any, timeout: float | None = None) -> Any:
        while True:  # the bug: neither the process's death nor its closed pipe is seen
            try:
                response = self._process_pipe.recv()
            except EOFError:
                time.sleep(0.1)
                continue
            if isinstance(response, BaseException):
                raise response
            return response

    return _wait_for_response


MUTANTS = [
    mutant_maker(STAGER, AT_THE_CALL)(
        "stager_returns_the_live_state",
        "StateDictStager.stage",
        "DefaultStager's staging hands back the live state instead of a copy",
        _stage_returns_the_live_state,
    ),
    mutant_maker(STAGER, STAGING_CHECKS)(
        "kept_stager_skips_the_copy_after_the_first_save",
        "StateDictStager._stage_untyped_storage",
        "a stager kept across saves hands back its cached buffers without copying into them",
        _cached_storage_not_copied_again,
    ),
    mutant_maker(STAGING)(
        "blocking_stager_offloads_without_copying",
        "BlockingAsyncStager.stage",
        "BlockingAsyncStager offloads to the CPU, which leaves CPU tensors uncopied "
        "(torch 2.6's staging, pytorch#144657)",
        _blocking_stage_without_a_copy,
        f"{AT_THE_CALL}[w4-ddp-adamw_step_lr-thread-blocking]",
        f"{AT_THE_CALL}[w4-ddp-adamw_step_lr-thread-writer]",
    ),
    mutant_maker(THREAD_CHECKPOINTER, FAILURES)(
        "async_save_failure_swallowed",
        "save_wrapper",
        "the thread checkpointer's future swallows the error of a failed save",
        _upload_error_swallowed,
    ),
    mutant_maker(PROCESS_CHECKPOINTER, FAILURES)(
        "process_checkpointer_never_notices_its_death",
        "_AsyncCheckpointProcess._wait_for_response",
        "the process checkpointer waits on for an answer from its process after it died",
        _never_notices_its_process_died,
        f"{KILLED}::test_a_save_killed_midway_is_reported_and_loses_nothing"
        "[w2-ddp-process-planned]",
    ),
]
