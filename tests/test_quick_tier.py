"""The tiers: computed from the coverage map, the mutation report and the recorded durations,
fresh against the suite and the catalogue, and run by the gate and the mutation runner."""

from __future__ import annotations

import argparse
import json

import pytest

from ci.gate import cli, tier
from ci.gate.coverage.cover import Executed
from ci.gate.node_ids import world_size_of
from ci.mutation.cli import quick_tier_for
from ci.mutation.mutants import catalogue

FAMILIES = {  # each cell's family, as descriptors name them
    "ddp": "ddp",
    "fsdp1_full_shard_orig": "fsdp1",
    "fsdp2": "fsdp2",
    "fsdp2_tp": "2-D",
    "pp": "pp",
    "tp": "tp",
}
CHECK_FAMILIES = {
    "observing": ("test_observing_is_free",),
    "other": ("test_a", "test_b", "test_c"),
}


@pytest.mark.slow
def test_the_committed_tiers_are_fresh() -> None:
    for name, text in tier.fresh_texts(tier.collected_ids()).items():
        assert tier.TIER_FILES[name].read_text() == text, (
            f"{tier.TIER_FILES[name]} is stale: python -m ci.gate.tier"
        )


def test_the_families_tier_holds_the_quick_tier() -> None:
    assert set(tier.tier_ids("quick")) <= set(tier.tier_ids("families"))


def test_the_tier_holds_a_killer_of_every_mutant_of_the_catalogue() -> None:
    """A mutant the report lacks (added since the last mutation run) has no killer to keep."""
    killers = tier.killers_of(tier.MUTATION_REPORT)
    quick = set(tier.tier_ids("quick"))
    for name, mutant in catalogue().items():
        if mutant.equivalent:
            continue
        assert name in killers, f"the mutation report lacks {name}: rerun python -m ci.mutation"
        assert killers[name] in quick, f"{name}'s killer {killers[name]} is not in the tier"


def _ids() -> list[str]:
    return [
        "conformance/checks/test_a.py::t[w2-ddp]",
        "conformance/checks/test_a.py::t[w4-ddp]",
        "conformance/checks/test_a.py::slow[w2-fsdp2]",
        "conformance/checks/test_b.py::t[w1]",
        "conformance/checks/test_b.py::u[w2]",
        "conformance/checks/test_observing_is_free.py::o[w2-fsdp1_full_shard_orig]",
        "conformance/checks/test_observing_is_free.py::o[w4-fsdp1_full_shard_orig]",
        "conformance/checks/test_observing_is_free.py::cheap[w4-fsdp2_tp]",
        "conformance/checks/test_observing_is_free.py::o[w2-tp]",
        "conformance/checks/test_c.py::t[w2-pp]",
    ]


DURATIONS = {
    "conformance/checks/test_a.py::t[w2]": 1.0,
    "conformance/checks/test_a.py::t[w4]": 2.0,
    "conformance/checks/test_a.py::slow[w2]": 9.0,
    "conformance/checks/test_b.py::t[w1]": 2.0,
    "conformance/checks/test_b.py::u[w2]": 0.5,
    "conformance/checks/test_observing_is_free.py::o[w2]": 3.0,
    "conformance/checks/test_observing_is_free.py::o[w4]": 3.0,
    "conformance/checks/test_observing_is_free.py::cheap[w4]": 0.1,
    "conformance/checks/test_c.py::t[w2]": 1.0,
}
EXECUTED = {  # what each id executes, as blocks of one arc each
    "conformance/checks/test_a.py::t[w2-ddp]": {0},
    "conformance/checks/test_a.py::t[w4-ddp]": {0, 1},
    "conformance/checks/test_a.py::slow[w2-fsdp2]": {2},
    "conformance/checks/test_b.py::t[w1]": {3},
    "conformance/checks/test_b.py::u[w2]": {3, 4},
    "conformance/checks/test_observing_is_free.py::o[w2-fsdp1_full_shard_orig]": {5},
    "conformance/checks/test_observing_is_free.py::o[w4-fsdp1_full_shard_orig]": {5, 6},
    "conformance/checks/test_observing_is_free.py::o[w2-tp]": {5},
}


def _inputs(killers: dict[str, str]) -> tier.Inputs:
    return tier.Inputs(
        ids=_ids(),
        killers=killers,
        durations=DURATIONS,
        cell_families=FAMILIES,
        check_families=CHECK_FAMILIES,
        executed=Executed({k: frozenset(v) for k, v in EXECUTED.items()}, weights=(1,) * 7),
    )


def test_the_tier_keeps_every_killer_then_covers_the_gates_arcs_then_the_cheapest_it_lacks() -> (
    None
):
    killers = {"m1": "conformance/checks/test_a.py::t[w4-ddp]"}
    assert tier.select(_inputs(killers)) == [
        "conformance/checks/test_a.py::slow[w2-fsdp2]",  # the only one to execute arc 2
        "conformance/checks/test_a.py::t[w4-ddp]",  # the killer, whose arcs cover t[w2-ddp]'s
        "conformance/checks/test_b.py::u[w2]",  # arcs 3 and 4: more per second than t[w1]
        "conformance/checks/test_c.py::t[w2-pp]",  # executes nothing: its module and cell
        # executes nothing: the cheapest of its cell and of (observing, 2-D)
        "conformance/checks/test_observing_is_free.py::cheap[w4-fsdp2_tp]",
        # its arc is executed by o[w4-fsdp1...]; kept as the cheapest of its cell
        "conformance/checks/test_observing_is_free.py::o[w2-tp]",
        # arcs 5 and 6 in one id
        "conformance/checks/test_observing_is_free.py::o[w4-fsdp1_full_shard_orig]",
    ]


