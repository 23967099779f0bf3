"""Review checks of the training data path: the replay's blocked solve at the sizes a batch can
have, the TTT loss positions across steps, and the schedule's ends."""

from __future__ import annotations

import math

import pytest
import torch

from drafter_lab.train.data import collate
from drafter_lab.train.metrics import summarize, weighted_loss
from drafter_lab.train.schedule import lr_factor
from drafter_lab.train.ttt import N_LOSS, N_VALID, TTTObjective, replay_roots, replay_roots_reference

from .test_ttt import K, setup


@pytest.mark.parametrize("steps, T, block", [(1, 3, 32), (5, 3, 1), (5, 4, 32), (6, 7, 3), (3, 33, 32), (4, 64, 32)])
def test_replay_blocked_solve_equals_the_loop_on_short_and_ragged_batches(steps, T, block):
    """Batches shorter than a block or than the chain, and lengths a block does not divide."""
    g = torch.Generator().manual_seed(T * 10 + steps)
    rates = torch.rand(steps, 3, T, dtype=torch.float64, generator=g)
    mask = torch.rand(3, T, generator=g) < 0.7
    mask[2, T // 2:] = False  # a shorter, right-padded row
    got, want = replay_roots(rates, mask, block), replay_roots_reference(rates, mask)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_every_step_scores_the_same_positions_past_the_first_tokens():
    """Step k at t scores x_{t+k+2} with the target's top-1 at t+k+1: the same tokens at every step
    (only those within the first k + 2 drop out), so once the assistant tokens start past K + 1 no
    step is left without a loss position while step 0 has one: weighted_loss is NaN only where the
    validation scored nothing."""
    d, head, used, examples = setup(seed=6)
    for e in examples:
        e.loss_mask[:K + 2] = False
    _, counts = TTTObjective(d, head[used], K, 0.8)(collate(examples))
    assert counts[0, N_LOSS] > 0 and (counts[:, N_LOSS] == counts[0, N_LOSS]).all()
    assert (counts[:, N_VALID] == counts[0, N_VALID]).all()
    m = summarize(counts)
    assert math.isfinite(weighted_loss(m, K, 0.8))


def test_schedule_reaches_the_peak_at_the_warmups_last_step_and_the_floor_after_the_last():
    warmup, total, floor = 4, 20, 0.1
    f = [lr_factor(s, warmup, total, floor) for s in range(total + 1)]
    assert f[:warmup] == [0.25, 0.5, 0.75, 1.0] and f[warmup] == 1.0
    assert all(a > b for a, b in zip(f[warmup:], f[warmup + 1:]))
    assert f[total - 1] > floor and math.isclose(f[total], floor)
