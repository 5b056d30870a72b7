"""Canonical FQNs: every parameter's and buffer's name as if the model had no wrapper.

A parallelism wraps modules (DDP's ``module``, FSDP1's ``_fsdp_wrapped_module``,
``torch.compile``'s ``_orig_mod``, activation checkpointing's
``_checkpoint_wrapped_module``) and a module may hide a level of its own
through an FQN-modifier hook. The canonical FQN leaves all of these out.
The key a module's ``state_dict``/``load_state_dict`` uses keeps DDP's and
compile's segments only: FSDP1 and checkpoint wrappers strip theirs in their
own state-dict hooks, and a modifier hook hides its level the same way.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import ActivationWrapper
from torch.distributed.fsdp import FullyShardedDataParallel
from torch.distributed.fsdp._flat_param import FlatParameter
from torch.nn.parallel import DistributedDataParallel

EXTRA_STATE = nn.modules.module._EXTRA_STATE_KEY_SUFFIX

_KEPT_IN_KEYS: dict[type[nn.Module], str] = {DistributedDataParallel: "module"}
_STRIPPED_FROM_KEYS: dict[type[nn.Module], str] = {
    FullyShardedDataParallel: "_fsdp_wrapped_module",
    ActivationWrapper: "_checkpoint_wrapped_module",
}
_COMPILED_SEGMENT = "_orig_mod"


def _compiled_module_type() -> type[nn.Module] | None:
    """``torch.compile``'s wrapper class once dynamo is imported, else None: no module is
    compiled before that, and importing dynamo only to look would cost every process seconds."""
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    return None if eval_frame is None else eval_frame.OptimizedModule


def _kept_in_keys() -> dict[type[nn.Module], str]:
    compiled = _compiled_module_type()
    return _KEPT_IN_KEYS if compiled is None else {**_KEPT_IN_KEYS, compiled: _COMPILED_SEGMENT}


def _wrapper_segment(module: nn.Module, table: dict[type[nn.Module], str]) -> str | None:
    return next((name for kind, name in table.items() if isinstance(module, kind)), None)


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


@dataclass(frozen=True)
class Entry:
    """One named piece of model state: its canonical FQN and its state-dict key.

    ``value`` is the registered parameter or buffer that holds it (for the
    original parameters of an FSDP1 flat parameter, that flat parameter), or
    None for extra state; ``owner`` is the module that registers it.
    """

    fqn: str
    key: str
    value: torch.Tensor | None
    owner: nn.Module


class ModelNames:
    """The canonical names of a model's state, in upstream's load order (children first)."""

    def __init__(self, model: nn.Module, fqn_modifiers: str = "_fqn_modifiers") -> None:
        self._module_fqns: dict[int, str] = {}
        self.entries = tuple(_walk(model, "", "", fqn_modifiers, self._module_fqns))
        self._fqn_by_key = {entry.key: entry.fqn for entry in self.entries}
        self._key_by_fqn = {entry.fqn: entry.key for entry in self.entries}
        self._fqns_by_tensor: dict[int, list[str]] = {}
        for entry in self.entries:
            if entry.value is not None:
                self._fqns_by_tensor.setdefault(id(entry.value), []).append(entry.fqn)
        self._first_fqn: dict[int, str | None] = {
            id(param): self._fqn_named(name, param) for name, param in model.named_parameters()
        }

    def _fqn_named(self, parameter_name: str, param: torch.Tensor) -> str | None:
        """The FQN among ``param``'s that ``named_parameters`` calls ``parameter_name``."""
        fqns = self.fqns_of(param)
        named = self._fqn_by_key.get(without_stripped_segments(parameter_name))
        return named if named in fqns else (fqns[0] if fqns else None)

    def fqn_of_key(self, key: str) -> str:
        """The canonical FQN of a state-dict key of the model; a clear error if none."""
        try:
            return self._fqn_by_key[key]
        except KeyError:
            raise KeyError(f"{key}: a state-dict key that names no state of the model") from None

    def key_of(self, fqn: str) -> str | None:
        """The state-dict key of the canonical ``fqn``, or None if the model has none."""
        return self._key_by_fqn.get(fqn)

    def fqn_of_module(self, module: nn.Module) -> str:
        """The canonical FQN of a submodule (``""`` for the model and wrappers of it)."""
        try:
            return self._module_fqns[id(module)]
        except KeyError:
            raise KeyError(f"{type(module).__name__} is not a module of the model") from None

    def module_fqns(self) -> list[str]:
        """Every submodule's canonical FQN once, parents before children (``""`` first)."""
        return list(dict.fromkeys(self._module_fqns.values()))

    def fqns_of(self, tensor: torch.Tensor) -> list[str]:
        """Every FQN under which ``tensor`` (a parameter or buffer) is registered."""
        return self._fqns_by_tensor.get(id(tensor), [])

    def fqn_of_param(self, param: torch.Tensor) -> str:
        """The FQN of ``param``'s first registration in ``named_parameters`` order.

        A shared parameter has several FQNs; optimizer state dicts name it by this one.
        """
        fqn = self._first_fqn.get(id(param))
        if fqn is None:
            raise KeyError(
                f"a parameter of shape {list(param.shape)} is not a parameter of the model"
            )
        return fqn


