"""The public surface stays as documented: users import from the packages, not their internals."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from types import ModuleType

import harness
import reference_impl


def assert_documented(package: ModuleType) -> None:
    for name in package.__all__:
        assert getattr(package, name).__doc__, f"{package.__name__}.{name} has no docstring"


def test_harness_public_names() -> None:
    assert sorted(harness.__all__) == [
        "ForkServers",
        "TestRequest",
        "World",
        "WorldContext",
        "WorldOutcome",
        "WorldPool",
        "WorldSettings",
        "WorldSpec",
        "WorldStartError",
        "import_preloads",
        "launched_by_torchrun",
    ]
    assert_documented(harness)


def test_reference_impl_public_names() -> None:
    assert sorted(reference_impl.__all__) == [
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
    assert_documented(reference_impl)


FORBIDDEN = {
    "torch.distributed._state_dict_utils",
    "torch.distributed.checkpoint.state_dict",
    "torch.distributed.fsdp._optim_utils",
    "torch.distributed.fsdp._state_dict_utils",
}


def imported_modules(source: str) -> set[str]:
    """Every module an import statement names, including ``from package import module``."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def test_the_import_check_sees_both_import_forms() -> None:
    assert "torch.distributed._state_dict_utils" in imported_modules(
        "from torch.distributed import _state_dict_utils"
    )
    assert "torch.distributed.fsdp._optim_utils" in imported_modules(
        "import torch.distributed.fsdp._optim_utils as o"
    )


def test_oracle_never_imports_the_upstream_modules_it_models() -> None:
    for source in Path(reference_impl.__file__).parent.glob("*.py"):
        imported = imported_modules(source.read_text())
        assert not imported & FORBIDDEN, f"{source.name} imports {sorted(imported & FORBIDDEN)}"


def test_conformance_public_names() -> None:
    import conformance

    assert sorted(conformance.__all__) == [
        "EXERCISED_APIS",
        "MLPWithBuffers",
        "PARALLELISMS",
        "PEAK_LOG",
        "Parallelism",
        "UPSTREAM_MANIFEST",
        "batch",
        "dcp",
        "dsd",
        "golden",
        "judges_staleness",
        "lookup",
        "resolution",
        "sdu",
    ]


def test_divergences_public_names() -> None:
    """The records of known divergences, their format and their resolution."""
    import conformance.divergences as divergences

    assert sorted(divergences.__all__) == [
        "Divergence",
        "Holding",
        "Known",
        "Manifest",
        "ManifestError",
        "Resolution",
        "Showing",
        "UNSAFE",
        "Unsafe",
        "fit_range",
        "id_matches",
        "load",
        "release_of",
        "resolve",
        "to_toml",
    ]
    for name in divergences.__all__:
        value = getattr(divergences, name)
        if inspect.isclass(value) or inspect.isfunction(value):
            assert value.__doc__, f"conformance.divergences.{name} has no docstring"


def test_ci_uses_only_the_public_surface_of_the_suite() -> None:
    """``ci`` imports ``conformance`` and ``harness`` from the packages (``harness.session``,
    ``harness.outcomes``, ``harness.devices``, ``harness.machine``, ``harness.memory``,
    ``harness.coverage`` and
    ``conformance.divergences`` are public modules), never their private modules."""
    ci_root = Path(__file__).resolve().parents[1] / "ci"
    for source in ci_root.rglob("*.py"):
        private = sorted(
            name
            for name in imported_modules(source.read_text())
            if name.split(".")[0] in ("conformance", "harness")
            and any(part.startswith("_") for part in name.split(".")[1:2])
        )
        assert not private, f"{source.relative_to(ci_root.parent)} imports {private}"
