"""Pins from the s65 mutation audit of spec/sampling.py and spec/phases.py."""

from __future__ import annotations

import pytest
import torch

from drafter_lab.spec import phases
from drafter_lab.spec.phases import PhaseClock
from drafter_lab.spec.sampling import accept_probability, one_hot, probs_from_logits, residual, sample


def test_small_temperatures_above_the_floor_are_honoured():
    # 1e-6 is a valid temperature: logits 1e-4 apart are then 100 nats apart, nowhere near a coin flip
    p = probs_from_logits(torch.tensor([[1.0, 1.0 - 1e-4]]), 1e-6)
    assert p[0, 0] == pytest.approx(1.0) and p[0, 1] < 1e-6


def test_low_precision_logits_give_fp32_probabilities():
    logits = torch.tensor([[0.1, 0.2, 5.0, 5.01]]).bfloat16()
    p = probs_from_logits(logits, 0.7)
    assert p.dtype == torch.float32
    assert torch.allclose(p, torch.softmax(logits.float() / 0.7, -1), atol=1e-7)


def test_residual_is_normalised_and_one_hot_is_a_distribution():
    p = torch.tensor([[0.5, 0.3, 0.2]])
    r = residual(p, one_hot(torch.tensor([0]), 3))
    assert torch.allclose(r, torch.tensor([[0.0, 0.6, 0.4]]))
    assert one_hot(torch.tensor([1, 2]), 3).sum(-1).tolist() == [1.0, 1.0]


def test_per_pass_ms_uses_each_decodes_own_pass_count():
    result = {"verify_passes": 4, "decode_passes": 10,
              "phase_seconds": {"spec": {"verify": 0.008, "prefill": 0.002}, "baseline": {"verify": 0.02}}}
    assert phases.per_pass_ms(result, "spec") == pytest.approx({"verify": 2.0, "prefill": 0.5})
    assert phases.per_pass_ms(result, "baseline") == pytest.approx({"verify": 2.0})
    # a decode that stopped in its prefill made no passes: its time is not divided by zero
    result["verify_passes"] = 0
    assert phases.per_pass_ms(result, "spec") == pytest.approx({"verify": 8.0, "prefill": 2.0})


def test_a_clock_without_marks_reads_no_events():
    clock = PhaseClock(torch.device("cpu"))
    clock.cuda = True  # as on CUDA: with no marks there is no last event to wait on
    assert clock.elapsed() == [] and clock.seconds() == {}


def test_accept_probability_is_zero_not_nan_where_both_give_x_no_mass():
    # q(x) can underflow to 0 in fp32 for a token drawn at a tiny temperature; p(x) = 0 must still reject
    p = torch.tensor([[0.0, 1.0], [0.5, 0.5]])
    q = torch.tensor([[0.0, 1.0], [0.25, 0.75]])
    assert accept_probability(p, q, torch.tensor([0, 0])).tolist() == [0.0, 1.0]


def test_residual_of_rounding_noise_is_p_not_the_noise():
    # p and q equal but for fp32 rounding far below any real probability: renormalising the noise would
    # put all the mass on a token the target gives 2e-13
    p = torch.tensor([[2e-13, 1.0]])
    q = torch.tensor([[1e-13, 1.0]])
    assert torch.equal(residual(p, q), p)


def test_sample_draws_from_the_given_generator_not_the_global_rng():
    # a seeded decode (--seed) must repeat whatever else has used the global RNG meanwhile
    p = torch.full((64, 50), 1 / 50)
    torch.manual_seed(1)
    a = sample(p, torch.Generator().manual_seed(7))
    torch.manual_seed(2)
    b = sample(p, torch.Generator().manual_seed(7))
    assert torch.equal(a, b)
