"""An independent oracle of the semantics of torch's distributed state-dict code.

Modules mirror the upstream modules they model; users import from here.
``state_dict_utils`` models ``torch/distributed/_state_dict_utils.py``;
``state_dict`` models ``torch/distributed/checkpoint/state_dict.py``;
``fsdp_optim_utils`` models ``torch/distributed/fsdp/_optim_utils.py``;
``fsdp_state_dict_utils`` models ``torch/distributed/fsdp/_state_dict_utils.py``;
``peak_memory`` states the memory each utility may take, from the tensors' sizes.
"""

from __future__ import annotations

from reference_impl._flat_layout import (
    FlatLayout,
    FlatParamShard,
    ParamSlice,
    Segment,
    flat_layout,
    flat_param_shards,
)
from reference_impl._gather import local_piece
from reference_impl._optim_flat import (
    flatten_optimizer_state_dict,
    unflatten_optimizer_state_dict,
)
from reference_impl.fsdp_optim_utils import (
    fsdp_optim_state_dict,
    fsdp_optim_state_dict_to_load,
    fsdp_rekey_optim_state_dict,
)
from reference_impl.fsdp_state_dict_utils import (
    IncompatibleKeys,
    fsdp_load_state_dict,
    fsdp_state_dict,
)
from reference_impl.state_dict import (
    StateDictOptions,
    ensure_optimizer_state,
    get_model_state_dict,
    get_optimizer_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
    set_state_dict,
    split_optimizer_state_dict,
)
from reference_impl.state_dict_utils import (
    CompanionMismatch,
    UnsupportedValue,
    broadcast_state_dict,
    check_state_dict_similarity,
    copy_state_dict,
    create_cpu_state_dict,
    distribute_state_dict,
    flatten_state_dict,
    format_path,
    gather_state_dict,
    identity,
    iterate_state_dict,
    offload_state_dict_to_cpu,
    set_element,
    traverse_state_dict,
    unflatten_state_dict,
)

__all__ = [
    "CompanionMismatch",
    "FlatLayout",
    "FlatParamShard",
    "IncompatibleKeys",
    "ParamSlice",
    "Segment",
    "StateDictOptions",
    "UnsupportedValue",
    "broadcast_state_dict",
    "check_state_dict_similarity",
    "copy_state_dict",
    "create_cpu_state_dict",
    "distribute_state_dict",
    "ensure_optimizer_state",
    "flat_layout",
    "flat_param_shards",
    "flatten_optimizer_state_dict",
    "flatten_state_dict",
    "format_path",
    "fsdp_load_state_dict",
    "fsdp_optim_state_dict",
    "fsdp_optim_state_dict_to_load",
    "fsdp_rekey_optim_state_dict",
    "fsdp_state_dict",
    "gather_state_dict",
    "get_model_state_dict",
    "get_optimizer_state_dict",
    "get_state_dict",
    "identity",
    "iterate_state_dict",
    "local_piece",
    "offload_state_dict_to_cpu",
    "set_element",
    "set_model_state_dict",
    "set_optimizer_state_dict",
    "set_state_dict",
    "split_optimizer_state_dict",
    "traverse_state_dict",
    "unflatten_optimizer_state_dict",
    "unflatten_state_dict",
]
