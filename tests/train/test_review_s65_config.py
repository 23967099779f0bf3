"""TrainConfig checks at their edges: what check_config refuses and what it must let through, which
validation metrics keep_best may name, and which fields a resume may change."""

from __future__ import annotations

import dataclasses

import pytest

from drafter_lab import config as labconfig
from drafter_lab.errors import LabError
from drafter_lab.train.config import TrainConfig, check_config
from drafter_lab.train.loop import _check_resume_config


@pytest.mark.parametrize("over", [
    {"batch_tokens": 512, "batch_size": 0},  # batch_size is ignored where batch_tokens is set
    {"seed": 2**32 - 1},
    {"min_lr_ratio": 1.0, "adam_beta2": 0.0},
    {"min_lr_ratio": 0.0},
    {"grad_clip": 0.0, "checkpoint_every": 0, "warmup_steps": 0},  # 0: disabled
    {"val_temperature": 0.7, "keep_best": "sampled_accept_len"},
    {"ttt_steps": 5, "keep_best": "cond_acc_4"},
])
def test_settings_at_the_edge_are_accepted(over):
    check_config(TrainConfig(**over))


@pytest.mark.parametrize("over, message", [
    ({"seed": 2**32}, r"seed must be in \[0, 2\*\*32\), got 4294967296"),
    ({"loss_decay": float("inf")}, "loss_decay must be a finite number > 0, got inf"),
    ({"adam_beta2": 1.0}, r"adam_beta2 in \[0, 1\), got 0.1 and 1.0"),
    ({"ttt_steps": 0}, "ttt_steps must be >= 1, got 0"),
    ({"accumulation_steps": 0}, "accumulation_steps must be >= 1, got 0"),
    ({"checkpoint_every": -1}, "checkpoint_every must be >= 0 and finite, got -1"),
    ({"grad_clip": -1.0}, "grad_clip must be >= 0 and finite, got -1.0"),
    ({"threads": 100_000}, "threads must be at most"),
    ({"ttt_steps": 2, "keep_best": "cond_acc_4"}, "'cond_acc_4' is not a validation metric"),
    ({"keep_best": "step"}, "'step' is not a validation metric"),  # in the validation line, but no metric
    ({"drafter_intermediate_size": -1}, "drafter_intermediate_size must be >= 0 and finite, got -1"),
])
def test_settings_past_the_edge_are_refused(over, message):
    with pytest.raises(LabError, match=message):
        check_config(TrainConfig(**over))


def test_a_resume_may_change_speed_settings_but_not_the_seed(tmp_path):
    cfg = TrainConfig(seed=3)
    saved = labconfig.to_dict(cfg)
    _check_resume_config(saved, dataclasses.replace(cfg, threads=1, prefetch=False, keep_best="loss_0"), tmp_path)
    with pytest.raises(LabError, match=r"--resume with a different config \(seed\)"):
        _check_resume_config(saved, dataclasses.replace(cfg, seed=4), tmp_path)


def test_a_run_saved_before_the_newer_fields_resumes_at_their_defaults(tmp_path):
    cfg = TrainConfig()
    saved = {k: v for k, v in labconfig.to_dict(cfg).items()
             if k not in ("accumulation_steps", "val_temperature", "drafter_norm_before_residual",
                          "drafter_rope_scaling", "drafter_head_dim")}
    _check_resume_config(saved, cfg, tmp_path)
    with pytest.raises(LabError, match=r"\(drafter_head_dim\)"):
        _check_resume_config(saved, dataclasses.replace(cfg, drafter_head_dim=8), tmp_path)
