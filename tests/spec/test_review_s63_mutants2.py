"""Tree selection keeps every chosen node's parent when scores tie (mutation audit, round 2)."""

from __future__ import annotations

import torch

from drafter_lab.spec.tree import Candidates


def test_ties_in_score_keep_parents_before_their_children():
    """A confident drafter gives log-prob exactly 0, so a child ties its parent's score; the selection must
    still take parents first (creation order), or a chosen node's parent is cut and its mask is garbage."""
    c = Candidates()
    # depth 1: node 0 at log-prob 0, then 31 far-behind children of the root
    idx = c.add(torch.tensor([[100] + list(range(31))]), torch.tensor([[0.0] + [-30.0] * 31]), torch.full((1, 32), -1), 1)
    parent = int(idx[0])
    for depth in range(2, 10):  # a chain below node 0, each step again at log-prob 0
        new = c.add(torch.tensor([[100 + depth, 7, 8, 9]]), torch.tensor([[0.0, -40.0, -40.0, -40.0]]),
                    torch.full((1, 4), parent), depth)
        parent = int(new[0])
    tree = c.select(torch.tensor([5]), 6)
    assert tree.tokens.tolist() == [[5, 100, 102, 103, 104, 105, 106]]
    assert tree.parents.tolist() == [[-1, 0, 1, 2, 3, 4, 5]] and tree.depth.tolist() == [[0, 1, 2, 3, 4, 5, 6]]
