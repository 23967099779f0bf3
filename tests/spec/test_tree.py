"""Draft-tree bookkeeping: top-T selection keeps parents, ancestor masks match a brute force."""

from __future__ import annotations

import torch

from drafter_lab.spec.tree import Candidates, DraftTree, chain, padded_tree


def brute_ancestors(parents: list[int]) -> torch.Tensor:
    N = len(parents)
    out = torch.zeros(N, N, dtype=torch.bool)
    for i in range(N):
        j = i
        while j >= 0:
            out[i, j] = True
            j = parents[j]
    return out


def build_candidates(B, K, steps, g):
    """What draft_tree records: K root children, then K*K children of the K best at each depth."""
    c = Candidates()
    score = torch.log_softmax(torch.randn(B, K, generator=g), -1)
    idx = c.add(torch.randint(0, 100, (B, K), generator=g), score, torch.full((B, K), -1), 1).expand(B, K)
    for depth in range(1, steps):
        child = (score[:, :, None] + torch.log_softmax(torch.randn(B, K, K, generator=g), -1)).reshape(B, K * K)
        child_idx = c.add(torch.randint(0, 100, (B, K * K), generator=g), child,
                          idx[:, :, None].expand(B, K, K).reshape(B, K * K), depth + 1)
        score, pick = child.topk(K, 1)
        idx = child_idx[pick]
    return c


def test_select_keeps_parents_and_orders_them_first():
    g = torch.Generator().manual_seed(0)
    for K, steps, T in [(2, 3, 5), (3, 4, 12), (4, 2, 20), (1, 5, 5)]:
        tree = build_candidates(3, K, steps, g).select(torch.tensor([7, 8, 9]), T)
        assert tree.tokens.shape == (3, T + 1)
        assert torch.equal(tree.tokens[:, 0], torch.tensor([7, 8, 9]))
        for b in range(3):
            par = tree.parents[b].tolist()
            assert par[0] == -1
            assert all(0 <= p < i for i, p in enumerate(par) if i)
            assert all(tree.depth[b, i] == tree.depth[b, p] + 1 for i, p in enumerate(par) if i)
            assert torch.equal(tree.ancestors()[b], brute_ancestors(par))


def test_select_takes_the_best_scores_even_with_ties():
    c = Candidates()
    c.add(torch.tensor([[10, 11]]), torch.tensor([[0.0, -1.0]]), torch.tensor([[-1, -1]]), 1)
    # a child with log-prob 0 ties its parent: the parent must still come first
    c.add(torch.tensor([[20, 21]]), torch.tensor([[0.0, -0.5]]), torch.tensor([[0, 0]]), 2)
    tree = c.select(torch.tensor([1]), 2)
    assert tree.tokens.tolist() == [[1, 10, 20]]
    assert tree.parents.tolist() == [[-1, 0, 1]]


def test_chain_and_children():
    t = chain(torch.tensor([1, 2]), torch.tensor([[5, 6, 7], [8, 9, 10]]))
    assert t.parents.tolist() == [[-1, 0, 1, 2]] * 2
    assert torch.equal(t.ancestors()[0], torch.ones(4, 4, dtype=torch.bool).tril())
    tree = DraftTree(tokens=torch.tensor([[0, 1, 2, 3]]), parents=torch.tensor([[-1, 0, 0, 1]]),
                     depth=torch.tensor([[0, 1, 1, 2]]))
    assert tree.children(torch.tensor([0]), 0).item() == 1
    assert tree.children(torch.tensor([0]), 1).item() == 2
    assert tree.children(torch.tensor([0]), 2).item() == -1
    assert tree.children(torch.tensor([3]), 0).item() == -1


def test_a_pad_is_nobodys_child_not_even_its_own():
    """A pad is its own parent; children(pad) returned the pad itself as its first child."""
    tree = padded_tree(torch.tensor([1, 2]), [[(5, 0), (6, 1)], [(7, 0)]], pad_id=0)
    assert tree.parents[1].tolist() == [-1, 0, 2]
    assert tree.children(torch.tensor([1, 2]), 0).tolist() == [2, -1]
