"""keep_best's refusals: a NaN or a validation that scored no position is never the best, and a resume
under another metric never compares against the old metric's record (mutation audit, s65 second pass)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from drafter_lab.train import loop
from drafter_lab.train.config import TrainConfig
from drafter_lab.train.loop import train

# Validations at steps 0, 2, 4, 6 and 8.
CFG = TrainConfig(draft_vocab_size=128, batch_size=4, max_steps=8, ttt_steps=2, warmup_steps=0, eval_every=2,
                  eval_at_start=True, log_every=4, threads=1, keep_best="cond_acc_0")


class _Killed(Exception):
    pass


def _scripted(monkeypatch, script: dict, positions: dict | None = None, kill_at: int | None = None) -> None:
    """keep_if_best sees metric `script[step]` (0 where unscripted) and, where `positions` says, that
    many scored positions in place of the measured ones."""
    real = loop._Run.keep_if_best

    def keep(self, m):
        over = {self.cfg.keep_best: script.get(self.step, 0.0)}
        if positions and self.step in positions:
            over["positions"] = positions[self.step]
        real(self, {**m, **over})
        if self.step == kill_at:
            raise _Killed

    monkeypatch.setattr(loop._Run, "keep_if_best", keep)


def _best(out) -> dict:
    return json.loads((out / "best" / "best.json").read_text())


def test_a_nan_validation_never_replaces_the_best(monkeypatch, tmp_path, peaked_llama, features):
    # NaN compares false both ways: let through, it would replace the best and any later value would beat it
    _scripted(monkeypatch, {0: float("nan"), 2: 0.4, 4: float("nan"), 6: 0.3, 8: 0.2})
    train(CFG, peaked_llama, features, tmp_path / "run")
    best = _best(tmp_path / "run")
    assert (best["step"], best["value"]) == (2, 0.4)


def test_a_validation_that_scored_no_position_is_not_the_best(monkeypatch, tmp_path, peaked_llama, features):
    _scripted(monkeypatch, {0: 0.1, 2: 0.3, 4: 0.9, 6: 0.2}, positions={4: 0})
    train(CFG, peaked_llama, features, tmp_path / "run")
    assert _best(tmp_path / "run")["step"] == 2


def test_a_resume_under_another_metric_ignores_the_old_record(monkeypatch, tmp_path, peaked_llama, features):
    """The old record (cond_acc_0 0.05 at step 2) is lower than every loss_0 to come: compared as a
    loss_0 it would block them all, and best/ would stay the cond_acc_0 drafter."""
    cfg = dataclasses.replace(CFG, checkpoint_every=4)
    with monkeypatch.context() as m:
        _scripted(m, {0: 0.01, 2: 0.05}, kill_at=6)
        with pytest.raises(_Killed):
            train(cfg, peaked_llama, features, tmp_path / "run")
    assert _best(tmp_path / "run")["metric"] == "cond_acc_0"
    _scripted(monkeypatch, {6: 2.0, 8: 1.5})
    train(dataclasses.replace(cfg, keep_best="loss_0"), peaked_llama, features, tmp_path / "run", resume=True)
    best = _best(tmp_path / "run")
    assert (best["metric"], best["step"], best["value"]) == ("loss_0", 8, 1.5)


def test_best_json_holds_the_validation_it_was_kept_by(tmp_path, peaked_llama, features):
    """spec costinputs prices a best/ by best.json's "validation": the metrics of the kept step's line."""
    from drafter_lab.train.metrics_log import read_metrics

    train(CFG, peaked_llama, features, tmp_path / "run")
    best = _best(tmp_path / "run")
    row = next(r for r in read_metrics(tmp_path / "run") if r["split"] == "val" and r["step"] == best["step"])
    assert best["validation"]["cond_acc_0"] == best["value"] == row["cond_acc_0"]
    assert {k: row[k] for k in best["validation"]} == best["validation"]
    assert {"positions", "loss_0", "simulated_accept_len"} <= set(best["validation"])


@pytest.mark.parametrize("value", ["", ', "value": "0.5"', ', "value": null', ', "value": true'])
def test_a_kept_record_without_a_numeric_value_is_one_line_at_resume(monkeypatch, tmp_path, peaked_llama, features,
                                                                     value):
    """The resume compares each validation with the record's value: one missing or not a number was a
    KeyError or TypeError traceback at the first validation, after the resume had begun."""
    from drafter_lab.errors import LabError

    cfg = dataclasses.replace(CFG, checkpoint_every=4)
    with monkeypatch.context() as m:
        _scripted(m, {2: 0.5}, kill_at=6)
        with pytest.raises(_Killed):
            train(cfg, peaked_llama, features, tmp_path / "run")
    record = tmp_path / "run" / "best" / "best.json"
    record.write_text('{"metric": "cond_acc_0", "step": 2' + value + "}")
    with pytest.raises(LabError, match="best.json"):
        train(cfg, peaked_llama, features, tmp_path / "run", resume=True)
