"""A study's served evaluations past the target's positions are refused once its pair is built, before
any stage trains: each was refused at its start, after the arms had trained for hours."""

from __future__ import annotations

import dataclasses

import pytest

from drafter_lab.errors import LabError
from drafter_lab.experiments import study
from drafter_lab.experiments.config import get_config, level_name


def _cfg(**kw):
    return dataclasses.replace(get_config("smoke"), **{"served_eval": True, "served_prompts": 2, "device": "cpu", **kw})


def test_the_check_says_what_the_served_eval_would(random_llama, source, conversations_writer, tmp_path):
    prompts = conversations_writer(tmp_path / "eval.jsonl", 3)
    cfg = _cfg(served_steps=2000)
    with pytest.raises(LabError) as checked:
        study._check_served(cfg, random_llama, prompts)
    with pytest.raises(LabError) as served:
        study._served(cfg, source, random_llama, prompts)
    assert str(checked.value) == str(served.value)
    assert str(checked.value).startswith("served_steps 2000 with max_new_tokens")
    study._check_served(_cfg(served_steps=4), random_llama, prompts)  # within the positions: nothing said
    study._check_served(_cfg(served_steps=2000, served_eval=False), tmp_path / "no-target", prompts)


def test_a_level_refuses_before_its_data_is_captured(random_llama, conversations_writer, tmp_path, monkeypatch):
    cfg, cache = _cfg(served_steps=2000), tmp_path / "cache"
    pair_dir = cache / "pairs" / f"{cfg.target_preset}-drift{level_name(1.0)}"
    pair_dir.mkdir(parents=True)
    (pair_dir / "tuned").symlink_to(random_llama)
    conversations_writer(pair_dir / "prompts-eval.jsonl", 3)
    monkeypatch.setattr(study, "build_pair", lambda *a, **k: {})
    monkeypatch.setattr(study, "_features", lambda *a: pytest.fail("captured data for a study it then refuses"))
    with pytest.raises(LabError, match="^served_steps 2000 with max_new_tokens"):
        study.run_level(cfg, 1.0, tmp_path / "level", cache)
