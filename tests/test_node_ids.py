"""Node ids of the suite are read in one module, ``ci.gate.node_ids``."""

from __future__ import annotations

import pytest

from ci.gate import node_ids

WORLD_ID = "conformance/checks/test_x.py::test_y[w4-ddp-adam]"
PLAIN_ID = "tests/test_z.py::test_plain"


def test_a_world_id_names_its_file_module_function_parameters_and_size() -> None:
    assert node_ids.path_of(WORLD_ID) == "conformance/checks/test_x.py"
    assert node_ids.module_of(WORLD_ID) == "test_x"
    assert node_ids.function_of(WORLD_ID) == "conformance/checks/test_x.py::test_y"
    assert node_ids.params_of(WORLD_ID) == ["w4", "ddp", "adam"]
    assert node_ids.world_size_in(WORLD_ID) == 4
    assert node_ids.world_size_of(WORLD_ID) == 4


def test_an_id_of_no_world_runs_at_size_one_and_has_no_parameters() -> None:
    assert node_ids.params_of(PLAIN_ID) == []
    assert node_ids.world_size_in(PLAIN_ID) is None
    assert node_ids.world_size_of(PLAIN_ID) == 1
    assert node_ids.function_of(PLAIN_ID) == PLAIN_ID


def test_ids_are_kept_at_the_gates_world_sizes_in_their_order() -> None:
    two = "conformance/checks/test_x.py::test_y[w2-ddp]"
    ids = [WORLD_ID, PLAIN_ID, two]
    assert node_ids.at_world_sizes(ids, "1,2") == [PLAIN_ID, two]
    assert node_ids.at_world_sizes(ids, "4") == [WORLD_ID]


@pytest.mark.parametrize(
    ("nodeid", "size"),
    [("a.py::t[w12-x]", 12), ("a.py::t[x-w2]", None), ("a.py::t[w2]", 2), ("a.py::t[2]", None)],
)
def test_the_world_size_is_the_first_parameter_of_the_form_w_n(nodeid, size) -> None:
    assert node_ids.world_size_in(nodeid) == size


def test_an_id_names_its_test_and_the_parallelisms_among_its_parameters() -> None:
    assert node_ids.name_of(WORLD_ID) == "test_y[w4-ddp-adam]"
    assert node_ids.name_of(PLAIN_ID) == "test_plain"
    assert node_ids.parallelisms_of(WORLD_ID, ["fsdp2", "ddp"]) == ["ddp"]
    assert node_ids.parallelisms_of(PLAIN_ID, ["ddp"]) == []
