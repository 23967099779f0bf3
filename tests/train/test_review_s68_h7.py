"""Mutation audit of train/loop.py (s68, second pass): a gradient that overflows under a finite loss stops the
run before its weights are written, with or without --grad-clip; TensorBoard gets each line's metrics and a
resume purges the killed attempt's events even without a checkpoint; train lines count from the one before;
a resume in a later epoch logs what an uninterrupted run does; bad train states, kept-best records and
splits too short to use are one line naming their file."""

from __future__ import annotations

import json
import math
import sys
import types
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from drafter_lab.errors import LabError
from drafter_lab.train import loop, state
from drafter_lab.train.config import TrainConfig
from drafter_lab.train.loop import train
from drafter_lab.train.metrics_log import read_metrics
from drafter_lab.train.ttt import TTTObjective

CFG = TrainConfig(draft_vocab_size=128, batch_size=4, max_steps=4, ttt_steps=1, warmup_steps=0, log_every=10,
                  eval_every=0, checkpoint_every=1, eval_batch_size=8, threads=1)


class _InfGrad(torch.autograd.Function):
    """The loss as it is, its gradient infinite: an overflow in the backward alone."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return g * math.inf


@pytest.mark.parametrize("grad_clip", [0.0, 1.0])
def test_an_infinite_gradient_under_a_finite_loss_writes_no_nan_weights(peaked_llama, features, tmp_path,
                                                                        monkeypatch, grad_clip):
    """Without --grad-clip the step's norm was its loss, finite: the optimizer made the weights NaN and
    step 3's checkpoint wrote them, then step 4 stopped the run saying that checkpoint was kept."""
    real, calls = TTTObjective.forward, [0]

    def overflow_at_step_3(self, *a, **k):
        loss, counts = real(self, *a, **k)
        if torch.is_grad_enabled():
            calls[0] += 1
            if calls[0] == 3:
                loss = _InfGrad.apply(loss)
        return loss, counts

    monkeypatch.setattr(TTTObjective, "forward", overflow_at_step_3)
    out = tmp_path / "run"
    with pytest.raises(LabError, match=r": gradient norm is (nan|inf) at step 3: the run diverged .*; "
                                       r"the last checkpoint, step 2, is kept$"):
        train(TrainConfig(**{**CFG.__dict__, "grad_clip": grad_clip}), peaked_llama, features, out)
    assert state.load(out)["step"] == 2
    assert all(t.isfinite().all() for t in load_file(str(out / "model.safetensors")).values())


class _Killed(Exception):
    pass


def _killed_at(monkeypatch, at: int, cfg: TrainConfig, *args) -> None:
    """`train(cfg, *args)` killed as its step `at` begins."""
    real = loop._Run.train_step

    def step(self, rows, parts):
        if self.step == at:
            raise _Killed
        real(self, rows, parts)

    with monkeypatch.context() as m:
        m.setattr(loop._Run, "train_step", step)
        with pytest.raises(_Killed):
            train(cfg, *args)


def _tensorboard(monkeypatch) -> dict:
    """A SummaryWriter that records what the run asks of TensorBoard (the package is not installed here):
    the purge_step of each writer opened and every scalar; like the real one, it makes its directory."""
    seen: dict = {"opened": [], "scalars": []}

    class Writer:
        def __init__(self, log_dir, purge_step=None):
            Path(log_dir).mkdir(parents=True, exist_ok=True)
            seen["opened"].append(purge_step)

        def add_scalar(self, tag, value, step):
            seen["scalars"].append((tag, value, step))

        def close(self):
            pass

    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", types.SimpleNamespace(SummaryWriter=Writer))
    return seen


def test_a_resume_without_a_checkpoint_purges_every_tensorboard_event_of_the_killed_attempt(monkeypatch, tmp_path,
                                                                                             peaked_llama, features):
    """metrics.jsonl loses all of a run killed before its first checkpoint; its TensorBoard events were kept,
    and the resume logged steps 1-3 a second time beside them (two curves over those steps)."""
    opened = _tensorboard(monkeypatch)["opened"]
    cfg = TrainConfig(**{**CFG.__dict__, "checkpoint_every": 0, "log_every": 1, "eval_every": 2,
                         "eval_at_start": True, "tensorboard": True})
    _killed_at(monkeypatch, 3, cfg, peaked_llama, features, tmp_path / "run")  # after the validations at 0 and 2
    train(cfg, peaked_llama, features, tmp_path / "run", resume=True)
    assert opened == [None, 0]  # step 0's validation too: the resume validates it again


def test_a_train_state_whose_weights_do_not_fit_names_its_file(peaked_llama, features, tmp_path):
    """The one error of a resume that named no file: which state was it, of which run?"""
    out = tmp_path / "run"
    cfg = TrainConfig(**{**CFG.__dict__, "max_steps": 2})
    train(cfg, peaked_llama, features, out)
    saved = state.load(out)
    del saved["model"]["fc.weight"]
    state.save(out, {**saved, "step": 1})  # not finished: the resume loads it
    with pytest.raises(LabError) as e:
        train(cfg, peaked_llama, features, out, resume=True)
    assert str(e.value) == f"{state.state_path(out)}: train state does not fit the drafter (fc.weight)"


