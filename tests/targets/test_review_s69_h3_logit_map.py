"""LogitMap equality with a head bias: by value, where == of two bias tensors raised (session 69, h3)."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from drafter_lab.targets.hf import LogitMap


def test_logit_maps_compare_their_bias_by_value():
    """The dataclass's == took the bias tensors' elementwise == as a truth value: a RuntimeError for two
    tensors of several rows (equal or not), where one tensor on both sides compared."""
    bias = torch.arange(4.0)
    a = LogitMap(2.0, 30.0, bias, 3)
    assert a == LogitMap(2.0, 30.0, bias.clone(), 3)
    assert a == LogitMap(2.0, 30.0, bias.to(torch.bfloat16), 3)  # the map adds it in the logits' dtype
    assert hash(a) == hash(LogitMap(2.0, 30.0, bias.clone(), 3))
    for other in (LogitMap(2.0, 30.0, bias + 1, 3), LogitMap(2.0, 30.0, bias[:3], 3), LogitMap(2.0, 30.0, None, 3),
                  LogitMap(4.0, 30.0, bias, 3), LogitMap(2.0, None, bias, 3), LogitMap(2.0, 30.0, bias, None)):
        assert (a == other) is False and (other == a) is False and a != other
    assert LogitMap(bias=None) == LogitMap() and LogitMap() != LogitMap(bias=torch.zeros(4))
    nan = LogitMap(bias=torch.full((2,), torch.nan))
    assert nan == nan  # one map is itself, as the generated == had it
    assert a != "LogitMap" and a.__eq__(1) is NotImplemented


def test_a_scaling_of_0_is_none_and_one_of_2_scales():
    """0 is an unset field (Granite's logits_scaling divides: 1 / 0 raised); 1 and 2 are values like any."""
    assert LogitMap.of(SimpleNamespace(logits_scaling=0, logit_scale=0, logits_mup_width_multiplier=0)) == LogitMap()
    assert LogitMap.of(SimpleNamespace(logits_scaling=2, logit_scale=1)) == LogitMap(0.5)
