"""Mutation audit (review s74, h3) of data.vocab's comparison by token: a b_to_a entry at the first id past
a's target vocab, and the -1 that stands for a token b's tokenizer lacks."""

from __future__ import annotations

import torch

from drafter_lab.data.vocab import DraftVocab, _ids_in, compare_vocabs


def test_a_b_id_mapped_to_just_past_as_target_vocab_is_no_token_of_a():
    """b_to_a holding a's target vocab size (one past a's last id): no token, not an index error."""
    a = DraftVocab.from_used(torch.tensor([1, 3, 5]), 8)
    b = DraftVocab.from_used(torch.tensor([1, 3, 6]), 10)
    b_to_a = torch.arange(10)
    b_to_a[6] = 8  # a's vocab is 0..7
    r = compare_vocabs(a, b, b_to_a=b_to_a)
    assert (r["same_positions"], r["shared_tokens"]) == (2, 2)
    assert (r["only_a"], r["only_b"]) == ([5], [6])


def test_as_ids_in_b_are_minus_one_where_b_has_no_such_token_and_the_held_one_where_b_has_two():
    b_to_a = torch.tensor([0, 2, -1, 4, 2, 5])  # b's 1 and 4 are both a's 2; b's 5 is past a's 0..4
    assert _ids_in(b_to_a, 5, torch.tensor([0])).tolist() == [0, -1, 1, -1, 3]
    assert _ids_in(b_to_a, 5, torch.tensor([4])).tolist() == [0, -1, 4, -1, 3]  # b's vocab holds 4, not 1


def test_a_gap_of_one_id_is_a_gap():
    a = DraftVocab.from_used(torch.tensor([1, 3, 5]), 8)
    b = DraftVocab.from_used(torch.tensor([2, 3, 7]), 8)
    assert compare_vocabs(a, b)["largest_gaps"] == [
        {"position": 2, "target_a": 5, "target_b": 7, "gap": 2},
        {"position": 0, "target_a": 1, "target_b": 2, "gap": 1},
    ]
