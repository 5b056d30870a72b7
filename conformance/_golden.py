"""Golden checkpoints: sets of checkpoints a torch release wrote, and the record each is held to.

A set lives in a directory named by the release that wrote it (``conformance/golden/2.13.0``,
or any directory of sets named by ``GATE_GOLDEN_SETS``) and holds ``record.json``: the
release, torch's version and git hash, the suite's commit, the signature of the machine that
wrote it (``harness.machine``), and for every checkpoint its files' hashes and every value it
holds: for each key path the dtype, shape, hash of the bytes and first values of a tensor, or
the value itself. ``python -m ci.gate.golden`` writes a set;
``conformance/checks/test_golden_checkpoints.py`` loads every set into the build under test and
holds each loaded value to the record, bit for bit. What one process computed after the
checkpoint (its trajectory) is kept whole beside the record (``TRAJECTORY``), so that
another machine can hold its own steps to it within a tolerance (``conformance.compare._computed``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from packaging.version import Version

from conformance._upstream import dcp_formats, dsd, full_options
from conformance.compare import every_rank, holds_a_part
from harness.machine import MachineSignature

GOLDEN_DIR = Path(__file__).parent / "golden"
SETS_VARIABLE = "GATE_GOLDEN_SETS"  # a directory of sets to read instead of GOLDEN_DIR
RECORD = "record.json"
# How a set is written: the writer's tests (run by ``python -m ci.gate.golden``) train
# ``RECIPE`` ``STEPS`` steps and write under ``$OUT_VARIABLE``, each leaving its checkpoint's
# entry under ``ENTRIES`` for ``assemble_record``.
WRITER = Path(__file__).parent / "checks" / "_golden_writer.py"
OUT_VARIABLE = "GOLDEN_OUT"
ENTRIES = ".entries"
RECIPE = "adamw_step_lr"
STEPS = 2
FIRST_VALUES = 6  # first values of a tensor kept in the record, shown when one differs
# Beside one process's torch.save state: its state after each step of its trajectory, every
# leaf by key path (``state_leaves``), tensors whole.
TRAJECTORY = "trajectory.pt"
Kind = Literal["dcp", "fsdp1", "single"]


class GoldenError(ValueError):
    """A set that cannot be read: missing, or a record that does not parse."""


@dataclass(frozen=True)
class GoldenCheckpoint:
    """One checkpoint of a set: ``path`` (relative to the set) written by ``cell`` at ``size``
    ranks. ``form``: a DCP checkpoint's saving mode (``sync``/``async``), an FSDP1 state-dict
    kind (``full``/``sharded``/``local``), or ``torch.save`` for one process. ``flattened``:
    its optimizer state was written flattened (``flatten_optimizer_state_dict``)."""

    path: str
    kind: Kind
    cell: str
    size: int
    form: str
    model: str
    flattened: bool
    files: dict[str, str]  # file path under ``path`` -> sha256 of its bytes
    values: dict[str, Any]  # key path -> leaf record (``leaf_records``)

    @classmethod
    def from_json(cls, entry: Mapping[str, Any]) -> GoldenCheckpoint:
        return cls(**{name: entry[name] for name in cls.__dataclass_fields__})


@dataclass(frozen=True)
class GoldenSet:
    """A release's set: where it lies, who wrote it, its checkpoints, and what it skipped."""

    release: str
    directory: Path
    torch_version: str
    torch_git: str
    suite_commit: str
    written: str  # the date it was written
    device: str  # the device type its worlds trained on: its trajectory holds there alone
    # Where its single process computed its trajectory; None in a set without one (written
    # before sets kept trajectories, or whose single-process writer did not run).
    machine: MachineSignature | None
    recipe: str
    steps: int  # the steps trained before every checkpoint
    checkpoints: tuple[GoldenCheckpoint, ...]
    skipped: dict[str, str] = field(default_factory=dict)  # writer test id -> why
    failed: dict[str, str] = field(default_factory=dict)  # writer test id -> its error

    def of_kind(self, kind: Kind) -> list[GoldenCheckpoint]:
        return [checkpoint for checkpoint in self.checkpoints if checkpoint.kind == kind]

    def single(self, model: str) -> GoldenCheckpoint:
        """The one-process ``torch.save`` checkpoint of the zoo's ``model``."""
        for checkpoint in self.of_kind("single"):
            if checkpoint.model == model:
                return checkpoint
        raise GoldenError(f"the set of {self.release} holds no single-process {model} state")

    def trajectory(self, model: str) -> list[dict[str, Any]]:
        """One process's whole state after each step of ``model``'s trajectory, by key path
        (``TRAJECTORY`` beside its ``torch.save`` state), refused where its bytes are not the
        ones the record names."""
        checkpoint = self.single(model)
        path = self.directory / checkpoint.path / TRAJECTORY
        if not path.is_file() or file_hash(path) != checkpoint.files.get(TRAJECTORY):
            raise GoldenError(f"{path}: missing, or its bytes differ from the record")
        leaves: list[dict[str, Any]] = torch.load(path, weights_only=True)
        return leaves

    def disagreements(self) -> list[str]:
        """Every file of the set that is missing, changed or not in the record."""
        found: list[str] = []
        recorded = {RECORD}
        for checkpoint in self.checkpoints:
            for name, digest in checkpoint.files.items():
                relative = f"{checkpoint.path}/{name}"
                recorded.add(relative)
                file = self.directory / relative
                if not file.is_file():
                    found.append(f"{self.release}/{relative}: missing")
                elif file_hash(file) != digest:
                    found.append(f"{self.release}/{relative}: its bytes differ from the record")
        for file in sorted(self.directory.rglob("*")):
            relative = file.relative_to(self.directory).as_posix()
            if file.is_file() and relative not in recorded:
                found.append(f"{self.release}/{relative}: not in the record")
        return found


