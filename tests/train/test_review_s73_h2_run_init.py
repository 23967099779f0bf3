"""_Run.__init__'s checks of a run's inputs, on the shared features, before anything is written."""
from __future__ import annotations

import dataclasses

import pytest

from drafter_lab.errors import LabError
from drafter_lab.train.config import TrainConfig
from drafter_lab.train.loop import train
from drafter_lab.train.watch import WatchConfig

# Sampled validation names the replay's metrics, which only text of the target's own tokens can measure.
SAMPLED = TrainConfig(draft_vocab_size=128, max_steps=2, batch_size=8, ttt_steps=2, val_temperature=0.8, threads=1)


def test_a_replay_watch_metric_without_the_targets_own_tokens_is_refused_up_front(peaked_llama, features,
                                                                                   tmp_path):
    """Else the first validation's judge failed on the metric missing from the run's own metrics.jsonl."""
    base = tmp_path / "base"
    base.mkdir()
    (base / "metrics.jsonl").write_text("")  # a baseline that has not validated yet
    with pytest.raises(LabError, match="watch_metric: 'replay_accept_len' needs validation text of the target's own"):
        train(SAMPLED, peaked_llama, features, tmp_path / "out", stop_if_behind=base,
              watch=WatchConfig(watch_metric="replay_accept_len"))
    assert not (tmp_path / "out").exists()


def test_a_resume_with_a_setting_that_shapes_the_drafter_names_the_setting(peaked_llama, features, tmp_path):
    """The config is compared before the drafter it builds: another drafter_hidden_size was blamed on another
    lab or transformers version ("would build another drafter")."""
    cfg = TrainConfig(draft_vocab_size=128, max_steps=1, batch_size=8, ttt_steps=1, warmup_steps=0, threads=1)
    train(cfg, peaked_llama, features, tmp_path / "run")
    with pytest.raises(LabError, match=r"--resume with a different config \(drafter_hidden_size\)"):
        train(dataclasses.replace(cfg, drafter_hidden_size=32), peaked_llama, features, tmp_path / "run", resume=True)
