"""Lossless speculative sampling: the accept / resample primitive and its helpers.

A draft token x drawn from the drafter's distribution q is accepted with probability
min(1, p(x) / q(x)), p being the target's distribution; on rejection the replacement is drawn from
norm(max(p - q, 0)). The emitted token is then distributed exactly as p (Leviathan et al. 2023,
Chen et al. 2023). A deterministic draft (top-k of a tree) is the special case q = one-hot(x):
accept with p(x), on rejection resample from p with x removed. Trying several such candidates one
after another on the shrinking residual keeps the output distributed as p (recursive rejection).

All functions work on a batch of rows: p, q are [R, V] probabilities, x is [R] token ids.
"""

from __future__ import annotations

import torch

MIN_TEMPERATURE = 1e-30
"""Lower temperatures sample as this one, which is already the argmax (ties shared) for any logits a
model gives: nearer 0, logits / T overflows fp32 and the probabilities turn NaN."""


def probs_from_logits(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """softmax(logits / temperature) in fp32 (temperature > 0, taken as MIN_TEMPERATURE below it)."""
    return torch.softmax(logits.float() / max(temperature, MIN_TEMPERATURE), dim=-1)


def accept_probability(p: torch.Tensor, q: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """min(1, p(x) / q(x)) per row; q(x) > 0 because x was drawn from q."""
    px = p.gather(-1, x[:, None])[:, 0]
    qx = q.gather(-1, x[:, None])[:, 0]
    return torch.clamp(px / qx.clamp_min(torch.finfo(qx.dtype).tiny), max=1.0)


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(p - q, 0)) per row.

    Where the residual mass is zero (p == q up to rounding, so a rejection was a rounding event),
    return p itself: that keeps the row a valid distribution without favouring any token.
    """
    r = (p - q).clamp_min(0.0)
    mass = r.sum(-1, keepdim=True)
    ok = mass > 1e-12
    return torch.where(ok, r / mass.clamp_min(1e-30), p)


def one_hot(x: torch.Tensor, vocab: int) -> torch.Tensor:
    """The proposal of a deterministic draft token: q = one-hot(x), [R, V] fp32."""
    return torch.zeros(x.shape[0], vocab, device=x.device).scatter_(-1, x[:, None], 1.0)


def sample(p: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row from probabilities p [R, V]."""
    return torch.multinomial(p, 1, generator=generator)[:, 0]


def scatter_dist(ids: torch.Tensor, probs: torch.Tensor, vocab: int) -> torch.Tensor:
    """Dense [R, V] distribution from sparse (ids [R, k], probs [R, k]) (the drafter's top-k)."""
    return torch.zeros(ids.shape[0], vocab, device=ids.device).scatter_add_(-1, ids, probs.float())
