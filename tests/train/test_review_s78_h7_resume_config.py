"""_check_resume_config on real TrainConfig dicts: which differences refuse a --resume, which are left to a
later check, and how a field added after the run was saved compares."""
from __future__ import annotations

import dataclasses

import pytest

from drafter_lab import config as labconfig
from drafter_lab.errors import LabError
from drafter_lab.train.config import TrainConfig
from drafter_lab.train.loop import _check_resume_config

CFG = TrainConfig(draft_vocab_size=128, max_steps=4, threads=1)


def _saved(**over) -> dict:
    return labconfig.to_dict(dataclasses.replace(CFG, **over))


def test_a_setting_that_computes_another_run_is_refused_by_name(tmp_path):
    with pytest.raises(LabError, match=r"--resume with a different config \(lr\): the run would not be the same"):
        _check_resume_config(_saved(lr=1e-2), CFG, tmp_path)


def test_the_same_config_and_a_resumable_change_pass(tmp_path):
    _check_resume_config(_saved(), CFG, tmp_path)
    _check_resume_config(_saved(device="cuda", accumulation_steps=4), CFG, tmp_path)


def test_a_difference_left_to_a_later_check_passes_alone_and_is_named_with_another(tmp_path):
    _check_resume_config(_saved(draft_vocab_size=64), CFG, tmp_path, later=("draft_vocab_size",))
    with pytest.raises(LabError, match=r"different config \(draft_vocab_size, lr\)"):
        _check_resume_config(_saved(draft_vocab_size=64, lr=1e-2), CFG, tmp_path, later=("draft_vocab_size",))


def test_a_field_the_saved_run_lacks_compares_at_its_unkeyed_default(tmp_path):
    """A run saved before val_temperature existed validated greedily: it resumes at 0, not at 0.8."""
    old = {k: v for k, v in _saved().items() if k != "val_temperature"}
    _check_resume_config(old, CFG, tmp_path)
    with pytest.raises(LabError, match=r"different config \(val_temperature\)"):
        _check_resume_config(old, dataclasses.replace(CFG, val_temperature=0.8), tmp_path)
