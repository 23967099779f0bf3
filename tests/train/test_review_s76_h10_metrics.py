"""Mutation audit (review s76 h10) of train/metrics.py: every ratio from counts whose denominators
include 1, the chained accept lengths, the columns each kind of validation adds, and `evaluate`'s
max_length, temperature and replay arguments."""

from __future__ import annotations

import math

import pytest
import torch

from drafter_lab.errors import LabError
from drafter_lab.train.metrics import evaluate, metric_names, summarize, weighted_loss
from drafter_lab.train.ttt import (
    CE_SUM,
    COND_DEN,
    COND_NUM,
    N_COLS,
    N_CORRECT,
    N_LOSS,
    N_VALID,
    R_CYC,
    R_TOK,
    S_DEN,
    S_NUM,
)

from .test_review_s65_metrics import H, V, _drafter, _sequences


def _counts() -> torch.Tensor:
    """Three steps; step 0 has one position in every denominator (a ratio over 1 is still a ratio)."""
    c = torch.zeros(3, N_COLS)
    cols = [N_VALID, N_LOSS, CE_SUM, N_CORRECT, COND_DEN, COND_NUM, S_DEN, S_NUM, R_CYC, R_TOK]
    c[:, cols] = torch.tensor([[1, 1, 2, 1, 1, 1, 1, 0.5, 1, 1.5],
                               [4, 4, 6, 1, 2, 1, 4, 1, 2, 4],
                               [3, 3, 3, 0, 2, 1, 2, 1, 3, 7.5]])
    return c


def test_each_metric_is_its_ratio_of_sums_and_the_chains_multiply_them():
    m = summarize(_counts(), sampled=True, replay=True)
    assert m == {
        "loss_0": 2.0, "loss_1": 1.5, "loss_2": 1.0,
        "acc_0": 1.0, "acc_1": 0.25, "acc_2": 0.0,
        "cond_acc_0": 1.0, "cond_acc_1": 0.5, "cond_acc_2": 0.5,
        "simulated_accept_len": 1.0 + 0.5 + 0.25,
        "sampled_acc_0": 0.5, "sampled_acc_1": 0.25, "sampled_acc_2": 0.5,
        "sampled_accept_len": 0.5 + 0.125 + 0.0625,
        "replay_accept_len_0": 1.5, "replay_accept_len_1": 2.0, "replay_accept_len_2": 2.5,
        "replay_accept_len": 2.5,  # the K-step chain's, not an earlier step's
        "positions": 1,
    }


@pytest.mark.parametrize("sampled, replay, extra", [
    (False, False, []),
    (True, False, ["sampled_acc_0", "sampled_acc_1", "sampled_accept_len"]),
    (False, True, ["replay_accept_len_0", "replay_accept_len_1", "replay_accept_len"]),
])
def test_a_validation_has_the_columns_of_its_kind_alone(sampled, replay, extra):
    """A greedy validation's line has no sampled or replay columns: the cost model reads their presence."""
    base = ["loss_0", "acc_0", "loss_1", "acc_1", "cond_acc_0", "cond_acc_1", "simulated_accept_len"]
    assert metric_names(2, sampled, replay) == base + extra + ["weighted_loss"]
    assert list(summarize(_counts()[:2], sampled, replay)) == base + extra + ["positions"]


def test_a_weighted_loss_where_no_step_scored_is_nan_not_zero():
    """0 would read as the best loss a run ever had: keep_best would keep it."""
    assert math.isnan(weighted_loss(summarize(torch.zeros(2, N_COLS)), 2, 0.8))


def test_evaluate_truncates_each_sequence_to_max_length():
    """Step 0 scores positions 2..n-1 of each (truncated) sequence."""
    head = torch.randn(V, H, generator=torch.Generator().manual_seed(5))
    seqs = _sequences((9, 12, 10), first_loss=2)
    assert evaluate(_drafter(), head, seqs, 2)["positions"] == 7 + 10 + 8
    assert evaluate(_drafter(), head, seqs, 2, max_length=8)["positions"] == 3 * 6


@pytest.mark.parametrize("temperature", [0.5, 1.0])
def test_evaluate_at_a_temperature_up_to_1_scores_the_sampled_chain_and_its_replay(temperature):
    head = torch.randn(V, H, generator=torch.Generator().manual_seed(5))
    m = evaluate(_drafter(), head, _sequences((9, 12), first_loss=2), 2, temperature=temperature, replay=True)
    assert {"sampled_accept_len", "replay_accept_len_0", "replay_accept_len_1", "replay_accept_len"} <= m.keys()
    assert m["replay_accept_len_0"] >= 1  # the bonus token at least, every verify step


def test_a_replay_at_temperature_0_is_refused():
    with pytest.raises(LabError, match="^the replay needs the temperature the target's tokens were sampled at$"):
        evaluate(_drafter(), torch.randn(V, H), _sequences((9, 12), first_loss=2), 2, temperature=0.0, replay=True)


@pytest.mark.parametrize("kwargs, message", [
    ({"temperature": -0.5}, "the temperature must be a finite number >= 0, got -0.5"),
    ({"temperature": math.nan}, "the temperature must be a finite number >= 0, got nan"),
    ({"max_length": 0}, "max_length must be at least 1, got 0"),
])
def test_a_negative_temperature_or_no_max_length_is_refused_not_read_as_a_default(kwargs, message):
    """They read as greedy and as the drafter's max_position_embeddings: a metric of another setting."""
    with pytest.raises(LabError, match=f"^{message}$"):
        evaluate(_drafter(), torch.randn(V, H), _sequences((9, 12), first_loss=2), 2, **kwargs)


def test_evaluate_runs_the_drafter_in_eval_mode():
    drafter = _drafter().train()
    modes = []
    drafter.fc.register_forward_hook(lambda mod, args, out: modes.append(drafter.training))
    evaluate(drafter, torch.randn(V, H), _sequences((9, 12), first_loss=2), 2)
    assert modes and not any(modes)
    assert drafter.training