def sets_root() -> Path:
    """The directory of sets the gate reads: ``GATE_GOLDEN_SETS``, else the committed ones."""
    chosen = os.environ.get(SETS_VARIABLE)
    return Path(chosen) if chosen else GOLDEN_DIR


def recorded_releases(root: Path | None = None) -> list[str]:
    """The releases with a set under ``root`` (default ``sets_root()``), oldest first."""
    root = sets_root() if root is None else root
    if not root.is_dir():
        return []
    found = [entry.name for entry in root.iterdir() if (entry / RECORD).is_file()]
    return sorted(found, key=Version)


def releases_to_load() -> list[str]:
    """The releases whose sets the gate loads: refused where ``GATE_GOLDEN_SETS`` names a
    directory holding none (a path mistyped would otherwise load nothing, and pass)."""
    releases = recorded_releases()
    chosen = os.environ.get(SETS_VARIABLE)
    if chosen and not releases:
        raise GoldenError(
            f"{SETS_VARIABLE}={chosen} holds no golden set (<release>/{RECORD}, written by "
            "python -m ci.gate.golden)"
        )
    return releases


def golden_set(release: str, root: Path | None = None) -> GoldenSet:
    """The set ``release`` wrote, under ``root`` (default ``sets_root()``)."""
    root = sets_root() if root is None else root
    record = root / release / RECORD
    if not record.is_file():
        known = ", ".join(recorded_releases(root)) or "none"
        raise GoldenError(f"no golden set of torch {release} under {root} (sets: {known})")
    try:
        data = json.loads(record.read_text())
        return GoldenSet(
            release=data["release"],
            directory=record.parent,
            torch_version=data["torch_version"],
            torch_git=data["torch_git"],
            suite_commit=data["suite_commit"],
            written=data["written"],
            device=data["device"],
            machine=MachineSignature.from_json(data["machine"]) if data.get("machine") else None,
            recipe=data["recipe"],
            steps=data["steps"],
            checkpoints=tuple(GoldenCheckpoint.from_json(e) for e in data["checkpoints"]),
            skipped=data.get("skipped", {}),
            failed=data.get("failed", {}),
        )
    except (KeyError, TypeError, ValueError) as error:
        raise GoldenError(f"{record}: not a golden record ({error!r})") from error


