"""One process's state-dict work with no process group, for ``test_process_groups.py``.

``python -m conformance.checks._without_a_process_group OUT`` trains the seeded MLP two steps
with Adam in a process that never initializes ``torch.distributed``, then writes to ``OUT``:

- ``raw.pt``: ``model.state_dict()`` and ``optimizer.state_dict()``, to rebuild the run;
- ``got.pt``: ``get_state_dict(model, optimizer)``;
- ``got_full.pt``: ``get_model_state_dict`` with ``full_state_dict`` and ``cpu_offload``;
- ``got_after_own_set.pt``: ``get_state_dict`` after ``set_optimizer_state_dict`` was given
  the optimizer's own ``state_dict()`` (keyed by parameter ids);
- ``got_after_set.pt``: the same read from fresh objects ``set_state_dict`` loaded it into;
- ``loaded.pt``: ``got.pt``'s state saved by ``dcp.save`` into ``OUT/dcp`` and read back by
  ``dcp.load`` into a fresh model's and optimizer's state dicts;
- ``initialized.pt``: whether ``torch.distributed`` was initialized at any of these steps.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist

from conformance._upstream import dcp, dsd
from conformance.models.common import seeded_mlp, train
from conformance.models.optimizers import adam

STEPS = 2


def main(out: Path) -> None:
    torch.set_num_threads(1)
    initialized = [dist.is_initialized()]
    model = seeded_mlp()
    optimizer = adam(model)
    train(model, optimizer, STEPS)
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, out / "raw.pt")
    got = dsd.get_state_dict(model, optimizer)
    torch.save(got, out / "got.pt")
    whole = dsd.StateDictOptions(full_state_dict=True, cpu_offload=True)
    torch.save(dsd.get_model_state_dict(model, options=whole), out / "got_full.pt")
    dsd.set_optimizer_state_dict(model, optimizer, optimizer.state_dict())  # keyed by id
    torch.save(dsd.get_state_dict(model, optimizer), out / "got_after_own_set.pt")

    fresh = seeded_mlp()
    fresh_optimizer = adam(fresh)
    dsd.set_state_dict(fresh, fresh_optimizer, model_state_dict=got[0], optim_state_dict=got[1])
    torch.save(dsd.get_state_dict(fresh, fresh_optimizer), out / "got_after_set.pt")
    initialized.append(dist.is_initialized())

    dcp.save({"model": got[0], "optimizer": got[1]}, checkpoint_id=str(out / "dcp"))
    template = seeded_mlp()
    template_optimizer = adam(template)
    train(template, template_optimizer, 1, start=STEPS)  # optimizer state to load into
    model_state, optimizer_state = dsd.get_state_dict(template, template_optimizer)
    target = {"model": model_state, "optimizer": optimizer_state}
    dcp.load(target, checkpoint_id=str(out / "dcp"))
    torch.save((target["model"], target["optimizer"]), out / "loaded.pt")
    initialized.append(dist.is_initialized())
    torch.save(initialized, out / "initialized.pt")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
