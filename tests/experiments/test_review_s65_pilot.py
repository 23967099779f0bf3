"""The probe's pilot: the recipe it cuts, how it runs its two arms, and how its lead is written, with
`train` faked so that each case takes milliseconds (test_probe.py runs the real one)."""

from __future__ import annotations

import json

import pytest

from drafter_lab.drafter.config import DrafterConfig
from drafter_lab.experiments import pilot as pilot_mod
from drafter_lab.experiments.pilot import closing, lead_closing, pilot_config, points_text
from drafter_lab.train.config import TrainConfig

SOURCE = DrafterConfig(hidden_size=32, intermediate_size=96, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                       draft_vocab_size=100, target_vocab_size=300, target_hidden_size=64, norm_before_residual=True,
                       rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                     "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})


def test_the_pilot_recipe_is_the_sources_shape_validated_from_step_0_every_quarter():
    recipe = TrainConfig(warmup_steps=30, lr=1e-3, batch_size=4, seed=7)
    cfg = pilot_config(recipe, 20, SOURCE)
    assert (cfg.max_steps, cfg.eval_every, cfg.eval_at_start, cfg.scan_features) == (20, 5, True, False)
    assert cfg.warmup_steps == 4  # a fifth of the pilot at most: most of it runs near the peak rate
    assert (cfg.draft_vocab_size, cfg.drafter_hidden_size, cfg.drafter_intermediate_size, cfg.drafter_heads,
            cfg.drafter_kv_heads, cfg.drafter_head_dim) == (100, 32, 96, 2, 1, 16)
    assert cfg.drafter_norm_before_residual is True
    assert json.loads(cfg.drafter_rope_scaling) == SOURCE.rope_scaling
    assert (cfg.lr, cfg.batch_size, cfg.seed) == (1e-3, 4, 7)  # the recipe's own settings stay
    # a short recipe's warmup stays; a pilot under 4 steps still validates every step
    assert pilot_config(TrainConfig(warmup_steps=2), 100, SOURCE).warmup_steps == 2
    assert pilot_config(recipe, 3, SOURCE).eval_every == 1


@pytest.mark.parametrize("x, lines, text", [
    (0.00996, (0.01,), "+0.996"),  # under the 1-point line: not rounded up onto it
    (0.01, (0.01,), "+1.0"),
    (0.36149, (0.01,), "+36.1"),
    (-0.00049, (0.0,), "-0.05"),  # under 0, not "-0.0", which reads as on the line
    (0.123, (), "+12.3"),
])
def test_points_keep_their_side_of_each_line(x, lines, text):
    assert points_text(x, *lines) == text


def test_a_lead_closes_when_it_keeps_its_sign_and_falls_under_half():
    assert lead_closing(0.2, 0.09) and lead_closing(-0.2, -0.09)
    assert not lead_closing(0.2, 0.1)  # exactly half: not under it
    assert not lead_closing(0.2, -0.01)  # the sign flipped: no longer a lead that closes


def _pilot(*leads):
    return {"curve": [{"step": 5 * i, "scratch_cond_acc_0": 0.3, "transfer_cond_acc_0": 0.3 + x}
                      for i, x in enumerate(leads)]}


def test_closing_reads_the_first_validation_after_step_0():
    assert not closing(_pilot(0.0, 0.2, 0.05, 0.15))  # 0.15 of 0.2: not under half
    assert closing(_pilot(0.0, 0.2, 0.35, 0.09))  # measured from 0.2, not from the later 0.35


def _fake_train(calls: list, vals: dict):
    def train(cfg, target_dir, data_dir, out, **kw):
        calls.append((out.name, kw))
        out.mkdir(parents=True, exist_ok=True)
        return {}

    def read_metrics(arm_dir):
        return [{"split": "train", "step": 1, "cond_acc_0": 9.0},
                *({"split": "val", "step": s, "cond_acc_0": a, "simulated_accept_len": 1 + a}
                  for s, a in vals[arm_dir.name].items())]
    return train, read_metrics


def test_run_pilot_trains_scratch_and_transfer_alike_but_for_the_source(tmp_path, monkeypatch):
    calls = []
    # the transfer arm lacks a validation at step 6: the curve keeps the steps both arms measured
    vals = {"scratch": {0: 0.1, 3: 0.2, 6: 0.25, 9: 0.3}, "transfer": {0: 0.4, 3: 0.5, 9: 0.45}}
    train, read_metrics = _fake_train(calls, vals)
    monkeypatch.setattr(pilot_mod, "train", train)
    monkeypatch.setattr(pilot_mod, "read_metrics", read_metrics)
    cfg = TrainConfig(max_steps=9, batch_size=3)
    out = pilot_mod.run_pilot("src", "tgt", "data", cfg, out_dir=tmp_path, transfer_lr_scale=0.5,
                              target="HEAD", val_data="VAL", source_target="SRC_TGT")
    assert [name for name, _ in calls] == ["scratch", "transfer"]
    scratch, transfer = (kw for _, kw in calls)
    assert scratch == {"resume": True, "init_from": None, "transfer_lr_scale": 1.0, "target": "HEAD",
                       "val_data": "VAL", "source_target": None}
    assert transfer == {**scratch, "init_from": "src", "transfer_lr_scale": 0.5, "source_target": "SRC_TGT"}
    assert [r["step"] for r in out["curve"]] == [0, 3, 9]
    assert out["curve"][-1] == {"step": 9, "scratch_cond_acc_0": 0.3, "transfer_cond_acc_0": 0.45,
                                "scratch_simulated_accept_len": 1.3, "transfer_simulated_accept_len": 1.45}
    assert out["gain"] == pytest.approx(0.45 - 0.3)  # at the last step, not the best or the first
    assert (out["steps"], out["batch_size"], out["transfer_lr_scale"]) == (9, 3, 0.5)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["scratch", "transfer"]  # out_dir keeps the arms


def test_run_pilot_without_out_dir_leaves_nothing_behind(tmp_path, monkeypatch):
    calls = []
    train, read_metrics = _fake_train(calls, {"scratch": {0: 0.1, 4: 0.2}, "transfer": {0: 0.1, 4: 0.3}})
    monkeypatch.setattr(pilot_mod, "train", train)
    monkeypatch.setattr(pilot_mod, "read_metrics", read_metrics)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(pilot_mod.tempfile, "tempdir", None)  # re-read TMPDIR
    out = pilot_mod.run_pilot("src", "tgt", "data", TrainConfig(max_steps=4))
    assert out["gain"] == pytest.approx(0.1)
    assert list(tmp_path.iterdir()) == []
