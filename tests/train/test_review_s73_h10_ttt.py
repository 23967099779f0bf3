"""Mutation audit (review s73, h10) of train.ttt: batches shorter than the TTT depth, and the loss's
given (all-reduced) per-step denominators."""

from __future__ import annotations

import pytest
import torch

from drafter_lab.drafter.config import DrafterConfig
from drafter_lab.train.data import Example, collate, target_top1
from drafter_lab.train.ttt import CE_SUM, N_COLS, N_LOSS, R_CYC, R_TOK, TTTObjective, step_masks

from .test_ttt import drafter_and_head

V, N, HT = 29, 11, 16


def tiny(lengths, temperature=0.0, seed=0):
    cfg = DrafterConfig(hidden_size=16, intermediate_size=24, num_attention_heads=2, num_key_value_heads=1,
                        head_dim=8, draft_vocab_size=N, target_vocab_size=V, target_hidden_size=HT,
                        aux_layer_ids=[1, 2, 3], rope_theta=100.0)
    d, used, head = drafter_and_head(cfg, seed, 2.0)
    examples = []
    for T in lengths:
        final = torch.randn(T, HT, dtype=torch.float64)
        top1, logz = target_top1(final, head, temperature)
        examples.append(Example(torch.randint(0, V, (T,)), torch.ones(T, dtype=torch.bool),
                                torch.randn(T, 3 * HT, dtype=torch.float64), final, top1, logz))
    return d, head[used], collate(examples)


def test_step_masks_of_a_batch_shorter_than_the_depth_are_empty_past_its_end():
    """T = 4: step k predicts x_{t+k+2}, so steps 2 and 3 have no position (n <= 0), not an error."""
    d, _, batch = tiny([4, 3])
    valid, in_vocab = step_masks(batch, d.t2d, 4)
    assert valid.shape == (4, 2, 4)
    assert valid[0, 0].tolist() == [True, True, False, False] and valid[1, 0].tolist() == [True, False, False, False]
    assert not valid[2:].any() and not in_vocab[2:].any()


@pytest.mark.parametrize("temperature, replay", [(0.0, False), (0.8, True)])
def test_steps_past_a_short_batchs_end_count_nothing_and_add_no_loss(temperature, replay):
    d, head, batch = tiny([4, 3], temperature)
    loss4, counts4 = TTTObjective(d, head, 4, 0.8, temperature, replay)(batch)
    loss2, counts2 = TTTObjective(d, head, 2, 0.8, temperature, replay)(batch)
    assert counts4[0, 0] > 0 and counts4[1, 0] > 0
    torch.testing.assert_close(loss4, loss2, rtol=1e-12, atol=0)
    torch.testing.assert_close(counts4[:2], counts2, rtol=1e-12, atol=0)
    plain = [c for c in range(N_COLS) if c not in (R_TOK, R_CYC)]
    assert not counts4[2:, plain].any()


def test_given_denominators_replace_the_batchs_own_and_scale_multiplies():
    """Under DDP each rank divides by the all-reduced positions per step, not its own."""
    d, head, batch = tiny([9, 7, 8])
    obj = TTTObjective(d, head, 3, 0.8)
    own, counts = obj(batch)
    mine = counts[:, N_LOSS].float()  # what loss_denominators gives this batch
    assert (mine > 0).all()
    torch.testing.assert_close(obj(batch, mine)[0], own, rtol=1e-12, atol=0)
    torch.testing.assert_close(obj(batch, 4 * mine)[0], own / 4, rtol=1e-12, atol=0)
    torch.testing.assert_close(obj(batch, mine, scale=0.5)[0], own / 2, rtol=1e-12, atol=0)
    summed = sum(0.8 ** k * counts[k, CE_SUM] for k in range(3))
    torch.testing.assert_close(obj(batch, torch.ones(3))[0], summed, rtol=1e-12, atol=0)
    torch.testing.assert_close(obj(batch, torch.zeros(3))[0], summed, rtol=1e-12, atol=0)  # no 0 / 0
    steps = torch.tensor([1.0, 0.0, 0.0]) * 1e9 + mine  # only step 0's share all but vanishes
    want = own - counts[0, CE_SUM] / mine[0]
    torch.testing.assert_close(obj(batch, steps)[0], want, rtol=1e-6, atol=1e-9)
