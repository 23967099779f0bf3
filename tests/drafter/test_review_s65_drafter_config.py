"""Review s65 of drafter/config.py: what DrafterConfig.for_target takes from a target config that leaves
fields out, that overrides win, when the drafter owns its embedding, which attention shapes are refused,
and where the target's RoPE base is read from."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from drafter_lab.drafter.config import DrafterConfig, target_rope_theta


def _target(**fields):
    return SimpleNamespace(**{"hidden_size": 64, "num_attention_heads": 8, "vocab_size": 100, **fields})


def test_a_target_config_without_the_optional_fields_gets_the_llama_defaults():
    cfg = DrafterConfig.for_target(_target(), 32, [1, 2, 3])
    assert (cfg.intermediate_size, cfg.num_key_value_heads, cfg.head_dim) == (256, 8, 8)
    assert (cfg.rope_theta, cfg.rms_norm_eps, cfg.max_position_embeddings) == (10000.0, 1e-6, 4096)
    assert (cfg.draft_vocab_size, cfg.target_vocab_size, cfg.target_hidden_size) == (32, 100, 64)
    assert cfg.aux_layer_ids == [1, 2, 3] and not cfg.own_embedding


def test_the_targets_gqa_layout_and_the_overrides_are_kept():
    target = _target(num_key_value_heads=2, head_dim=16, intermediate_size=96, rope_theta=5e5)
    cfg = DrafterConfig.for_target(target, 32, [1], max_position_embeddings=512, hidden_size=48)
    assert (cfg.num_key_value_heads, cfg.head_dim, cfg.intermediate_size, cfg.rope_theta) == (2, 16, 96, 5e5)
    assert cfg.max_position_embeddings == 512
    # a drafter narrower than its target cannot use the target's embedding rows
    assert cfg.hidden_size == 48 and cfg.target_hidden_size == 64 and cfg.own_embedding


@pytest.mark.parametrize("heads, kv, head_dim, problem", [
    (8, 2, 6, None),  # GQA, even head_dim not a multiple of 4
    (8, 8, 10, None),
    (8, 3, 8, "num_attention_heads (8) is not a multiple of num_key_value_heads (3)"),
    (8, 4, 7, "head_dim 7 is odd: RoPE needs an even one"),
])
def test_attention_shapes_refused_are_exactly_the_unbuildable_ones(heads, kv, head_dim, problem):
    cfg = DrafterConfig.for_target(_target(num_attention_heads=heads, num_key_value_heads=kv, head_dim=head_dim), 8, [1])
    assert cfg.attention_problem() == problem


@pytest.mark.parametrize("fields, theta", [
    ({}, 10000.0),
    ({"rope_parameters": ["not", "a", "dict"]}, 10000.0),
    ({"rope_scaling": {"rope_type": "llama3", "rope_theta": 5e5}}, 5e5),
    # a top-level base wins over the per-layer-type ones
    ({"rope_parameters": {"rope_theta": 3e5, "sliding_attention": {"rope_theta": 1e4}}}, 3e5),
])
def test_the_targets_rope_base_is_read_where_it_is(fields, theta):
    assert target_rope_theta(SimpleNamespace(**fields)) == theta
