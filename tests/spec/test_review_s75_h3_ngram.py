"""N-gram drafting pins from mutation testing (session 75, h3): kept rows keep their own index, and an
index of finished rows yields a continuation once even where the last row ends in it."""

from __future__ import annotations

import torch

from drafter_lab.spec.ngram import NgramDrafter
from drafter_lab.spec.ngram_config import NgramConfig


def test_kept_rows_draft_from_their_own_tokens_in_their_new_order():
    """Continuous batching drops row 1 and reorders the rest: each row's index must follow it, or a row
    looks its suffix up in another row's n-grams (still lossless, but it drafts nothing or junk)."""
    d = NgramDrafter(NgramConfig(1, 2))
    rows = [[1, 2, 3, 1], [4, 8, 9, 4], [5, 6, 7, 5]]
    d.reset(3)
    tree = d.draft(torch.tensor([r[-1] for r in rows]), rows, 2, 1, 2, pad_id=0)
    assert tree.tokens.tolist() == [[1, 2, 3], [4, 8, 9], [5, 6, 7]]
    d.keep([2, 0])
    grown = [rows[2] + [6], rows[0] + [2]]
    tree = d.draft(torch.tensor([6, 2]), grown, 2, 1, 2, pad_id=0)
    assert tree.tokens.tolist() == [[6, 7, 5], [2, 3, 1]]


def test_finished_rows_yield_a_continuation_once_where_the_last_row_ends_in_it():
    """[1, 2] is followed by [6] at the end of both finished rows: cut at its row's end, each is final,
    so the index yields [6] once (the most recent), then [7, 1, 2]."""
    d = NgramDrafter(NgramConfig(2, 2, across_prompts=True))
    d.finish([[1, 2, 6], [1, 2, 7, 1, 2, 6]])
    assert list(d.earlier.continuations((1, 2), 3)) == [[6], [7, 1, 2]]
