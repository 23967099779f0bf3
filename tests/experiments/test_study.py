"""The study's pieces on a real (random) HF Llama: step-0 validation, thread scoping, cache keys."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from drafter_lab.experiments import report, study
from drafter_lab.experiments.config import get_config
from drafter_lab.train.config import UNKEYED_DEFAULTS, TrainConfig
from drafter_lab.train.loop import train
from drafter_lab.train.metrics_log import read_metrics

CFG = TrainConfig(draft_vocab_size=64, max_steps=4, epochs=10, batch_size=4, ttt_steps=2, warmup_steps=1,
                  log_every=2, eval_every=2, eval_at_start=True, threads=1)


def test_eval_at_start_records_the_initial_weights(random_llama, features, tmp_path):
    """The step-0 row is the fresh drafter's validation: loss_0 near ln N, then training moves it."""
    from drafter_lab.data.shards import FeatureSet
    from drafter_lab.drafter.checkpoint import load_drafter
    from drafter_lab.drafter.model import Eagle3Drafter
    from drafter_lab.targets.hf import load_target
    from drafter_lab.train.metrics import evaluate

    out = tmp_path / "run"
    train(CFG, random_llama, features, out)
    val = [r for r in read_metrics(out) if r["split"] == "val"]
    assert [r["step"] for r in val] == [0, 2, 4]

    trained = load_drafter(out)
    torch.manual_seed(CFG.seed)  # the loop's seeded init, rebuilt independently
    fresh = Eagle3Drafter(trained.config)
    fresh.load_state_dict({**fresh.state_dict(), "embed_tokens.weight": trained.embed_tokens.weight,
                           "d2t": trained.d2t, "t2d": trained.t2d})
    target = load_target(random_llama, tokenizer=False)
    before = evaluate(fresh, target.lm_head_weight(), FeatureSet(features).require("val"), CFG.ttt_steps)
    assert val[0]["loss_0"] == pytest.approx(before["loss_0"], rel=1e-5)
    assert val[0]["cond_acc_0"] == pytest.approx(before["cond_acc_0"], abs=1e-9)
    assert abs(val[0]["loss_0"] - math.log(CFG.draft_vocab_size)) < 0.5
    assert val[-1]["loss_0"] != val[0]["loss_0"]


def test_step0_row_is_the_early_loss(random_llama, features, tmp_path):
    """The report's "(c) starts at loss X" reads the step-0 validation, not the first train average."""
    out = tmp_path / "run"
    train(CFG, random_llama, features, out)
    arm = study.Arm("c", "(c)", history=read_metrics(out))
    start = next(r for r in arm.history if r["split"] == "val" and r["step"] == 0)
    first_train = next(r for r in arm.history if r["split"] == "train")
    assert report._early_loss(arm) == start["loss_0"] != first_train["loss_0"]


def test_train_config_of_the_study():
    cfg = get_config("tiny-cpu")
    t = study._train_config(cfg, cfg.arm_steps)
    assert (t.max_steps, t.threads, t.eval_at_start, t.seed) == (cfg.arm_steps, cfg.threads, True, cfg.seed)


def test_source_key_ignores_what_does_not_change_results(tmp_path, monkeypatch):
    cfg = get_config("tiny-cpu")
    feats = tmp_path / "abc"
    key = study._source_key(feats, cfg)
    # Pinned: a new TrainConfig field that does not change results must not retrain every cached
    # source drafter (scan_features once did). Change the pin only with a field that does.
    assert key == "ef3c404f52294185"
    assert study._source_key(feats, type(cfg)(**{**cfg.__dict__, "threads": 2})) == key
    kept = dataclasses.replace(study._train_config(cfg, cfg.source_steps), keep_best="loss_0")
    with monkeypatch.context() as m:
        m.setattr(study, "_train_config", lambda *_: kept)
        assert study._source_key(feats, cfg) == key
    assert all(getattr(study._train_config(cfg, 1), k) == v for k, v in UNKEYED_DEFAULTS.items())
    monkeypatch.setattr(study, "UNKEYED_DEFAULTS", {})  # keyed, those fields would retrain every cached source
    assert study._source_key(feats, cfg) != key
    assert study._source_key(feats, type(cfg)(**{**cfg.__dict__, "source_steps": cfg.source_steps + 1})) != key
    assert study._source_key(tmp_path / "abd", cfg) != key


def test_features_cached_under_the_legacy_fingerprint_are_found(random_llama, tmp_path, monkeypatch):
    """A study's captures are cached by the target's fingerprint: one that a lab fingerprinting targets the
    older way began is resumed, not captured again beside it (hours on a real target)."""
    from drafter_lab.targets import fingerprint

    prompts, cache, cfg = tmp_path / "prompts.jsonl", tmp_path / "cache", get_config("smoke")
    prompts.write_text("{}\n")
    monkeypatch.setattr(study, "prepare_features", lambda target, p, out, **settings: None)
    fresh = study._features(random_llama, prompts, cache, cfg)
    with monkeypatch.context() as older:
        older.setattr(fingerprint, "fingerprint", fingerprint.legacy_fingerprint)
        began = study._features(random_llama, prompts, cache, cfg)
    assert began != fresh and study._features(random_llama, prompts, cache, cfg) == fresh
    began.mkdir(parents=True)
    assert study._features(random_llama, prompts, cache, cfg) == began
