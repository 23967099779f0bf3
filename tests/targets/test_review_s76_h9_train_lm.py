"""Review s76 (h9) of targets/train_lm.py: each step is the plain loop (the schedule's lr, fresh gradients,
clipped to norm 1, AdamW with betas (0.9, 0.95) and eps 1e-8), the model trains in train mode and is
left in eval mode, no CUDA autocast off CUDA, and the figures of short and empty runs."""

from __future__ import annotations

import contextlib
import types
import warnings
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from drafter_lab.targets import train_lm as tl


class Bigram(torch.nn.Module):
    """Scaled bigram logits plus a 1-d bias (gradients well over norm 1, so clipping shows); records the
    mode and CUDA autocast each forward ran under."""

    def __init__(self, vocab: int = 6, scale: float = 30.0):
        super().__init__()
        torch.manual_seed(0)
        self.table = torch.nn.Parameter(torch.randn(vocab, vocab))
        self.bias = torch.nn.Parameter(torch.randn(vocab))
        self.scale = scale
        self.seen: list[tuple[bool, bool]] = []

    def forward(self, input_ids):
        self.seen.append((self.training, torch.is_autocast_enabled("cuda")))
        return SimpleNamespace(logits=self.scale * self.table[input_ids] + self.bias)


@pytest.fixture(autouse=True)
def quiet(monkeypatch):
    @contextlib.contextmanager
    def silent(description, total):
        yield lambda n=1, **fields: None

    monkeypatch.setattr(tl, "progress", silent)


def _stream():
    g = torch.Generator().manual_seed(3)
    return tl.TokenStream(ids=torch.randint(0, 6, (60,), generator=g), starts=torch.arange(0, 60, 5))


ARGS = dict(steps=6, batch_size=3, seq_len=4, lr=0.05, warmup_steps=2, weight_decay=0.1, decay=True, seed=7)


def _reference(model, stream):
    """The loop train_lm is meant to run, written out."""
    a = ARGS
    opt = torch.optim.AdamW([{"params": [model.table], "weight_decay": a["weight_decay"]},
                             {"params": [model.bias], "weight_decay": 0.0}], lr=a["lr"], betas=(0.9, 0.95), eps=1e-8)
    g = torch.Generator().manual_seed(a["seed"])
    norms = []
    for step in range(a["steps"]):
        for group in opt.param_groups:
            group["lr"] = tl._lr_at(step, a["steps"], a["lr"], a["warmup_steps"], a["decay"])
        batch = tl.sample_windows(stream, a["batch_size"], a["seq_len"], g)
        logits = model(batch[:, :-1]).logits
        loss = F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)))
        opt.step()
    return norms


def test_each_step_is_the_plain_clipped_adamw_step_at_the_schedules_lr():
    got, want = Bigram(), Bigram()
    tl.train_lm(got, [(_stream(), 1.0)], description="t", **ARGS)
    norms = _reference(want, _stream())
    assert min(norms) > 2  # what this pins: every step's gradient is clipped
    assert torch.allclose(got.table, want.table, atol=1e-6) and torch.allclose(got.bias, want.bias, atol=1e-6)


def test_training_runs_in_train_mode_without_cuda_autocast_off_cuda_and_ends_in_eval_mode():
    model = Bigram().eval()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch.autocast("cuda") without CUDA warns, then disables itself
        tl.train_lm(model, [(_stream(), 1.0)], description="t", **ARGS)
    assert model.seen == [(True, False)] * ARGS["steps"]
    assert not model.training


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the bf16 autocast is CUDA's")
def test_training_on_cuda_runs_under_autocast():
    model = Bigram().cuda()
    tl.train_lm(model, [(_stream(), 1.0)], description="t", **ARGS)
    assert model.seen == [(True, True)] * ARGS["steps"]


def test_the_final_loss_of_a_short_run_is_its_last_step():
    losses = []

    @contextlib.contextmanager
    def recording(description, total):
        yield lambda n=1, **fields: losses.append(fields["loss"])

    with pytest.MonkeyPatch.context() as m:
        m.setattr(tl, "progress", recording)
        out = tl.train_lm(Bigram(), [(_stream(), 1.0)], description="t", **{**ARGS, "steps": 5})
    assert len(losses) == 5 and out["final_loss"] == losses[-1]  # a tenth of 5 steps rounds up to one


def test_a_run_of_no_steps_reports_no_losses(monkeypatch):
    readings = iter([10.0, 12.344])  # a stood-in clock: the run's start, then its end
    monkeypatch.setattr(tl, "time", types.SimpleNamespace(perf_counter=lambda: next(readings)))
    out = tl.train_lm(Bigram(), [(_stream(), 1.0)], description="t", **{**ARGS, "steps": 0})
    # the run's own duration, to the hundredth
    assert out == {"steps": 0, "tokens": 0, "first_loss": None, "final_loss": None, "seconds": 2.34}
