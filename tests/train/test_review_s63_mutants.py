"""Mutation audit (review s63): the weighted loss counts the last TTT step, and a validation counts
every held-out sequence whatever its batching."""

from __future__ import annotations

import pytest
import torch

from drafter_lab.data.shards import Sequence
from drafter_lab.drafter.config import DrafterConfig
from drafter_lab.drafter.model import Eagle3Drafter
from drafter_lab.train.metrics import evaluate, summarize, weighted_loss
from drafter_lab.train.ttt import CE_SUM, N_COLS, N_LOSS, N_VALID


def test_weighted_loss_counts_every_step_that_scored_the_last_included():
    counts = torch.zeros(3, N_COLS)
    for k, (ce, n) in enumerate([(6.0, 3.0), (5.0, 2.0), (4.0, 4.0)]):
        counts[k, [CE_SUM, N_LOSS, N_VALID]] = torch.tensor([ce, n, n])
    assert weighted_loss(summarize(counts), 3, 0.8) == pytest.approx(2.0 + 0.8 * 2.5 + 0.64 * 1.0)


def test_a_validation_counts_every_sequence_in_batches_of_any_size():
    """Step 0 at position t predicts x_{t+2}: it scores each sequence's assistant tokens from index 2 on,
    whichever batch the sequence falls in (5 sequences in batches of 2 leave one alone)."""
    H, V, N = 32, 64, 64
    g = torch.Generator().manual_seed(4)
    seqs = []
    for i, T in enumerate((9, 12, 10, 14, 11)):
        mask = torch.zeros(T, dtype=torch.bool)
        mask[T // 2:] = True  # the assistant's half
        seqs.append(Sequence(seq_id=str(i), input_ids=torch.randint(0, V, (T,), generator=g), loss_mask=mask,
                             aux_hidden=torch.randn(T, 3 * H, generator=g), final_hidden=torch.randn(T, H, generator=g)))
    cfg = DrafterConfig(hidden_size=H, target_hidden_size=H, intermediate_size=64, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=8, draft_vocab_size=N, target_vocab_size=V,
                        aux_layer_ids=[1, 2, 3])
    torch.manual_seed(3)
    drafter = Eagle3Drafter(cfg)
    drafter.t2d.fill_(True)
    head = torch.randn(V, H, generator=g)
    whole = evaluate(drafter, head, seqs, 3, batch_size=16)
    assert whole["positions"] == sum(int(s.loss_mask[2:].sum()) for s in seqs)
    assert evaluate(drafter, head, seqs, 3, batch_size=2) == pytest.approx(whole)
