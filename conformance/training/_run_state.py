"""A training run's whole state, as recipes keep it: model and optimizer, a learning-rate
schedule, a loss scaler, each rank's random streams and a data loader's position.

A ``Run`` trains the matrix's MLP on a shuffled data set read by torchdata's
``StatefulDataLoader``: each step's input is a batch plus noise drawn from torch's global
generator, its loss scaled by a ``GradScaler`` (FSDP1's ``ShardedGradScaler``), its learning
rate set by a schedule of ``SCHEDULES``. torch's streams are seeded alike on every rank, as
a model's initialisation needs; numpy's and Python's are seeded by rank, as a run seeds
per-rank augmentation, and every step draws from each. A step's ``Draws`` are what a resumed
run must draw again: the batch's sample indices, the noise, each rank's numbers, the
learning rate and the loss scale.

``RunState`` is a run as DCP's ``Stateful`` app state: model and optimizer through
``get_state_dict``/``set_state_dict`` (sharded, or full for ``torch.save``), scheduler,
scaler and loader through their own ``state_dict``, and the random streams under the
rank's own key (``random.rank_<r>``): one key for all ranks would be saved once, as DCP
saves a replicated value, and the other ranks' streams would be lost. The streams are held
as tensors and numbers, so ``torch.load(weights_only=True)`` reads them. A load makes the
loader's iterator before it puts the streams back: making one draws a seed from torch's
generator, which the run that never stopped drew before its save.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

from conformance._upstream import dsd, fsdp_grad_scaler, full_options
from conformance.cells import Parallelism
from conformance.models.common import SEED, computed_on

Schedule = Literal["warmup_cosine", "lambda_warmup_cosine", "step"]
SAMPLES = 24
BATCH = 8  # three batches an epoch: a run crosses epochs, and saves in the middle of one
WARMUP = 2
STEPS = 8  # the length of a schedule's cosine
NOISE = 0.1
INITIAL_SCALE = 2.0**10
GROWTH_INTERVAL = 3  # the scale doubles every third step: a save after 4 leaves it counting


@dataclass
class WarmupCosine:
    """A linear warm-up over ``warmup`` steps, then a cosine to zero at ``steps``: a callable
    object, whose attributes ``LambdaLR`` saves in its state (a function's it cannot)."""

    warmup: int = WARMUP
    steps: int = STEPS

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return (step + 1) / self.warmup
        progress = (step - self.warmup) / max(1, self.steps - self.warmup)
        return 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))


def _sequential(optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LRScheduler:
    lr = torch.optim.lr_scheduler
    warmup = lr.LinearLR(optimizer, start_factor=0.25, total_iters=WARMUP)
    cosine = lr.CosineAnnealingLR(optimizer, T_max=STEPS - WARMUP)
    return lr.SequentialLR(optimizer, [warmup, cosine], milestones=[WARMUP])


SCHEDULES: dict[Schedule, Callable[[torch.optim.Optimizer], torch.optim.lr_scheduler.LRScheduler]]
SCHEDULES = {
    "warmup_cosine": _sequential,
    "lambda_warmup_cosine": lambda o: torch.optim.lr_scheduler.LambdaLR(o, WarmupCosine()),
    "step": lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=2, gamma=0.5),
}


def _data_set() -> torch.utils.data.TensorDataset:
    """``SAMPLES`` inputs of the MLP, each with its index."""
    inputs = torch.randn(SAMPLES, 7, generator=torch.Generator().manual_seed(SEED))
    return torch.utils.data.TensorDataset(torch.arange(SAMPLES), inputs)


def data_loader() -> Any:
    """torchdata's ``StatefulDataLoader`` shuffling the data set. Its sampler seeds its own
    generator from torch's global one when it is made, and each iterator it makes draws its
    workers' base seed from the global one, as ``shuffle=True`` does by default."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    return StatefulDataLoader(_data_set(), batch_size=BATCH, shuffle=True)


def seed_streams(rank: int, device: torch.device) -> None:
    """torch's streams alike on every rank (the accelerator's too), numpy's and Python's by
    rank."""
    torch.manual_seed(SEED)
    if device.type == "cuda":
        torch.cuda.manual_seed(SEED)
    np.random.seed(SEED + rank)
    random.seed(SEED + rank)


def random_streams(device: torch.device) -> dict[str, Any]:
    """This process's random streams as tensors and numbers."""
    _, keys, position, has_gauss, cached = np.random.get_state(legacy=True)
    version, internal, gauss_next = random.getstate()
    streams: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": {
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "position": int(position),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "python": {
            "version": version,
            "internal": torch.tensor(internal, dtype=torch.int64),
            "gauss_next": gauss_next,
        },
    }
    if device.type == "cuda":
        streams["accelerator"] = torch.cuda.get_rng_state(device)
    return streams


