"""A small decoder-only transformer: the shape of the models users actually checkpoint.

Two blocks of causal self-attention and a feed-forward layer, with layer norms, an
embedding and an output head. The attention infers its number of heads from the width
it is given, so tensor parallelism can split the heads; the feed-forward width (10) does
not divide by 4, so its shards are uneven.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional

from conformance._upstream import tensor_parallel
from conformance.models.common import SEED, VOCAB

DIM, HEADS, FFN_HIDDEN, LAYERS = 8, 4, 10, 2


class Attention(nn.Module):
    """Projections without bias, as in LLaMA: a key bias gets no gradient (softmax ignores
    a shift shared by all keys), and Adam would turn its rounding noise into steps."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(DIM, DIM, bias=False) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape

        def heads(projection: torch.Tensor) -> torch.Tensor:
            return projection.view(batch, length, -1, DIM // HEADS).transpose(1, 2)

        mixed = functional.scaled_dot_product_attention(
            heads(self.q(x)), heads(self.k(x)), heads(self.v(x)), is_causal=True
        )
        return self.o(mixed.transpose(1, 2).reshape(batch, length, -1))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn_norm = nn.LayerNorm(DIM)
        self.attn = Attention()
        self.ffn_norm = nn.LayerNorm(DIM)
        self.w1 = nn.Linear(DIM, FFN_HIDDEN)
        self.w2 = nn.Linear(FFN_HIDDEN, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        return x + self.w2(functional.gelu(self.w1(self.ffn_norm(x))))


class TinyTransformer(nn.Module):
    units = tuple(f"layers.{index}" for index in range(LAYERS))

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))

    def tp_plan(self) -> dict[str, Any]:
        """Megatron style: q, k, v and w1 column-wise, o and w2 row-wise, per block."""

        plan: dict[str, Any] = {}
        for unit in self.units:
            for name in ("attn.q", "attn.k", "attn.v", "w1"):
                plan[f"{unit}.{name}"] = tensor_parallel.ColwiseParallel()
            for name in ("attn.o", "w2"):
                plan[f"{unit}.{name}"] = tensor_parallel.RowwiseParallel()
        return plan


def seeded_transformer() -> TinyTransformer:
    torch.manual_seed(SEED)
    return TinyTransformer()
