"""keep_best: the drafter of the best validation so far, whole in <out>/best, through kills and resumes."""

from __future__ import annotations

import dataclasses
import json
import socket
import subprocess
import sys

import pytest
import torch

from drafter_lab.cli import main
from drafter_lab.spec.pairing import load_for_target
from drafter_lab.targets.hf import load_target
from drafter_lab.train import loop
from drafter_lab.train.config import TrainConfig
from drafter_lab.train.loop import train
from drafter_lab.train.metrics_log import read_metrics

# Validations at steps 0, 2, 4, 6 and 8 (and at the epoch's end, if one falls inside).
CFG = TrainConfig(draft_vocab_size=128, batch_size=4, max_steps=8, ttt_steps=2, warmup_steps=0, eval_every=2,
                  eval_at_start=True, log_every=4, threads=1)


class _Killed(Exception):
    pass


def _scripted(monkeypatch, script: dict, kill_at: int | None = None) -> dict:
    """Feeds keep_if_best the validation metric `script[step]` (0 where unscripted) in place of the
    measured one, so that the best is known in advance; returns the weights seen at each validation.
    With `kill_at`, the run dies right after that step's validation has been kept (or not)."""
    weights: dict = {}
    real = loop._Run.keep_if_best

    def keep(self, m):
        weights[self.step] = {k: v.clone() for k, v in self.drafter.state_dict().items()}
        real(self, {**m, self.cfg.keep_best: script.get(self.step, 0.0)})
        if self.step == kill_at:
            raise _Killed

    monkeypatch.setattr(loop._Run, "keep_if_best", keep)
    return weights


def _best(out) -> dict:
    return json.loads((out / "best" / "best.json").read_text())


@pytest.mark.parametrize("metric, script", [
    ("simulated_accept_len", {0: 1.0, 2: 3.0, 4: 2.0, 6: 3.0, 8: 1.5}),  # higher is better; a tie keeps step 2
    ("loss_0", {0: 3.0, 2: 1.0, 4: 2.0, 6: 1.0, 8: 2.5}),  # lower is better
])
def test_the_best_validations_drafter_is_kept(monkeypatch, tmp_path, peaked_llama, features, metric, script):
    weights = _scripted(monkeypatch, script)
    out = tmp_path / "run"
    train(dataclasses.replace(CFG, keep_best=metric), peaked_llama, features, out)
    assert set(script) <= set(weights)
    best = _best(out)
    assert (best["metric"], best["value"], best["step"]) == (metric, script[2], 2)
    target = load_target(peaked_llama, tokenizer=False)
    kept = load_for_target(out / "best", target)  # the pairing check reads best/run.json
    for k, v in kept.state_dict().items():
        assert torch.equal(v, weights[2][k]), k
    assert not torch.equal(kept.fc.weight, weights[8]["fc.weight"])  # the last weights went to <out> only


@pytest.mark.parametrize("script", [
    {0: 0.1, 2: 0.5, 4: 0.2, 6: 0.4, 8: 0.3},  # kept at step 2, before step 4's checkpoint
    {0: 0.1, 2: 0.5, 4: 0.2, 6: 0.9, 8: 0.3},  # kept at step 6, after it: the killed attempt's best stays
])
def test_a_killed_run_resumes_to_the_same_best(monkeypatch, tmp_path, peaked_llama, features, script):
    """Killed after step 6's validation, resumed from step 4's state. Each script's later values stay
    under its best, so a resume that forgot the kept drafter would keep another."""
    cfg = dataclasses.replace(CFG, checkpoint_every=4, keep_best="cond_acc_0")
    with monkeypatch.context() as m:
        _scripted(m, script)
        train(cfg, peaked_llama, features, tmp_path / "full")
    with monkeypatch.context() as m:
        _scripted(m, script, kill_at=6)
        with pytest.raises(_Killed):
            train(cfg, peaked_llama, features, tmp_path / "run")
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    # as a killed writer of best/ leaves it (its process is gone)
    stale = tmp_path / "run" / f".best.{int(gone.stdout)}@{socket.gethostname()}.k1ll3d_.tmp"
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"partial")
    _scripted(monkeypatch, script)
    train(cfg, peaked_llama, features, tmp_path / "run", resume=True)
    assert not stale.exists()
    best = _best(tmp_path / "run")
    assert best == _best(tmp_path / "full") and best["step"] == max(script, key=script.get)
    for name in ("model.safetensors", "config.json", "run.json"):
        assert (tmp_path / "run" / "best" / name).read_bytes() == (tmp_path / "full" / "best" / name).read_bytes()


def test_a_resume_may_change_the_metric(monkeypatch, tmp_path, peaked_llama, features):
    cfg = dataclasses.replace(CFG, checkpoint_every=4, keep_best="cond_acc_0")
    with monkeypatch.context() as m:
        _scripted(m, {2: 0.9}, kill_at=6)
        with pytest.raises(_Killed):
            train(cfg, peaked_llama, features, tmp_path / "run")
    assert _best(tmp_path / "run")["step"] == 2
    _scripted(monkeypatch, {2: 0.5, 4: 0.5, 6: 0.7, 8: 0.6})
    train(dataclasses.replace(cfg, keep_best="loss_0"), peaked_llama, features, tmp_path / "run", resume=True)
    # Resumed from step 4's state: loss_0's best counts from the replayed step 6 on.
    assert [r["step"] for r in read_metrics(tmp_path / "run") if r["split"] == "val"] == [0, 2, 4, 6, 8]
    assert (_best(tmp_path / "run")["metric"], _best(tmp_path / "run")["step"]) == ("loss_0", 8)


def test_an_unknown_metric_is_one_line(tmp_path, peaked_llama, features, capsys):
    code = main(["train", "--target", str(peaked_llama), "--data", str(features), "--out", str(tmp_path / "bad"),
                 "--keep-best", "accept_len", "--max-steps", "1"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0 and "'accept_len' is not a validation metric" in err
    assert "simulated_accept_len" in err and not (tmp_path / "bad").exists()


def test_a_resumed_run_purges_the_killed_attempts_tensorboard_events(monkeypatch, tmp_path, peaked_llama, features):
    """The steps after the checkpoint are logged again on resume: events of them from the killed attempt
    must go (SummaryWriter's purge_step), or TensorBoard draws two curves over those steps."""
    import types

    opened = []

    class Writer:  # records what the run asks of TensorBoard (the package is not installed here)
        def __init__(self, log_dir, purge_step=None):
            opened.append(purge_step)

        def add_scalar(self, *args):
            pass

        def flush(self):
            pass

        def close(self):
            pass

    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", types.SimpleNamespace(SummaryWriter=Writer))
    cfg = dataclasses.replace(CFG, checkpoint_every=4, keep_best="cond_acc_0", tensorboard=True)
    with monkeypatch.context() as m:
        _scripted(m, {}, kill_at=6)
        with pytest.raises(_Killed):
            train(cfg, peaked_llama, features, tmp_path / "run")
    train(cfg, peaked_llama, features, tmp_path / "run", resume=True)
    assert opened == [None, 5]  # a fresh run purges nothing; the resume, everything after step 4's checkpoint
