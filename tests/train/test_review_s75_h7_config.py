"""TrainConfig checks at the edges test_review_s65_config leaves open, and the field lists beside the
dataclass that other modules key caches and resumes on."""

from __future__ import annotations

import dataclasses

import pytest

from drafter_lab.errors import LabError
from drafter_lab.train.config import RESULT_FREE_FIELDS, UNKEYED_DEFAULTS, TrainConfig, check_config


@pytest.mark.parametrize("over", [
    {"batch_size": 1},
    {"batch_tokens": 1, "batch_size": 0},
    {"loss_decay": 1.5},
    {"min_lr_ratio": 0.5, "adam_beta2": 0.999},
    {"drafter_head_dim": 64},
    {"drafter_rope_scaling": '{"rope_type": "linear", "factor": 2.0}', "device": "cpu"},
    {"val_temperature": 0.7, "keep_best": "replay_accept_len_0"},  # whether replayed is the text's to say
])
def test_settings_inside_the_edge_are_accepted(over):
    check_config(TrainConfig(**over))


@pytest.mark.parametrize("over, message", [
    ({"batch_size": 0}, "batch_size must be >= 1 \\(or batch_tokens set\\), got 0"),
    ({"loss_decay": 0.0}, "loss_decay must be a finite number > 0, got 0.0"),
    ({"loss_decay": float("nan")}, "loss_decay must be a finite number > 0, got nan"),
    ({"min_lr_ratio": 1.5}, r"min_lr_ratio must be in \[0, 1\] .* got 1.5 and 0.95"),
    ({"min_lr_ratio": -0.1}, r"min_lr_ratio must be in \[0, 1\] .* got -0.1 and 0.95"),
    ({"adam_beta2": -0.1}, r"adam_beta2 in \[0, 1\), got 0.1 and -0.1"),
    ({"drafter_rope_scaling": '{"rope_type": "yarn", "factor": 2.0}'}, "drafter_rope_scaling: RoPE scaling 'yarn'"),
    ({"device": "tpu"}, "unknown device 'tpu'"),
    ({"keep_best": "sampled_accept_len"}, "'sampled_accept_len' is not a validation metric"),  # greedy runs
    ({"keep_best": "replay_accept_len_0"}, "'replay_accept_len_0' is not a validation metric"),
])
def test_settings_past_the_edge_are_refused(over, message):
    with pytest.raises(LabError, match=message):
        check_config(TrainConfig(**over))


def test_unkeyed_fields_default_to_the_value_cached_drafters_were_trained_at():
    """A study leaves these out of its cache key only at these values; a default elsewhere would train
    every new source otherwise than the cached one its key finds."""
    defaults = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
    assert {k: defaults[k] for k in UNKEYED_DEFAULTS} == UNKEYED_DEFAULTS
    assert set(RESULT_FREE_FIELDS) <= set(defaults)


def test_the_defaults_the_readme_states():
    """As README states them: K = 5, the 3-epoch default (no step budget cuts it), `--prefetch` on,
    `--online-val-cache-mb` 1024."""
    cfg = TrainConfig()
    assert (cfg.ttt_steps, cfg.epochs, cfg.max_steps, cfg.prefetch, cfg.online_val_cache_mb) == (5, 3, 0, True, 1024.0)
