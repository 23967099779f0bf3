"""One optimizer step against a hand-computed reference: the loss a step backpropagates (its
weights, denominators, l2sp pull and clipping) and the counts its train line reports."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from drafter_lab.train import loop
from drafter_lab.train.config import TrainConfig
from drafter_lab.train.loop import train
from drafter_lab.train.metrics import CE_SUM, N_LOSS, N_VALID
from drafter_lab.train.metrics_log import read_metrics

CFG = TrainConfig(draft_vocab_size=128, batch_size=8, max_steps=1, ttt_steps=3, warmup_steps=0, eval_every=0,
                  log_every=1, threads=1)


def _last_step(monkeypatch, tmp_path, cfg, **kw):
    """Trains; returns the objective and anchors as they were before the last step, that step's
    micro-batches, the gradients it left on the drafter, and the train lines."""
    seen = {}
    real = loop._Run.train_step

    def spied(self, rows, parts):
        seen.update(obj=copy.deepcopy(self.obj), anchors={n: a.clone() for n, a in self.anchors.items()},
                    parts=parts, l2sp=self.l2sp)
        real(self, rows, parts)
        seen["grads"] = {n: p.grad.clone() for n, p in self.drafter.named_parameters() if p.grad is not None}

    monkeypatch.setattr(loop._Run, "train_step", spied)
    train(cfg, kw.pop("target"), kw.pop("data"), tmp_path / "run", **kw)
    return seen, [r for r in read_metrics(tmp_path / "run") if r["split"] == "train"]


def _reference(seen):
    """The objective on the step's one batch, by that batch's own denominators, plus the l2sp pull;
    its counts and gradients."""
    obj = seen["obj"]
    (batch,) = seen["parts"]
    loss, counts = obj(batch)
    params = dict(obj.drafter.named_parameters())
    pull = sum(((params[n] - a) ** 2).sum() for n, a in seen["anchors"].items())
    (loss + seen["l2sp"] * pull).backward()
    return counts, {n: p.grad for n, p in params.items() if p.grad is not None}


def _assert_grads(got, ref, scale=1.0):
    assert got.keys() == ref.keys()
    for n, g in ref.items():
        torch.testing.assert_close(got[n], g * scale, rtol=1e-4, atol=1e-6, msg=lambda m, n=n: f"{n}: {m}")


@pytest.mark.parametrize("clip", [0.0, 1e-3])
def test_one_steps_gradient_is_the_objectives_clipped_to_grad_clip(monkeypatch, tmp_path, peaked_llama, features,
                                                                  clip):
    seen, (line,) = _last_step(monkeypatch, tmp_path, dataclasses.replace(CFG, grad_clip=clip),
                               target=peaked_llama, data=features)
    counts, ref = _reference(seen)
    norm = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in ref.values()])))
    scale = clip / norm if clip > 0 else 1.0
    assert scale < 1e-2 or clip == 0  # the tiny clip really clips
    _assert_grads(seen["grads"], ref, scale)
    # the train line counts the step's positions once, and its loss is theirs
    assert line["positions"] == int(counts[0, N_VALID]) > 0
    assert line["loss_0"] == pytest.approx(float(counts[0, CE_SUM] / counts[0, N_LOSS]), rel=1e-5)


def test_the_l2sp_pull_joins_the_steps_gradient(monkeypatch, tmp_path, peaked_llama, features):
    train(CFG, peaked_llama, features, tmp_path / "source")
    # The second step: after the first the weights have left their anchors (at them the pull's gradient is 0).
    seen, _ = _last_step(monkeypatch, tmp_path, dataclasses.replace(CFG, grad_clip=0.0, max_steps=2),
                         target=peaked_llama, data=features, init_from=tmp_path / "source", l2sp=50.0)
    counts, ref = _reference(seen)
    assert seen["anchors"] and any(not torch.equal(p, seen["anchors"][n])
                                   for n, p in seen["obj"].drafter.named_parameters() if n in seen["anchors"])
    _assert_grads(seen["grads"], ref)


def test_a_run_past_its_first_epoch_counts_the_next(tmp_path, peaked_llama, features):
    """31 train sequences in batches of 8: step 5 is the second epoch's first (the epoch also seeds its order)."""
    train(dataclasses.replace(CFG, max_steps=5), peaked_llama, features, tmp_path / "run")
    lines = read_metrics(tmp_path / "run")
    assert [(r["step"], r["epoch"]) for r in lines if r["split"] == "train"] == [(1, 0), (2, 0), (3, 0), (4, 0), (5, 1)]
    assert [(r["step"], r["epoch"]) for r in lines if r["split"] == "val"] == [(4, 0), (5, 1)]
