"""A run killed before its first checkpoint resumes from scratch with none of the killed attempt's lines
left in metrics.jsonl, and is refused without --resume (mutation audit, s65 second pass)."""

from __future__ import annotations

import pytest

from drafter_lab.errors import LabError
from drafter_lab.train import loop
from drafter_lab.train.config import TrainConfig
from drafter_lab.train.loop import train
from drafter_lab.train.metrics_log import read_metrics

CFG = TrainConfig(draft_vocab_size=128, batch_size=4, max_steps=4, ttt_steps=1, warmup_steps=0, log_every=1,
                  eval_every=2, eval_batch_size=8, threads=1)


class _Killed(Exception):
    pass


def test_a_resume_without_a_checkpoint_drops_the_killed_attempts_lines(monkeypatch, tmp_path, peaked_llama, features):
    real = loop._Run.train_step

    def step(self, rows, parts):
        if self.step == 3:  # after train lines 1-3 and the validation at step 2; no checkpoint yet
            raise _Killed
        real(self, rows, parts)

    with monkeypatch.context() as m:
        m.setattr(loop._Run, "train_step", step)
        with pytest.raises(_Killed):
            train(CFG, peaked_llama, features, tmp_path / "run")
    assert [r["step"] for r in read_metrics(tmp_path / "run")] == [1, 2, 2, 3]
    # no train state yet, but metrics.jsonl marks it a run: a fresh start would wipe its lines
    with pytest.raises(LabError, match="already holds a training run: pass --resume"):
        train(CFG, peaked_llama, features, tmp_path / "run")
    train(CFG, peaked_llama, features, tmp_path / "run", resume=True)
    train(CFG, peaked_llama, features, tmp_path / "full")
    rows = read_metrics(tmp_path / "run")
    assert [(r["event"], r["step"]) for r in rows] == [(r["event"], r["step"]) for r in read_metrics(tmp_path / "full")]
    assert [(r["event"], r["step"]) for r in rows] == [("train", 1), ("train", 2), ("val", 2), ("train", 3),
                                                      ("train", 4), ("val", 4)]


def test_a_run_killed_before_its_final_validation_resumes_to_it(monkeypatch, tmp_path, peaked_llama, features):
    """Step 4's checkpoint (checkpoint_every 2) is at the last step, with step 3's validation: killed before
    the final one, the run is not finished, and a resume validates step 4 instead of returning step 3's."""
    import dataclasses

    cfg = dataclasses.replace(CFG, eval_every=3, checkpoint_every=2)
    real = loop._Run.validate

    def validate(self):
        if self.step == 4:
            raise _Killed
        return real(self)

    with monkeypatch.context() as m:
        m.setattr(loop._Run, "validate", validate)
        with pytest.raises(_Killed):
            train(cfg, peaked_llama, features, tmp_path / "run")
    final = train(cfg, peaked_llama, features, tmp_path / "run", resume=True)
    assert final["step"] == 4
    assert [r["step"] for r in read_metrics(tmp_path / "run") if r["event"] == "val"] == [3, 4]
