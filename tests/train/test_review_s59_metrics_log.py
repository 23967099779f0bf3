"""metrics.jsonl across a resume and a disk that fills mid-line: the log keeps matching the train state."""

from __future__ import annotations

import os

import pytest

from drafter_lab.errors import LabError
from drafter_lab.train.config import TrainConfig
from drafter_lab.train.loop import train
from drafter_lab.train.metrics_log import MetricsLog, read_metrics


def test_a_metrics_file_removed_since_its_checkpoint_is_refused_on_resume(peaked_llama, features, tmp_path,
                                                                         monkeypatch):
    """Resumed without it, the run logged on in a new file from the checkpoint's step: the rows before
    were lost without a word (a file cut short is refused; a removed one is cut to nothing)."""
    from drafter_lab.train import loop

    cfg = TrainConfig(draft_vocab_size=128, max_steps=3, batch_size=8, ttt_steps=2, warmup_steps=0, log_every=1,
                      eval_every=0, checkpoint_every=1, eval_batch_size=8, threads=1)
    out = tmp_path / "run"
    step = loop._Run.train_step

    def killed_at_step_2(run, *a):
        if run.step == 1:
            raise KeyboardInterrupt
        step(run, *a)

    with monkeypatch.context() as m:
        m.setattr(loop._Run, "train_step", killed_at_step_2)
        with pytest.raises(KeyboardInterrupt):
            train(cfg, peaked_llama, features, out)
    assert [r["step"] for r in read_metrics(out)] == [1]
    (out / "metrics.jsonl").unlink()
    with pytest.raises(LabError, match="missing, though its checkpoint recorded"):
        train(cfg, peaked_llama, features, out, resume=True)
    assert not (out / "metrics.jsonl").exists()
    MetricsLog(out / "metrics.jsonl").truncate(0)  # nothing recorded: nothing missing


def test_a_line_the_disk_took_in_part_is_finished_not_followed_by_the_next(tmp_path, monkeypatch):
    """os.write on a filling disk writes part of a line and returns its count; the next record was
    appended after the cut line, one line no reader parses."""
    log = MetricsLog(tmp_path / "metrics.jsonl")
    log.write({"step": 1})
    real, calls = os.write, []

    def short_once(fd, data):
        calls.append(len(data))
        return real(fd, bytes(data)[:5] if len(calls) == 1 else data)

    monkeypatch.setattr(os, "write", short_once)
    log.write({"step": 2, "loss_0": 1.5})
    monkeypatch.setattr(os, "write", real)
    log.write({"step": 3})
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3]
