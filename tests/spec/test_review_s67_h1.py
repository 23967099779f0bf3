"""Draft trees and n-gram drafting: edge cases the mutation audit found unpinned (session 67, h1)."""

from __future__ import annotations

import pytest
import torch

from drafter_lab.errors import LabError
from drafter_lab.spec.ngram import NgramDrafter, NgramIndex
from drafter_lab.spec.ngram_config import NgramConfig


def test_ngram_config_defaults_and_description():
    """The defaults the CLI's help text quotes: suffixes of 2..4 tokens, each row's own tokens only."""
    cfg = NgramConfig()
    assert (cfg.min_n, cfg.max_n, cfg.across_prompts) == (2, 4, False)
    assert cfg.describe() == "n-gram lookup (2..4)"
    assert NgramConfig(1, 1, across_prompts=True).describe() == "n-gram lookup (1..1, across prompts)"


@pytest.mark.parametrize("sizes", [(0, 2), (0, 0), (-1, 3), (3, 2)])
def test_ngram_config_refuses_sizes_that_match_nothing(sizes):
    with pytest.raises(LabError, match=rf"1 <= min_n <= max_n, got min_n={sizes[0]}, max_n={sizes[1]}$"):
        NgramConfig(*sizes)


def test_growing_a_row_indexes_each_position_once():
    """Each cycle indexes only the positions new since the last: re-indexing the last one again would
    grow every n-gram's list by a duplicate per cycle (memory and lookup time, not the drafts)."""
    tokens = [1, 2, 1, 2, 3, 1, 2, 1, 1, 2, 3, 3, 1]
    cycles, whole = NgramIndex(NgramConfig(1, 3)), NgramIndex(NgramConfig(1, 3))
    for end in range(1, len(tokens) + 1):
        cycles.grow(tokens[:end])
    whole.grow(tokens)
    assert cycles.after == whole.after
    assert cycles.after[(1, 2)] == [2, 4, 7, 10]  # where each [1, 2]'s continuation starts, oldest first


def test_rows_keep_their_own_index_as_rows_leave_and_join():
    """Continuous batching: after row 0 leaves, the old row 1 drafts from its own tokens, and a row that
    joins starts from none (else it would draft from another row's n-grams)."""
    d = NgramDrafter(NgramConfig(1, 2))
    d.reset(2)
    a, b = [1, 2, 3, 1], [4, 5, 6, 4, 7, 4]
    tree = d.draft(torch.tensor([1, 4]), [a, b], steps=2, topk=1, draft_tokens=2, pad_id=0)
    assert tree.tokens.tolist() == [[1, 2, 3], [4, 7, 4]]
    d.keep([1])
    d.join(1)
    b += [5]
    c = [4, 5, 9, 4, 5]  # b's own lookup of [4, 5] gives [6, 4], not c's [9, 4]
    tree = d.draft(torch.tensor([5, 5]), [b, c], steps=2, topk=1, draft_tokens=2, pad_id=0)
    assert tree.tokens.tolist() == [[5, 6, 4], [5, 9, 4]]
    assert [r.tokens for r in d.rows] == [b, c]


def test_draft_merges_the_topk_continuations_within_the_budget():
    """[1] occurred three times: continuations [3, 1] (most recent), [2, 1], [2, 1] again (merged away)."""
    d = NgramDrafter(NgramConfig(1, 1))
    d.reset(1)
    h = [1, 2, 1, 2, 1, 3, 1]
    for topk, budget, tokens, parents in [
        (1, 2, [1, 3, 1], [-1, 0, 1]),
        (3, 6, [1, 3, 1, 2, 1], [-1, 0, 1, 0, 3]),
        (3, 3, [1, 3, 1, 2], [-1, 0, 1, 0]),
    ]:
        tree = d.draft(torch.tensor([1]), [h], steps=2, topk=topk, draft_tokens=budget, pad_id=0)
        assert tree.tokens.tolist() == [tokens] and tree.parents.tolist() == [parents]
