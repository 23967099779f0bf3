"""Session 73, lead: a target config.json that writes null for an optional size reads as one that leaves it out."""

from __future__ import annotations

from types import SimpleNamespace

from drafter_lab.drafter.config import DrafterConfig


def test_null_optional_fields_get_the_defaults_an_absent_one_gets():
    target = SimpleNamespace(hidden_size=64, num_attention_heads=8, vocab_size=100, intermediate_size=None,
                             rms_norm_eps=None, max_position_embeddings=None)
    cfg = DrafterConfig.for_target(target, 32, [1])
    assert (cfg.intermediate_size, cfg.rms_norm_eps, cfg.max_position_embeddings) == (256, 1e-6, 4096)


def test_a_null_max_position_embeddings_is_not_read_when_an_override_gives_one():
    target = SimpleNamespace(hidden_size=64, num_attention_heads=8, vocab_size=100, max_position_embeddings=None)
    assert DrafterConfig.for_target(target, 32, [1], max_position_embeddings=512).max_position_embeddings == 512


def test_given_fields_are_kept():
    target = SimpleNamespace(hidden_size=64, num_attention_heads=8, vocab_size=100, intermediate_size=96,
                             rms_norm_eps=1e-5, max_position_embeddings=2048)
    cfg = DrafterConfig.for_target(target, 32, [1])
    assert (cfg.intermediate_size, cfg.rms_norm_eps, cfg.max_position_embeddings) == (96, 1e-5, 2048)
