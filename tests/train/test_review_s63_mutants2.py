"""The lr a train line logs is the one its last optimizer step used, and an epoch validates once at its end
(mutation audit, round 2)."""

from __future__ import annotations

import pytest

from drafter_lab.data.shards import FeatureSet
from drafter_lab.train.config import TrainConfig
from drafter_lab.train.loop import train
from drafter_lab.train.metrics_log import read_metrics


def test_each_train_line_logs_the_lr_of_the_step_it_ends(peaked_llama, features, tmp_path):
    cfg = TrainConfig(draft_vocab_size=128, batch_size=4, max_steps=4, ttt_steps=1, lr=1e-3, warmup_steps=3,
                      min_lr_ratio=0.5, log_every=1, eval_every=0, eval_batch_size=8, threads=1)
    train(cfg, peaked_llama, features, tmp_path / "run")
    rows = [r for r in read_metrics(tmp_path / "run") if r["event"] == "train"]
    # warmup steps 1..3 ramp up to the peak; step 4 is the cosine's first, still at the peak
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert [r["lr"] for r in rows[:3]] == pytest.approx([1e-3 / 3, 2e-3 / 3, 1e-3])
    assert rows[3]["lr"] == pytest.approx(1e-3)


def test_a_validation_due_at_an_epochs_last_step_runs_once(peaked_llama, features, tmp_path):
    """The epoch's end validates anyway: an eval_every that lands on it must not validate a second time."""
    per_epoch = -(-len(FeatureSet(features).require("train")) // 4)
    cfg = TrainConfig(draft_vocab_size=128, batch_size=4, epochs=1, ttt_steps=1, warmup_steps=0, log_every=per_epoch,
                      eval_every=per_epoch, eval_batch_size=8, threads=1)
    train(cfg, peaked_llama, features, tmp_path / "run")
    assert [r["step"] for r in read_metrics(tmp_path / "run") if r["event"] == "val"] == [per_epoch]