def test_an_arc_the_tier_already_executes_adds_no_id_of_its_pair() -> None:
    """The cover is of the whole gate's arcs: a second id of another pair that executes only
    what the tier executes adds nothing, unless its cell or pair has no id yet."""
    inputs = _inputs({})
    inputs.ids.append("conformance/checks/test_b.py::again[w2-ddp]")
    executed = dict(inputs.executed.elements)
    executed["conformance/checks/test_b.py::again[w2-ddp]"] = frozenset({3})
    inputs = tier.Inputs(
        ids=inputs.ids,
        killers={},
        durations={**DURATIONS, "conformance/checks/test_b.py::again[w2]": 1.0},
        cell_families=FAMILIES,
        check_families=CHECK_FAMILIES,
        executed=Executed(executed, weights=(1,) * 7),
    )
    chosen = tier.select(inputs)
    assert "conformance/checks/test_b.py::u[w2]" in chosen  # arcs 3 and 4
    assert "conformance/checks/test_b.py::again[w2-ddp]" not in chosen  # (other, ddp) has t[w2]


def test_the_families_tier_executes_each_pairs_arcs_within_the_pair_by_no_dear_id() -> None:
    """``again`` executes, for (other, ddp), an arc the quick tier executes only outside that
    pair; ``dear`` alone executes another there, and costs more than the cap."""
    again = "conformance/checks/test_b.py::again[w2-ddp]"
    dear = "conformance/checks/test_b.py::dear[w2-ddp]"
    executed = {**EXECUTED, again: {3}, dear: {5}}
    inputs = tier.Inputs(
        ids=[*_ids(), again, dear],
        killers={},
        durations={
            **DURATIONS,
            "conformance/checks/test_b.py::again[w2]": 1.0,
            "conformance/checks/test_b.py::dear[w2]": tier.PAIR_COVER_CAP_S + 1,
        },
        cell_families=FAMILIES,
        check_families=CHECK_FAMILIES,
        executed=Executed({k: frozenset(v) for k, v in executed.items()}, weights=(1,) * 7),
    )
    quick = tier.select(inputs)
    assert again not in quick
    assert dear not in quick
    families, left = tier.select_families(inputs, quick)
    assert sorted(set(families) - set(quick)) == [again]
    assert left == 1  # arc 5 in (other, ddp)


def test_a_module_of_no_family_of_checks_is_named() -> None:
    inputs = _inputs({})
    inputs.ids.append("conformance/checks/test_orphan.py::t[w2]")
    with pytest.raises(ValueError, match="test_orphan is in no family"):
        tier.select(inputs)


def test_a_killer_the_suite_no_longer_collects_is_named() -> None:
    gone = {"m9": "conformance/checks/test_gone.py::t[w2]"}
    with pytest.raises(ValueError, match=r"m9 \(conformance/checks/test_gone.py::t\[w2\]\)"):
        tier.select(_inputs(gone))


def test_killers_come_from_killed_and_unverified_mutants(tmp_path) -> None:
    report = tmp_path / "mutation.json"
    entries = [
        {"name": "a", "status": "killed", "killed_by": "t[w2]"},
        {"name": "b", "status": "unverified", "killed_by": "u[w2]"},
        {"name": "c", "status": "equivalent", "killed_by": None},
        {"name": "d", "status": "survived", "killed_by": None},
    ]
    report.write_text(json.dumps(entries))
    assert tier.killers_of(report) == {"a": "t[w2]", "b": "u[w2]"}


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--tier", "quick", "-x"], ("quick", ["-x"])),
        (["-x", "--tier=quick"], ("quick", ["-x"])),
        (["-k", "fsdp2"], (None, ["-k", "fsdp2"])),
    ],
)
def test_the_gate_takes_the_tier_after_the_separator(args, expected) -> None:
    assert cli.option_among("--tier", args) == expected


def _gate_args(*pytest_args: str, sizes: str = "1,2", name: str = "quick") -> argparse.Namespace:
    return cli._parser().parse_args(["--tier", name, "--world-sizes", sizes, "--", *pytest_args])


@pytest.mark.parametrize("name", ["quick", "families"])
def test_a_tier_runs_its_ids_at_the_gates_world_sizes(tmp_path, name) -> None:
    command = cli.pytest_command(_gate_args("-x", name=name), tmp_path)
    tests = [arg for arg in command if arg.startswith("conformance/")]
    expected = [i for i in tier.tier_ids(name) if world_size_of(i) in (1, 2)]
    assert tests == expected
    assert "conformance" not in command
    assert any("[w4-" in nodeid for nodeid in tier.tier_ids(name))
    assert "-x" in command
    named = cli.pytest_command(
        _gate_args("conformance/checks/test_peak_memory.py", name=name), tmp_path
    )
    picked = [arg for arg in named if arg.startswith("conformance/")]
    assert picked
    assert all(arg.startswith("conformance/checks/test_peak_memory.py::") for arg in picked)


def test_the_gate_refuses_an_unknown_tier_after_the_separator(capsys) -> None:
    with pytest.raises(SystemExit):
        cli.main(["--", "--tier", "fast"])
    assert "--tier must be one of whole, quick, families, not 'fast'" in capsys.readouterr().err


def test_a_mutant_runs_the_tier_its_own_modules_first() -> None:
    mutant = catalogue()["gather_ignores_ranks_only"]
    ids = quick_tier_for(mutant, "2,4")
    assert sorted(ids) == sorted(i for i in tier.tier_ids("quick") if world_size_of(i) != 1)
    own = [i for i in ids if i.startswith(mutant.tests)]
    assert own
    assert ids[: len(own)] == own