def test_tensorboard_gets_every_metric_of_each_line_at_its_step(monkeypatch, tmp_path, peaked_llama, features):
    """Each train and val line's metrics, as metrics.jsonl has them, under split/name (the run's bookkeeping,
    lr and clock, and the position count are no curves)."""
    seen = _tensorboard(monkeypatch)
    cfg = TrainConfig(**{**CFG.__dict__, "max_steps": 3, "log_every": 2, "eval_every": 2, "tensorboard": True})
    train(cfg, peaked_llama, features, tmp_path / "run")
    bookkeeping = {"event", "split", "step", "epoch", "train_tokens", "lr", "elapsed_s", "positions"}
    want = [(f"{r['split']}/{k}", v, r["step"]) for r in read_metrics(tmp_path / "run") for k, v in r.items()
            if k not in bookkeeping]
    assert [(r["event"], r["step"]) for r in read_metrics(tmp_path / "run")] == [("train", 2), ("val", 2), ("train", 3),
                                                                                ("val", 3)]
    assert seen["scalars"] == [(tag, pytest.approx(v), step) for tag, v, step in want]
    assert {"train/loss_0", "train/cond_acc_0", "val/simulated_accept_len", "val/weighted_loss"} <= {t for t, _, _ in want}


def test_a_train_line_counts_the_steps_since_the_one_before(peaked_llama, features, tmp_path):
    """Lines every step add up to one line every 3 steps: each line starts its counts from zero."""
    rows = {}
    for every in (1, 3):
        cfg = TrainConfig(**{**CFG.__dict__, "max_steps": 3, "log_every": every, "checkpoint_every": 0})
        train(cfg, peaked_llama, features, tmp_path / f"every{every}")
        rows[every] = [r for r in read_metrics(tmp_path / f"every{every}") if r["event"] == "train"]
    assert [r["step"] for r in rows[1]] == [1, 2, 3] and [r["step"] for r in rows[3]] == [3]
    assert all(r["positions"] > 0 for r in rows[1])
    assert rows[3][0]["positions"] == sum(r["positions"] for r in rows[1])
    assert rows[3][0]["acc_0"] == pytest.approx(sum(r["acc_0"] * r["positions"] for r in rows[1])
                                                / rows[3][0]["positions"])


def test_sequences_too_short_to_train_on_are_one_line_naming_the_data(peaked_llama, features, tmp_path):
    """A max_length under 3 leaves no sequence to train on: the error says so, and writes nothing."""
    with pytest.raises(LabError) as e:
        train(TrainConfig(**{**CFG.__dict__, "max_length": 2}), peaked_llama, features, tmp_path / "run")
    assert str(e.value) == (f"{features}: no train or val sequence has 3 or more tokens within max_length 2: "
                            "nothing to train on")
    assert not (tmp_path / "run").exists()


def test_a_run_resumed_in_its_second_epoch_logs_what_the_uninterrupted_one_does(monkeypatch, tmp_path, peaked_llama,
                                                                                features):
    """The tokens read so far are recounted from the plan on resume (epoch 0 whole, then epoch 1 up to the
    cursor): every train line, tokens and metrics, equals the uninterrupted run's."""
    cfg = TrainConfig(**{**CFG.__dict__, "max_steps": 0, "epochs": 2, "log_every": 2, "checkpoint_every": 3})
    train(cfg, peaked_llama, features, tmp_path / "full")
    _killed_at(monkeypatch, 10, cfg, peaked_llama, features, tmp_path / "run")  # epoch 1, after step 9's checkpoint
    assert state.load(tmp_path / "run")["epoch"] == 1
    train(cfg, peaked_llama, features, tmp_path / "run", resume=True)

    def lines(run):
        return [{k: v for k, v in r.items() if k != "elapsed_s"} for r in read_metrics(tmp_path / run)]

    full = lines("full")
    assert [r["step"] for r in full if r["event"] == "val"] == [8, 16]  # each epoch's end
    assert lines("run") == full
    assert len({r["train_tokens"] for r in full if r["event"] == "train"}) == 8  # each line read more


def test_a_val_set_too_short_to_score_names_the_val_data(monkeypatch, peaked_llama, features, held_out, tmp_path):
    """With --val-data the empty split is that directory's, not --data's."""
    real, made = loop.Examples, []

    def examples(items, *a, **k):  # the train split's, then the validation's: as if all under 3 tokens
        made.append(items)
        return real(items if len(made) == 1 else [], *a, **k)

    monkeypatch.setattr(loop, "Examples", examples)
    with pytest.raises(LabError) as e:
        train(CFG, peaked_llama, features, tmp_path / "run", val_data=held_out[1])
    assert str(e.value) == (f"{held_out[1]}: no val sequence has 3 or more tokens within max_length 1024: "
                            "nothing to validate on")


@pytest.mark.parametrize("record", [[], {"value": 0.5}, {"step": "2", "value": 0.5}])
def test_a_kept_best_record_without_its_step_is_one_line(tmp_path, record):
    """Beside test_review_s65b_keep_best's values: a record that is no object, or has no integer step."""
    path = tmp_path / "best" / "best.json"
    path.parent.mkdir()
    path.write_text(json.dumps(record))
    with pytest.raises(LabError) as e:
        loop._kept_best(tmp_path, "cond_acc_0")
    assert str(e.value) == f"{path}: not the record of a kept drafter (a JSON object with its step and value)"
