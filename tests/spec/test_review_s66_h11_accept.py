"""Pins from the s66 (h11) mutation audit of spec/accept.py and spec/sampling.py: a seeded sampled walk
repeats whatever else used the global RNG, a rejected draft's real (if small) residual mass is what the
bonus is drawn from, a draft of no target mass is never accepted, and a top-k proposal whose ids coincide
in the target's vocab keeps all its mass."""

from __future__ import annotations

import torch

from drafter_lab.spec.accept import sampled_walk
from drafter_lab.spec.sampling import one_hot, residual, scatter_dist
from drafter_lab.spec.tree import padded_tree


def _tree(rows: int):
    # root -> two siblings (1, 2); the first has a child (3): accepts and rejections both happen
    return padded_tree(torch.zeros(rows, dtype=torch.long), [[(1, 0), (2, 0), (3, 1)]] * rows, pad_id=0)


def test_a_seeded_sampled_walk_repeats_whatever_the_global_rng_did():
    """--seed must repeat a sampled decode: the accept draws come from the given generator too, not only
    the bonus's."""
    tree = _tree(256)
    probs = torch.softmax(torch.randn(4, 5, generator=torch.Generator().manual_seed(0)), -1)[tree.tokens]
    runs = []
    for global_seed in (1, 2):
        torch.manual_seed(global_seed)
        runs.append(sampled_walk(tree, probs, torch.Generator().manual_seed(7)))
    for a, b in zip(*runs):
        assert torch.equal(a, b)
    assert set(runs[0][1].tolist()) >= {1, 2}  # the walk did both accept and reject


def test_a_rejected_likely_draft_is_never_the_bonus():
    """p gives the draft 0.9995: on the rare rejection the bonus comes from the 0.0005 left, not from p
    (a residual threshold above real probabilities would emit the rejected token again)."""
    p = torch.tensor([[0.9995, 0.0005, 0.0, 0.0]])
    assert torch.allclose(residual(p, one_hot(torch.tensor([0]), 4)), torch.tensor([[0.0, 1.0, 0.0, 0.0]]))
    rows = 40_000
    tree = padded_tree(torch.full((rows,), 3), [[(0, 0)]] * rows, pad_id=0)
    probs = p.expand(rows, 2, 4).clone()
    _, counts, bonus = sampled_walk(tree, probs, torch.Generator().manual_seed(0))
    rejected = counts == 1
    assert int(rejected.sum()) > 0
    assert bool((bonus[rejected] == 1).all())


def test_a_top_k_proposal_whose_ids_coincide_keeps_all_its_mass():
    # two draft ids mapped to one target id: that token is drafted with both probabilities
    q = scatter_dist(torch.tensor([[3, 3, 1]]), torch.tensor([[0.5, 0.25, 0.25]]), 5)
    assert q.tolist() == [[0.0, 0.25, 0.0, 0.75, 0.0]]


def test_a_draft_the_target_gives_no_mass_is_never_accepted_even_on_a_zero_draw(monkeypatch):
    """torch.rand can return exactly 0 (once in 2**24 draws): accepting on u <= p(x) would then emit a token
    the target never emits (p underflows to 0 at low temperatures)."""
    rows = 4
    tree = padded_tree(torch.full((rows,), 3), [[(0, 0)]] * rows, pad_id=0)
    probs = torch.tensor([0.0, 1.0, 0.0, 0.0]).expand(rows, 2, 4).clone()
    monkeypatch.setattr(torch, "rand", lambda n, **kw: torch.zeros(n))
    _, counts, bonus = sampled_walk(tree, probs, torch.Generator().manual_seed(0))
    assert counts.tolist() == [1] * rows and bonus.tolist() == [1] * rows
