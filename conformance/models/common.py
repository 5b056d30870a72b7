"""Small deterministic models and training steps shared by the conformance tests."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from conformance._upstream import dtensor, tensor_parallel
from conformance.compare import held_part, holds
from conformance.models.optimizers import adam

SEED = 1234
VOCAB = 11

# The name segments FSDP1, activation-checkpoint and ``torch.compile`` wrappers add. DDP's
# ``module`` is not among them: a model may own a submodule of that name, so callers unwrap
# DDP themselves. Written here apart from the oracle's own naming, which is under test.
WRAPPER_SEGMENTS = frozenset({"_fsdp_wrapped_module", "_checkpoint_wrapped_module", "_orig_mod"})


def unwrapped_name(name: str) -> str:
    """A ``named_parameters``/``named_modules`` name without ``WRAPPER_SEGMENTS``."""
    return ".".join(part for part in name.split(".") if part not in WRAPPER_SEGMENTS)


class MLPWithBuffers(nn.Module):
    """Two linear layers, a persistent buffer and a non-persistent one.

    Sizes (7 → 10 → 5) do not divide by 2 or 4, so every sharding is uneven;
    benchmarks scale the hidden width.
    """

    units = ("fc1", "fc2")  # the submodules a nested wrapping wraps on their own
    # What each pipeline stage holds, in order (conformance/cells/_pipeline.py): fc1 and the scale
    # applied to its output, then fc2. The non-persistent buffer stays on every stage.
    stages = (("fc1", "running_scale"), ("fc2",))

    def __init__(self, hidden: int = 10) -> None:
        super().__init__()
        self.fc1 = nn.Linear(7, hidden)
        self.fc2 = nn.Linear(hidden, 5)
        self.register_buffer("running_scale", torch.linspace(0.5, 1.5, hidden))
        self.register_buffer("scratch", torch.zeros(3), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.stage_forward(1, self.stage_forward(0, x))

    def stage_forward(self, stage: int, x: torch.Tensor) -> torch.Tensor:
        """Pipeline stage ``stage`` of ``forward``: what ``stages[stage]`` computes."""
        if stage == 0:
            return torch.relu(self.fc1(x)) * self.running_scale
        return self.fc2(x)

    def reset_parameters(self) -> None:
        """The buffers' initial values again: what FSDP1 calls on a module it materializes
        from the meta device (the layers reset their own parameters)."""
        with torch.no_grad():
            self.running_scale.copy_(torch.linspace(0.5, 1.5, self.running_scale.numel()))
            self.scratch.zero_()

    def tp_plan(self) -> dict[str, Any]:
        """fc1 column-wise, fc2 row-wise, the activations between them replicated."""

        return {
            "fc1": tensor_parallel.ColwiseParallel(output_layouts=dtensor.Replicate()),
            "fc2": tensor_parallel.RowwiseParallel(input_layouts=dtensor.Replicate()),
        }


def seeded_mlp() -> MLPWithBuffers:
    """The same initial weights on every rank and in the single-process ground truth."""
    torch.manual_seed(SEED)
    return MLPWithBuffers()


def batch(step: int) -> torch.Tensor:
    """The same input on every rank: gradients average to the single-process ones."""
    generator = torch.Generator().manual_seed(SEED + step)
    return torch.randn(8, 7, generator=generator)


def computed_on(model: nn.Module) -> torch.device:
    """The device ``model`` computes on: its parameters' (a sharded parameter's local part's)."""
    return next(model.parameters()).device


def train(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    steps: int,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
    *,
    start: int = 0,
    inputs: Callable[[int], torch.Tensor] = batch,
) -> None:
    """``steps`` training steps on ``inputs(start), inputs(start + 1), ...``: resuming after
    a load at ``start`` trains on what an uninterrupted run would. Inputs go to the device of
    the model's parameters (a CUDA device under NCCL)."""
    device = computed_on(model)
    for step in range(start, start + steps):
        optimizer.zero_grad()
        model(inputs(step).to(device)).pow(2).mean().backward()
        optimizer.step()
        if scheduler is not None:
            scheduler.step()