def without_stripped_segments(name: str) -> str:
    """``name`` without the FSDP1 and checkpoint wrapper segments their state-dict hooks strip
    (a ``named_parameters`` name, or an FQN a flat parameter records inside such wrappers)."""
    return ".".join(part for part in name.split(".") if part not in _STRIPPED_SEGMENTS)


def without_wrapper_segments(name: str) -> str:
    """``name`` without any wrapper's segment a module path beneath FSDP1 can hold (FSDP1's,
    checkpointing's, and ``torch.compile``'s ``_orig_mod`` of a unit compiled before the
    wrapping): the canonical FQN of a name a flat parameter records."""
    return ".".join(part for part in name.split(".") if part not in _WRAPPER_SEGMENTS)


_STRIPPED_SEGMENTS = frozenset(_STRIPPED_FROM_KEYS.values())
# A build without dynamo compiles nothing, so no name holds compile's segment.
_WRAPPER_SEGMENTS = _STRIPPED_SEGMENTS | (
    {_COMPILED_SEGMENT} if importlib.util.find_spec("torch._dynamo") is not None else set()
)


def _walk(
    module: nn.Module, fqn: str, key: str, fqn_modifiers: str, visited: dict[int, str]
) -> Iterator[Entry]:
    """Children first, then buffers, parameters and extra state, as upstream orders them.

    ``visited`` gathers each module's canonical FQN, by module identity.
    """
    visited[id(module)] = fqn
    hidden = (
        set(getattr(module, fqn_modifiers)().values()) if hasattr(module, fqn_modifiers) else set()
    )
    kept = _wrapper_segment(module, _kept_in_keys())
    stripped = _wrapper_segment(module, _STRIPPED_FROM_KEYS)
    for name, child in module.named_children():
        if id(child) in visited:
            continue
        if name == kept:
            yield from _walk(child, fqn, _join(key, name), fqn_modifiers, visited)
        elif name == stripped or name in hidden:
            yield from _walk(child, fqn, key, fqn_modifiers, visited)
        else:
            yield from _walk(child, _join(fqn, name), _join(key, name), fqn_modifiers, visited)
    for name, buffer in module.named_buffers(recurse=False):
        if name not in module._non_persistent_buffers_set:
            yield Entry(_join(fqn, name), _join(key, name), buffer, module)
    for name, param in module.named_parameters(recurse=False):
        originals = _flat_parameter_fqns(param)
        if originals is None:
            yield Entry(_join(fqn, name), _join(key, name), param, module)
        else:
            for original in originals:
                canonical = without_wrapper_segments(original)
                yield Entry(_join(fqn, canonical), _join(key, original), param, module)
    if type(module).get_extra_state is not nn.Module.get_extra_state:
        yield Entry(_join(fqn, EXTRA_STATE), _join(key, EXTRA_STATE), None, module)


def _flat_parameter_fqns(param: torch.Tensor) -> list[str] | None:
    """The original parameters' FQNs (relative to its module) an FSDP1 flat parameter holds,
    a tied weight under each of its FQNs, as the module's state dict names them."""
    if not isinstance(param, FlatParameter):
        return None
    shared = [_join(info.module_name, info.param_name) for info in param._shared_param_infos]
    return [without_stripped_segments(fqn) for fqn in (*param._fqns, *shared)]
