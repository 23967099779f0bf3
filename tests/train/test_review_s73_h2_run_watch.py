"""_Run.check_watch on a bare _Run over real metrics.jsonl files (the axis it measures the run's length on,
the verdict it writes, what a rank other than 0 learns), and when validate calls it, in a real run."""
from __future__ import annotations

import dataclasses
import errno
import json
import os
import types

import pytest
import torch

from drafter_lab.errors import LabError
from drafter_lab.train import loop
from drafter_lab.train.config import TrainConfig
from drafter_lab.train.loop import _Run, train
from drafter_lab.train.metrics_log import read_metrics
from drafter_lab.train.watch import WATCH_FILE, WatchConfig, judge, read_run

# The run's gap closes toward parity near 450 (on either axis: each row's train_tokens is its step).
BASE = {0: 0.0, 100: 0.50, 200: 0.60, 300: 0.66, 400: 0.70, 500: 0.72}
CLOSING = {200: 0.50, 300: 0.60, 400: 0.68}
FLAT = {0: 0.0, 100: 0.55, 200: 0.58, 300: 0.60, 400: 0.61}  # behind, not closing


def _run_dir(path, points):
    path.mkdir()
    rows = [{"event": "val", "split": "val", "step": s, "train_tokens": s, "cond_acc_0": v, "positions": 5}
            for s, v in points.items()]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _watching(tmp_path, points, axis="step", total=2000, total_tokens=2000, main=True, rank0_said=0.0):
    """A bare _Run at step 400 watching a baseline; a rank other than 0 learns `rank0_said` from the sum."""
    run = object.__new__(_Run)
    run.out_dir = _run_dir(tmp_path / "run", points)
    run.watch = (_run_dir(tmp_path / "base", BASE), dataclasses.replace(WatchConfig(), watch_axis=axis))
    run.step, run.total, run.total_tokens, run.stop_reason = 400, total, total_tokens, None
    run.d = types.SimpleNamespace(main=main, device=torch.device("cpu"),
                                  sum=(lambda t: t) if main else (lambda t: t + rank0_said))
    return run


@pytest.mark.parametrize("axis, total, total_tokens", [("step", 420, 2000), ("train_tokens", 2000, 420)])
def test_the_watch_measures_the_runs_length_on_its_own_axis(tmp_path, axis, total, total_tokens):
    """Parity near 450 comes after a run 420 long on the watch's axis (stop), not after one 2000 long."""
    run = _watching(tmp_path, CLOSING, axis, total, total_tokens)
    run.check_watch()
    assert "closing too slowly (parity near" in run.stop_reason and "after the run's 420)" in run.stop_reason
    verdict = json.loads((run.out_dir / WATCH_FILE).read_text())
    assert (verdict["step"], verdict["total_steps"], verdict["stop"]) == (400, total, True)
    assert (verdict["baseline"], verdict["config"]["watch_axis"]) == (str(tmp_path / "base"), axis)
    assert verdict["reason"] == run.stop_reason and [r["step"] for r in verdict["rows"]] == [200, 300, 400]


@pytest.mark.parametrize("points", [CLOSING, {100: 0.60, 200: 0.70}])  # closing in time; too early
def test_a_run_the_watch_keeps_training_writes_no_verdict(tmp_path, points):
    run = _watching(tmp_path, points, total=2000)
    run.check_watch()
    assert run.stop_reason is None and not (run.out_dir / WATCH_FILE).exists()


def test_a_run_behind_and_flat_is_stopped_with_its_reason(tmp_path):
    run = _watching(tmp_path, FLAT)
    run.check_watch()
    assert run.stop_reason.endswith("not closing") and "behind at steps 200 / 300 / 400" in run.stop_reason


@pytest.mark.parametrize("said, reason", [(1.0, "stopped by the watch on rank 0"), (0.0, None)])
def test_another_rank_stops_when_rank_0_says_so_and_judges_nothing(tmp_path, said, reason):
    run = _watching(tmp_path, FLAT, main=False, rank0_said=said)
    run.check_watch()
    assert run.stop_reason == reason and not (run.out_dir / WATCH_FILE).exists()


def test_a_verdict_that_cannot_be_written_is_one_line_naming_its_file(tmp_path, monkeypatch):
    def full(*a, **k):  # a disk full (tests run as root: a read-only directory would still be written)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    run = _watching(tmp_path, FLAT)
    monkeypatch.setattr(loop.atomic, "write_json", full)
    with pytest.raises(LabError, match=r"the watch's verdict cannot be written \(No space left on device\)$") as e:
        run.check_watch()
    assert str(run.out_dir / WATCH_FILE) in str(e.value)


def test_the_watch_does_not_judge_the_validation_at_the_runs_last_step(peaked_llama, features, tmp_path):
    """The run is over there: a verdict "stop" would mark a run that trained every step as stopped (watch.json,
    exit 3). With a window of 2, the validations at 4 and 8 of 8 steps are the first the watch could judge."""
    cfg = TrainConfig(draft_vocab_size=128, max_steps=8, batch_size=8, ttt_steps=2, lr=3e-3, warmup_steps=2,
                      log_every=4, eval_every=4, eval_batch_size=8, threads=1)
    wcfg = dataclasses.replace(WatchConfig(), watch_window=2)
    train(cfg, peaked_llama, features, tmp_path / "base")
    out = tmp_path / "slow"
    train(dataclasses.replace(cfg, lr=1e-7), peaked_llama, features, out, stop_if_behind=tmp_path / "base",
          watch=wcfg)
    assert [r["step"] for r in read_metrics(out) if r["split"] == "val"] == [4, 8]
    assert judge(read_run(out)[0], read_run(tmp_path / "base")[0], wcfg, None).stop  # judged, it would stop
    assert not (out / WATCH_FILE).exists()