def set_random_streams(streams: dict[str, Any], device: torch.device) -> None:
    """Put back what ``random_streams`` took."""
    torch.set_rng_state(streams["torch"])
    numpy = streams["numpy"]
    np.random.set_state(
        (
            "MT19937",
            numpy["keys"].numpy().astype(np.uint32),
            int(numpy["position"]),
            int(numpy["has_gauss"]),
            float(numpy["cached_gaussian"]),
        )
    )
    python = streams["python"]
    random.setstate(
        (int(python["version"]), tuple(python["internal"].tolist()), python["gauss_next"])
    )
    if device.type == "cuda":
        torch.cuda.set_rng_state(streams["accelerator"], device)


@dataclass(frozen=True)
class Draws:
    """What one step drew: the batch's sample indices, the noise added to it, this rank's
    numbers of numpy, Python (and the accelerator), the learning rate it stepped with and
    the loss scale after it."""

    indices: tuple[int, ...]
    noise: torch.Tensor
    per_rank: tuple[float, ...]
    lr: float
    scale: float

    def differences(self, other: Draws) -> list[str]:
        """The fields that differ from ``other``'s, with both values."""
        found = []
        for name in ("indices", "per_rank", "lr", "scale"):
            mine, theirs = getattr(self, name), getattr(other, name)
            if mine != theirs:
                found.append(f"{name}: {mine} against {theirs}")
        if not torch.equal(self.noise, other.noise):
            found.append(
                f"noise: {self.noise.flatten()[:3].tolist()}... against "
                f"{other.noise.flatten()[:3].tolist()}..."
            )
        return found


def grad_scaler(model: nn.Module, cell: Parallelism | None) -> Any:
    """The loss scaler of ``model`` in ``cell`` (None: one process). FSDP1's agrees on an
    overflow across the ranks of the model's group, which may be fewer than the world's."""
    options = {"init_scale": INITIAL_SCALE, "growth_interval": GROWTH_INTERVAL}
    device = computed_on(model).type
    if cell is not None and cell.fsdp1:
        group = model.process_group
        return fsdp_grad_scaler.ShardedGradScaler(device, process_group=group, **options)
    return torch.amp.GradScaler(device, **options)


@dataclass
class Run:
    """A model, its AdamW, a schedule, a loss scaler and a data loader, on rank ``rank``."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: Any
    loader: Any
    rank: int
    _batches: Iterator[Any] | None = field(default=None, init=False)

    @classmethod
    def of(cls, model: nn.Module, schedule: Schedule, cell: Parallelism | None, rank: int) -> Run:
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.02, weight_decay=0.1)
        scaler = grad_scaler(model, cell)
        return cls(model, optimizer, SCHEDULES[schedule](optimizer), scaler, data_loader(), rank)

    @property
    def device(self) -> torch.device:
        return computed_on(self.model)

    def _next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The loader's next batch; a new epoch where the last one ended."""
        if self._batches is not None:
            batch = next(self._batches, None)
            if batch is not None:
                return tuple(batch)
        self._batches = iter(self.loader)
        return tuple(next(self._batches))

    def step(self) -> Draws:
        """One training step; what it drew."""
        indices, inputs = self._next_batch()
        noise = torch.randn(inputs.shape) * NOISE
        per_rank: tuple[float, ...] = (float(np.random.rand()), random.random())
        if self.device.type == "cuda":
            per_rank += (float(torch.rand((), device=self.device)),)
        lr = float(self.optimizer.param_groups[0]["lr"])
        self.optimizer.zero_grad()
        loss = self.model((inputs + noise).to(self.device)).pow(2).mean()
        self.scaler.scale(loss).backward()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.scheduler.step()
        return Draws(tuple(indices.tolist()), noise, per_rank, lr, float(self.scaler.get_scale()))

    def train(self, steps: int) -> list[Draws]:
        return [self.step() for _ in range(steps)]

    def state_dict(self, full: bool = False) -> dict[str, Any]:
        """The run's state (``full``: the model's and optimizer's whole, on every rank)."""
        options = full_options() if full else None
        model_state, optimizer_state = dsd.get_state_dict(
            self.model, self.optimizer, options=options
        )
        return {
            "model": model_state,
            "optimizer": optimizer_state,
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "data": self.loader.state_dict(),
            "random": {f"rank_{self.rank}": random_streams(self.device)},
        }

    def load_state_dict(self, state: dict[str, Any], full: bool = False) -> None:
        """Put back a state ``state_dict`` took; the loader starts where it stood."""
        dsd.set_state_dict(
            self.model,
            self.optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optimizer"],
            options=full_options() if full else None,
        )
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        self.loader.load_state_dict(state["data"])
        # Making an iterator draws its workers' base seed from torch's generator: made
        # before the streams are put back, as the run that never stopped made its own before.
        self._batches = iter(self.loader)
        set_random_streams(state["random"][f"rank_{self.rank}"], self.device)


@dataclass
class RunState:
    """A ``Run`` as DCP's ``Stateful`` app state: DCP calls ``state_dict`` to save and to
    learn what to load, then ``load_state_dict``."""

    run: Run

    def state_dict(self) -> dict[str, Any]:
        return self.run.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.run.load_state_dict(state)
