"""A cell is one descriptor: a cell registered from outside (a DDP under another name) reaches
every check module that takes cells from descriptors, the golden writer and reader, and the
quick tier; descriptors refuse what they cannot mean."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace

import pytest

from ci.gate import tier
from ci.gate.coverage.cover import Executed
from ci.gate.node_ids import function_of, module_of, params_of
from ci.gate.target import SUITE_ROOT
from conformance.cells import PARALLELISMS, Parallelism, Partner, register
from conformance.checks import FAMILIES

TWIN = "ddp_again"
PLUGIN = f'''
import json, os
from dataclasses import replace
from conformance.cells import PARALLELISMS, families, register

register(replace(PARALLELISMS["ddp"], name="{TWIN}"))


def pytest_collection_finish(session):
    with open(os.environ["CELL_FAMILIES"], "w") as out:
        json.dump(families(), out)
'''
# Checks that name the cells of an upstream case, or load into cells that another cell's
# partners name: a new cell reaches them only if it is named there.
NAMED_CELLS = {
    "test_a_save_over_a_checkpoint_replaces_it_only_where_allowed",
    "test_a_save_over_a_checkpoint_in_a_store_replaces_it_only_where_allowed",
    "test_a_deprecated_selection_warns_and_still_works",
    "test_an_async_checkpoint_of_two_ranks_resumes_at_four_as_one_process",
    "test_broadcast_from_rank0_refuses_a_missing_key_on_every_rank",
    "test_load_at_more_ranks_than_saved",
    "test_the_oracle_refuses_broadcast_state_of_a_parameter_no_rank_holds",
}
NAMED_CELLS_MODULES = {"test_upstream_failures", "test_async_save_failures"}
# A process checkpointer saves in flight on DDP alone: its way to the process is every cell's.
ONE_CELL_ROWS = ("test_async_saves_in_a_row_each_hold_their_own_moment", {"process", "in_flight"})


def _names_its_cells(nodeid: str) -> bool:
    function = function_of(nodeid).rpartition("::")[2]
    one_cell_row = function == ONE_CELL_ROWS[0] and ONE_CELL_ROWS[1] <= set(params_of(nodeid))
    return module_of(nodeid) in NAMED_CELLS_MODULES or function in NAMED_CELLS or one_cell_row


@pytest.fixture(scope="module")
def with_twin(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], dict[str, str]]:
    """The ids collected with the twin registered (the suite's and the golden writer's), and
    every cell's family as the session saw them."""
    root = tmp_path_factory.mktemp("twin")
    (root / "twin_cell.py").write_text(PLUGIN)
    families = root / "families.json"
    env = dict(os.environ, PYTHONPATH=f"{root}{os.pathsep}{SUITE_ROOT}")
    env["CELL_FAMILIES"] = str(families)
    env.pop("PYTEST_ADDOPTS", None)
    ids = []
    for target in ("conformance", "conformance/checks/_golden_writer.py"):
        command = [sys.executable, "-m", "pytest", target, "--collect-only", "-q"]
        command += ["-p", "no:cacheprovider", "-p", "twin_cell", "--world-sizes", "1,2,4"]
        done = subprocess.run(command, cwd=SUITE_ROOT, env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        ids += [line for line in done.stdout.splitlines() if "::" in line]
    return ids, json.loads(families.read_text())


def _as_twin(nodeid: str) -> str | None:
    """The id with its first cell parameter ``ddp`` made the twin; None where ``ddp`` is not
    the first cell (a cell loading what another saved)."""
    params = params_of(nodeid)
    cells = [index for index, param in enumerate(params) if param in PARALLELISMS]
    if not cells or params[cells[0]] != "ddp":
        return None
    params[cells[0]] = TWIN
    return f"{function_of(nodeid)}[{'-'.join(params)}]"


@pytest.mark.slow
def test_the_twin_reaches_every_check_of_ddp(with_twin) -> None:
    ids, _ = with_twin
    collected = set(ids)
    missing = [
        twin
        for nodeid in ids
        if (twin := _as_twin(nodeid)) is not None
        and twin not in collected
        and not _names_its_cells(nodeid)
    ]
    assert missing == []
    reached = {module_of(nodeid) for nodeid in ids if TWIN in params_of(nodeid)}
    of_ddp = {module_of(nodeid) for nodeid in ids if _as_twin(nodeid) in collected}
    assert of_ddp == reached
    for module in ("test_dcp_round_trips", "test_resuming_commutes_with_training"):
        assert module in reached  # as the saver of DDP's partners
    assert {"_golden_writer", "test_golden_checkpoints", "test_async_staging"} <= reached


@pytest.mark.slow
def test_the_twin_is_in_the_tier(with_twin) -> None:
    ids, families = with_twin
    assert families[TWIN] == "ddp"
    inputs = tier.Inputs(ids, {}, {}, families, FAMILIES, Executed({}, ()))
    chosen = tier.select(inputs)
    assert [nodeid for nodeid in chosen if TWIN in params_of(nodeid)]


def test_every_check_module_is_in_one_family_of_checks() -> None:
    checks = SUITE_ROOT / "conformance" / "checks"
    modules = sorted(
        path.stem for path in [*checks.glob("test_*.py"), checks / "_golden_writer.py"]
    )
    placed = sorted(module for members in FAMILIES.values() for module in members)
    assert placed == modules


def test_a_name_is_registered_once() -> None:
    with pytest.raises(ValueError, match="a cell named 'ddp' exists already"):
        register(PARALLELISMS["ddp"])


@pytest.mark.parametrize(
    ("change", "refusal"),
    [
        ({"family": "zero3"}, "family 'zero3' is not one of"),
        ({"roles": frozenset({"gold"})}, r"roles \['gold'\] are not of"),
        ({"sizes": ()}, "world sizes must be positive"),
    ],
)
def test_a_descriptor_refuses_what_it_cannot_mean(change: dict, refusal: str) -> None:
    with pytest.raises(ValueError, match=refusal):
        replace(PARALLELISMS["ddp"], **change)


def test_a_partner_names_the_checks_that_take_it() -> None:
    with pytest.raises(ValueError, match="partner fsdp2: checks"):
        Partner("fsdp2", 2, ("dcp_shrink",))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="partner fsdp2: checks"):
        Partner("fsdp2", 2, ())


def test_every_partner_is_a_cell_at_a_size_it_runs() -> None:
    for cell in PARALLELISMS.values():
        for partner in cell.partners:
            if partner.loaded_by == "single":
                assert partner.size == 1, cell.name
                continue
            loader: Parallelism = PARALLELISMS[partner.loaded_by]
            assert partner.size is None or loader.supports(partner.size), (cell.name, partner)
