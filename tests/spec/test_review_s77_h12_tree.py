"""Draft-tree bookkeeping pinned field by field (second audit): padded trees, drafted counts, chains,
candidate indices and a multi-row top-T selection."""

from __future__ import annotations

import torch

from drafter_lab.spec.tree import Candidates, DraftTree, chain, padded_tree


def test_padded_tree_pads_rows_with_self_parented_root_depth_nodes():
    root = torch.tensor([5, 6, 7], dtype=torch.int32)
    tree = padded_tree(root, [[(10, 0), (11, 1), (12, 0)], [(20, 0)], []], pad_id=3)
    assert tree.tokens.tolist() == [[5, 10, 11, 12], [6, 20, 3, 3], [7, 3, 3, 3]]
    assert tree.tokens.dtype == torch.int32
    assert tree.parents.tolist() == [[-1, 0, 1, 0], [-1, 0, 2, 3], [-1, 1, 2, 3]]
    assert tree.depth.tolist() == [[0, 1, 2, 1], [0, 1, 0, 0], [0, 0, 0, 0]]
    assert tree.q is None and tree.size == 4
    assert tree.drafted().tolist() == [3, 1, 0]
    # padding is nobody's ancestor but its own
    assert tree.ancestors()[1].tolist() == [[True, False, False, False], [True, True, False, False],
                                             [False, False, True, False], [False, False, False, True]]


def test_padded_tree_of_rows_that_draft_nothing_is_the_roots_alone():
    tree = padded_tree(torch.tensor([4, 9]), [[], []], pad_id=0)
    assert tree.tokens.tolist() == [[4], [9]] and tree.parents.tolist() == [[-1], [-1]]
    assert tree.depth.tolist() == [[0], [0]] and tree.drafted().tolist() == [0, 0]


def test_chain_fields_and_drafted_count():
    q = torch.zeros(2, 3, 5)
    t = chain(torch.tensor([1, 2]), torch.tensor([[5, 6], [8, 9]]), q)
    assert t.tokens.tolist() == [[1, 5, 6], [2, 8, 9]]
    assert t.depth.tolist() == [[0, 1, 2]] * 2 and t.parents.tolist() == [[-1, 0, 1]] * 2
    assert t.q is q and t.size == 3 and t.drafted().tolist() == [2, 2]
    t.parents[0, 2] = 7  # rows own their parents: the expand was cloned
    assert t.parents[1].tolist() == [-1, 0, 1]


def test_children_counts_ranks_per_row():
    tree = DraftTree(tokens=torch.zeros(2, 5, dtype=torch.long),
                     parents=torch.tensor([[-1, 0, 1, 0, 1], [-1, 0, 0, 0, 4]]), depth=torch.zeros(2, 5))
    node = torch.tensor([1, 0])
    assert tree.children(node, 0).tolist() == [2, 1]
    assert tree.children(node, 1).tolist() == [4, 2]
    assert tree.children(node, 2).tolist() == [-1, 3]
    assert tree.children(torch.tensor([0, 0]), 3).tolist() == [-1, -1]  # row 1's padding is not the root's child


def test_candidate_indices_run_on_across_adds():
    c = Candidates()
    assert c.add(torch.zeros(1, 2, dtype=torch.long), torch.zeros(1, 2), torch.full((1, 2), -1), 1).tolist() == [0, 1]
    assert c.add(torch.zeros(1, 3, dtype=torch.long), torch.zeros(1, 3), torch.zeros(1, 3, dtype=torch.long),
                 2).tolist() == [2, 3, 4]
    assert c.count == 5


def test_select_ranks_each_row_on_its_own_scores():
    c = Candidates()
    c.add(torch.tensor([[10, 11], [30, 31]]), torch.tensor([[-1.0, -0.5], [-0.1, -2.0]]),
          torch.full((2, 2), -1), 1)
    c.add(torch.tensor([[20, 21, 22], [40, 41, 42]]), torch.tensor([[-0.7, -3.0, -1.2], [-0.3, -9.0, -0.2]]),
          torch.tensor([[1, 1, 0], [0, 1, 0]]), 2)
    tree = c.select(torch.tensor([1, 2]), 3)
    # row 0 keeps 11, 20 and 10 (not 22), row 1 keeps 30, 42 and 40 (not 31); both in creation order
    assert tree.tokens.tolist() == [[1, 10, 11, 20], [2, 30, 40, 42]]
    assert tree.parents.tolist() == [[-1, 0, 0, 2], [-1, 0, 1, 1]]
    assert tree.depth.tolist() == [[0, 1, 1, 2], [0, 1, 2, 2]]