def file_hash(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def read_dcp(path: Path) -> dict[str, Any]:
    """A DCP checkpoint's whole state, read in this one process (``dcp_to_torch_save``)."""
    with tempfile.TemporaryDirectory() as scratch:
        whole = Path(scratch) / "whole.pt"
        dcp_formats.dcp_to_torch_save(path, whole)
        state: dict[str, Any] = torch.load(whole, weights_only=False)
        return state


def assemble_record(target: Path, **about: Any) -> dict[str, Any]:
    """The record of the set the writer left under ``target``: every entry its ranks left,
    each with its files' hashes, ``about`` the set (who wrote it, what it skipped), and the
    signature of the machine that computed the single process's trajectories. A DCP
    checkpoint's values are read back from its files: a writer whose full state dict of a
    cell is wrong (a gather bug of its release) still records what it saved."""
    checkpoints = []
    machine = None
    for entry_file in sorted((target / ENTRIES).glob("*.json")):
        entry = json.loads(entry_file.read_text())
        machine = entry.pop("machine", machine)
        written = target / entry["path"]
        if entry["kind"] == "dcp":  # what the files hold, not the writer's view of its model
            entry["values"] = leaf_records(read_dcp(written))
        entry["files"] = {
            file.relative_to(written).as_posix(): file_hash(file)
            for file in sorted(written.rglob("*"))
            if file.is_file()
        }
        checkpoints.append(entry)
    return {
        "release": target.name,
        "recipe": RECIPE,
        "steps": STEPS,
        "checkpoints": checkpoints,
        "machine": machine,
        **about,
    }


def state_leaves(tree: Any, path: str = "") -> dict[str, Any]:
    """A state dict's leaves by key path (``a.b`` for mappings, ``a[0]`` for sequences, a tuple
    and a list alike; an empty sequence is a leaf of its own)."""
    if isinstance(tree, Mapping):
        leaves: dict[str, Any] = {}
        for key, value in tree.items():
            leaves.update(state_leaves(value, f"{path}.{key}" if path else str(key)))
        return leaves
    if isinstance(tree, (list, tuple)):
        leaves = {}
        for index, value in enumerate(tree):
            leaves.update(state_leaves(value, f"{path}[{index}]"))
        return leaves or {path: []}
    return {path: tree}


def leaf_records(tree: Any) -> dict[str, Any]:
    """A state dict's leaves by key path (``state_leaves``): a tensor as its dtype, shape, the
    hash of its bytes and its first values; any other value as itself, made JSON (``repr``
    where JSON has no form)."""
    return {path: _record(leaf) for path, leaf in state_leaves(tree).items()}


def _record(leaf: Any) -> Any:
    if isinstance(leaf, torch.Tensor):
        local = leaf.detach().cpu().contiguous()
        digest = hashlib.sha256(local.reshape(-1).view(torch.uint8).numpy().tobytes())
        digest.update(f"{local.dtype}{list(local.shape)}".encode())
        return {
            "dtype": str(local.dtype),
            "shape": list(local.shape),
            "sha256": digest.hexdigest(),
            "first": local.reshape(-1)[:FIRST_VALUES].tolist(),
        }
    if leaf is None or isinstance(leaf, (bool, int, float, str, list)):  # a list is empty
        return leaf
    return repr(leaf)


def _shown(leaf: Any) -> str:
    if _is_tensor(leaf):
        return f"{leaf['dtype']} {leaf['shape']} starting {leaf['first']}"
    return repr(leaf)


def _is_tensor(leaf: Any) -> bool:
    return isinstance(leaf, dict) and "sha256" in leaf


def leaf_name(key: str) -> str:
    """The last name of a key path: ``optim.param_groups[0].lr`` -> ``lr``."""
    return re.sub(r"\[\d+\]$", "", key).rsplit(".", 1)[-1]


def value_differences(
    loaded: dict[str, Any],
    recorded: dict[str, Any],
    *,
    whole: bool,
    known: set[str] | None = None,
    limit: int = 3,
) -> list[str]:
    """Where leaf records of a loaded state differ from the record: each key with both values
    (the first ``limit``). ``whole``: the loader holds every recorded key (else only those it
    holds are compared). Between releases the non-tensor state of optimizers and schedulers
    changes: a value the record lacks is no difference (a later release adds its defaults to
    the groups it loads), nor is a recorded one absent after the load whose name the reader's
    own state never has (``known``: the names it has; an earlier release knows fewer). A tensor
    either way differs."""
    keys = sorted(set(loaded) | set(recorded)) if whole else sorted(loaded)
    found = []
    for key in keys:
        if key not in loaded:
            if _is_tensor(recorded[key]) or known is None or leaf_name(key) in known:
                found.append(f"{key}: absent after the load, recorded {_shown(recorded[key])}")
        elif key not in recorded:
            if _is_tensor(loaded[key]):
                found.append(f"{key}: loaded {_shown(loaded[key])}, not in the record")
        elif loaded[key] != recorded[key]:
            found.append(f"{key}: loaded {_shown(loaded[key])}, recorded {_shown(recorded[key])}")
    return found[:limit]


def full_state(model: Any, optimizer: Any, scheduler: Any, *, flatten: bool) -> dict[str, Any]:
    """The full model, optimizer and scheduler state as ``get_state_dict`` gives them, the
    optimizer's flattened where ``flatten`` says. Collective."""
    options = full_options(flatten_optimizer_state_dict=True) if flatten else full_options()
    model_state, optim_state = dsd.get_state_dict(model, optimizer, options=options)
    return {"model": model_state, "optim": optim_state, "scheduler": scheduler.state_dict()}


def full_state_leaves(
    model: Any, optimizer: Any, scheduler: Any, *, flatten: bool
) -> dict[str, Any]:
    """The leaf records (``leaf_records``) of ``full_state``; where each rank holds a part of
    the model, the union of every rank's. Collective."""
    leaves = leaf_records(full_state(model, optimizer, scheduler, flatten=flatten))
    if not holds_a_part(model):
        return leaves
    merged: dict[str, Any] = {}
    for part in every_rank(leaves):
        merged |= part
    return merged