class TiedEmbedding(nn.Module):
    """An embedding whose weight the output head shares (one parameter, two FQNs).

    No nested units: FSDP needs both users of a shared parameter in one unit.
    """

    units: tuple[str, ...] = ()

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 6)
        self.head = nn.Linear(6, VOCAB, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.embed(tokens)))


def seeded_tied() -> TiedEmbedding:
    torch.manual_seed(SEED)
    return TiedEmbedding()


def tokens(step: int) -> torch.Tensor:
    """The same token batch on every rank, for the models that embed tokens."""
    generator = torch.Generator().manual_seed(SEED + step)
    return torch.randint(0, VOCAB, (4, 5), generator=generator)


@dataclass(frozen=True)
class GroundTruth:
    """The single-process model after training: its state dict and FQN-keyed optimizer state."""

    model: dict[str, torch.Tensor]
    optimizer_state: dict[str, dict[str, Any]]
    param_groups: list[dict[str, Any]]  # hyper-parameters, with FQN lists as "params"

    def held_by(self, model: nn.Module) -> GroundTruth:
        """What ``model`` holds of this state: all of it, or its pipeline stage's part (the
        stage's keys, its parameters' state, each param group's names of them)."""
        held = holds(model)
        return GroundTruth(
            model=held_part(self.model, model),
            optimizer_state=held_part(self.optimizer_state, model),
            param_groups=[
                {**group, "params": [name for name in group["params"] if held(name)]}
                for group in self.param_groups
            ],
        )

    @classmethod
    def of(cls, model: nn.Module, optimizer: torch.optim.Optimizer) -> GroundTruth:
        """The state of a model trained in one process, on the CPU."""
        names = {param: name for name, param in model.named_parameters()}
        return cls(
            model={key: _on_cpu(value) for key, value in model.state_dict().items()},
            optimizer_state={
                names[p]: {key: _on_cpu(value) for key, value in values.items()}
                for p, values in optimizer.state.items()
            },
            param_groups=[
                {**g, "params": [names[p] for p in g["params"]]} for g in optimizer.param_groups
            ],
        )

    @property
    def flattened_optimizer_state_dict(self) -> dict[str, Any]:
        """The optimizer state as ``flatten_optimizer_state_dict`` gives it, one key per value:
        ``state.<fqn>.<entry>``, and ``param_groups.<fqn>.<hyper-parameter>`` for each
        parameter of each group."""
        flat = {
            f"state.{fqn}.{entry}": value
            for fqn, entries in self.optimizer_state.items()
            for entry, value in entries.items()
        }
        for group in self.param_groups:
            for fqn in group["params"]:
                flat.update(
                    {f"param_groups.{fqn}.{k}": v for k, v in group.items() if k != "params"}
                )
        return flat

    @property
    def optimizer_state_dict(self) -> dict[str, Any]:
        """The full optimizer state dict, FQN-keyed, as ``set_optimizer_state_dict`` takes it."""
        return {"state": self.optimizer_state, "param_groups": self.param_groups}


def ground_truth(
    steps: int,
    recipe: Any = None,
    *,
    device: torch.device | str,
    build: Callable[[], nn.Module] = seeded_mlp,
    inputs: Callable[[int], torch.Tensor] = batch,
) -> GroundTruth:
    """Train ``build()`` alone with ``recipe`` (default: Adam, lr 0.01) for ``steps`` on
    ``device``; the state comes back on the CPU.

    ``device`` is the world's: kernels of different device types round differently (on an
    H200, Adam's update of ``fc1.weight`` differs from the CPU's by an ulp within two steps),
    so a cell equals one process bit for bit only when both compute on the same kind of
    device."""
    model = build().to(device)
    if recipe is None:
        optimizer: torch.optim.Optimizer = adam(model)
        scheduler = None
    else:
        optimizer, scheduler = recipe.build(model)
    train(model, optimizer, steps, scheduler, inputs=inputs)
    return GroundTruth.of(model, optimizer)


def _on_cpu(value: Any) -> Any:
    """``value`` moved to the CPU if it is a tensor (extra state, for one, need not be)."""
    return value.cpu() if isinstance(value, torch.Tensor) else value
