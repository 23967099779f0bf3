"""Mutation audit of train/loop.py fit and train_step (s75): the first diverged step is the one named even
where its loss was exactly zero; each step trains at the lr its train line reports; an epoch's end is
checkpointed; a run closes its TensorBoard writer; a step divides by the positions of every rank; a rank
other than 0 runs to its end without a TensorBoard writer."""

from __future__ import annotations

import copy
import sys
import types

import pytest
import torch

from drafter_lab.errors import LabError
from drafter_lab.train import loop, state
from drafter_lab.train.config import TrainConfig
from drafter_lab.train.distributed import Dist
from drafter_lab.train.loop import train
from drafter_lab.train.metrics_log import read_metrics
from drafter_lab.train.ttt import TTTObjective

CFG = TrainConfig(draft_vocab_size=128, batch_size=4, max_steps=3, ttt_steps=1, warmup_steps=0, log_every=10,
                  eval_every=0, checkpoint_every=0, eval_batch_size=8, threads=1)


def test_the_first_diverged_step_is_named_even_where_its_loss_was_zero(monkeypatch, tmp_path, peaked_llama,
                                                                       features):
    """Steps 1-3 each overflow the gradient under a loss of exactly 0.0, checked only at step 3's line: the
    record of step 1 is marked by its step, not its loss, so the later steps do not overwrite it."""
    real = TTTObjective.forward

    def zero_loss(self, *a, **k):
        loss, counts = real(self, *a, **k)
        return loss * 0.0, counts

    monkeypatch.setattr(TTTObjective, "forward", zero_loss)
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", lambda params, clip: torch.tensor(float("inf")))
    with pytest.raises(LabError) as e:
        train(CFG, peaked_llama, features, tmp_path / "run")
    assert str(e.value) == (f"{tmp_path / 'run'}: gradient norm is inf at step 1: the run diverged (lower --lr); "
                            "no checkpoint was written")


def test_each_step_trains_at_the_lr_its_train_line_reports(monkeypatch, tmp_path, peaked_llama, features):
    """The line's lr is the schedule's formula; the optimizer's comes from the scheduler stepped after each
    step: through the warmup and the decay the two agree."""
    real, used = loop._Run.train_step, []

    def step(self, rows, parts):
        used.append(self.optim.param_groups[0]["lr"])
        real(self, rows, parts)

    monkeypatch.setattr(loop._Run, "train_step", step)
    cfg = TrainConfig(**{**CFG.__dict__, "max_steps": 5, "warmup_steps": 2, "log_every": 1})
    train(cfg, peaked_llama, features, tmp_path / "run")
    logged = [r["lr"] for r in read_metrics(tmp_path / "run") if r["event"] == "train"]
    assert logged[0] < logged[1] > logged[-1]  # up through the warmup, then down the decay
    assert used == pytest.approx(logged)


class _Killed(Exception):
    pass


def test_an_epochs_end_is_checkpointed(monkeypatch, tmp_path, peaked_llama, features):
    """Without checkpoint_every, a run killed early in its second epoch resumes from the first one's end
    (8 steps of 4 of the 36 train sequences), not from scratch."""
    real = loop._Run.train_step

    def step(self, rows, parts):
        if self.step == 9:
            raise _Killed
        real(self, rows, parts)

    monkeypatch.setattr(loop._Run, "train_step", step)
    cfg = TrainConfig(**{**CFG.__dict__, "max_steps": 0, "epochs": 2})
    with pytest.raises(_Killed):
        train(cfg, peaked_llama, features, tmp_path / "run")
    saved = state.load(tmp_path / "run")
    assert (saved["step"], saved["epoch"], saved["cursor"]) == (8, 1, 0)


def test_a_run_closes_its_tensorboard_writer(monkeypatch, tmp_path, peaked_llama, features):
    """SummaryWriter buffers its events: the run closes it, after its last scalar, or the end of the
    curves can be lost."""
    calls = []

    class Writer:  # records what the run asks of TensorBoard (the package is not installed here)
        def __init__(self, log_dir, purge_step=None):
            pass

        def add_scalar(self, tag, value, step):
            calls.append("add_scalar")

        def close(self):
            calls.append("close")

    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", types.SimpleNamespace(SummaryWriter=Writer))
    train(TrainConfig(**{**CFG.__dict__, "max_steps": 2, "tensorboard": True}), peaked_llama, features,
          tmp_path / "run")
    assert "add_scalar" in calls and calls[-1] == "close" and calls.count("close") == 1


def test_a_step_divides_by_the_positions_of_every_rank(monkeypatch, tmp_path, peaked_llama, features):
    """The loss of a step is over the global batch: its denominators are summed over the ranks. Here the
    sum says another rank holds as many positions as this one, so this rank's gradient is half its own
    batch's (one process: the all-reduce of DDP stood in for)."""
    seen = {}
    real = loop._Run.train_step

    def step(self, rows, parts):
        seen.update(obj=copy.deepcopy(self.obj), parts=parts)
        self.d.sum = lambda t: t * 2  # the only sum a step takes: its denominators
        try:
            real(self, rows, parts)
        finally:
            del self.d.sum
        seen["grads"] = {n: p.grad.clone() for n, p in self.drafter.named_parameters() if p.grad is not None}

    monkeypatch.setattr(loop._Run, "train_step", step)
    train(TrainConfig(**{**CFG.__dict__, "max_steps": 1, "grad_clip": 0.0}), peaked_llama, features, tmp_path / "run")
    (batch,) = seen["parts"]
    loss, _ = seen["obj"](batch)  # by this batch's own denominators
    loss.backward()
    ref = {n: p.grad for n, p in seen["obj"].drafter.named_parameters() if p.grad is not None}
    assert ref.keys() == seen["grads"].keys()
    for n, g in ref.items():
        torch.testing.assert_close(seen["grads"][n], g / 2, rtol=1e-4, atol=1e-6, msg=lambda m, n=n: f"{n}: {m}")


def test_a_rank_other_than_0_finishes_without_a_tensorboard_writer(monkeypatch, tmp_path, peaked_llama, features):
    """Rank 0 alone opens the writer (start_files); rank 1 of 2 never does, and must still get to its end.
    One process: the all-reduces stood in for by the identity (rank 0's files unread)."""
    real, done = loop._Run.fit, []

    def fit(self):
        self.d = Dist(rank=1, world=2, local_rank=1, device=torch.device("cpu"))
        self.d.sum = lambda t: t
        done.append(real(self))
        return done[-1]

    monkeypatch.setattr(loop._Run, "fit", fit)
    monkeypatch.setattr(Dist, "barrier", lambda self: None)
    train(TrainConfig(**{**CFG.__dict__, "max_steps": 2}), peaked_llama, features, tmp_path / "run")
    assert done and done[0]["step"] == 2
