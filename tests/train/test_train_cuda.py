"""`train` on a CUDA device against the CPU, from the same seed and data: fp32 losses step for step
(pinned micro-batches, the sampled validation), the default bf16 autocast, an online run (the target
on the GPU, run in the loader thread), and a train state written on the GPU (its tensors saved as CUDA
tensors) resuming on a machine without one."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from drafter_lab.data.capture import CaptureConfig
from drafter_lab.data.shards import Manifest
from drafter_lab.train import state
from drafter_lab.train.config import TrainConfig
from drafter_lab.train.loop import train
from drafter_lab.train.metrics_log import read_metrics

pytestmark = pytest.mark.gpu  # tests/conftest.py skips it where no CUDA device is visible

# The `features` fixture's 31 train sequences: 4 batches of 8, one epoch. Micro-batches of up to 4 rows
# go to the device one at a time; the validation also scores a chain sampled at 0.8.
CFG = TrainConfig(draft_vocab_size=128, max_steps=4, epochs=1, batch_size=8, accumulation_steps=2, ttt_steps=3,
                  lr=3e-3, warmup_steps=1, log_every=1, checkpoint_every=2, eval_batch_size=8, val_temperature=0.8,
                  max_length=96, bf16=False, threads=1, device="cpu")
CUDA = "cuda"
"""The device under test (a bare "cuda": the run picks its index)."""


def _assert_follows(got: list[dict], want: list[dict], rel: float) -> None:
    """The same lines and counts, their losses within `rel`. Accuracies over hundreds of positions
    (acc_k, cond_acc_0, the sampled chain's expectations) within a few drafts whose near-tied argmax
    the other device's rounding flips; a deeper cond_acc_k counts a few dozen, so a flip moves it far."""
    assert [(r["event"], r["step"]) for r in got] == [(r["event"], r["step"]) for r in want]
    for g, w in zip(got, want, strict=True):
        at = (w["event"], w["step"])
        assert (g["train_tokens"], g["positions"]) == (w["train_tokens"], w["positions"]), at
        losses = sorted(k for k in w if k.startswith("loss_") or k == "weighted_loss")
        assert all(math.isfinite(g[k]) for k in losses), g
        assert {k: g[k] for k in losses} == pytest.approx({k: w[k] for k in losses}, rel=rel), at
        accs = sorted(k for k in w if k.startswith(("acc_", "sampled_acc_")) or k == "cond_acc_0")
        assert {k: g[k] for k in accs} == pytest.approx({k: w[k] for k in accs}, abs=0.02), at


class _Stop(Exception):
    """Ends a run right after a checkpoint, as a kill would."""


@pytest.fixture(scope="module")
def on_cpu(peaked_llama, features, tmp_path_factory):
    out = tmp_path_factory.mktemp("cpu") / "drafter"
    train(CFG, peaked_llama, features, out)
    return out


def test_training_on_cuda_follows_the_cpu_step_for_step(peaked_llama, features, on_cpu, tmp_path):
    """fp32 on both: every train and validation line's losses within 1e-3 of the CPU run's."""
    out = tmp_path / "cuda"
    train(dataclasses.replace(CFG, device=CUDA), peaked_llama, features, out)
    lines = read_metrics(on_cpu)
    assert [r["event"] for r in lines] == ["train"] * 4 + ["val"]
    assert "sampled_accept_len" in lines[-1]
    _assert_follows(read_metrics(out), lines, rel=1e-3)


def test_training_in_bf16_autocast_on_cuda_trains_like_fp32(peaked_llama, features, on_cpu, tmp_path):
    """The default on a GPU: bf16 autocast, losses finite and within a few percent of fp32's."""
    out = tmp_path / "bf16"
    train(dataclasses.replace(CFG, device=CUDA, bf16=True), peaked_llama, features, out)
    got, want = read_metrics(out), read_metrics(on_cpu)
    assert [(r["event"], r["step"]) for r in got] == [(r["event"], r["step"]) for r in want]
    for g, w in zip(got, want, strict=True):
        assert math.isfinite(g["weighted_loss"]) and g["loss_0"] == pytest.approx(w["loss_0"], rel=0.05), w["step"]


def test_a_train_state_written_on_cuda_resumes_on_a_machine_without_one(peaked_llama, features, on_cpu, tmp_path,
                                                                       monkeypatch):
    """Stopped after its step-2 checkpoint on the GPU, the run resumes on the CPU of a process that sees
    no CUDA device (torch.load refuses CUDA tensors there unless mapped), and ends as the CPU run did."""
    out = tmp_path / "moved"
    save = state.save

    def save_then_stop(out_dir, s):
        save(out_dir, s)
        if s["step"] == 2:
            raise _Stop

    monkeypatch.setattr(state, "save", save_then_stop)
    with pytest.raises(_Stop):
        train(dataclasses.replace(CFG, device=CUDA), peaked_llama, features, out)
    monkeypatch.setattr(state, "save", save)
    saved = torch.load(state.state_path(out), weights_only=False)  # as written: CUDA tensors
    assert saved["step"] == 2 and saved["model"]["fc.weight"].is_cuda and "cuda" in saved["rng"]
    assert any(t.is_cuda for s in saved["optimizer"]["state"].values() for t in s.values())
    del saved

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="on a CUDA device but torch.cuda.is_available"):
        torch.load(state.state_path(out), weights_only=False)  # what a resume without map_location meets
    train(CFG, peaked_llama, features, out, resume=True)
    _assert_follows(read_metrics(out), read_metrics(on_cpu), rel=1e-3)


def test_online_training_on_cuda_follows_the_cpu(peaked_llama, features, tmp_path):
    """Online: the target (fp32) computes each batch's states on the GPU, in the loader thread."""
    convs = Manifest.load(features).source["conversations"]
    capture = CaptureConfig(max_length=96, val_fraction=0.25)
    cfg = dataclasses.replace(CFG, max_steps=3, accumulation_steps=1, val_temperature=0.0)
    for device in ("cpu", CUDA):
        train(dataclasses.replace(cfg, device=device), peaked_llama, convs, tmp_path / device, online=capture)
    _assert_follows(read_metrics(tmp_path / CUDA), read_metrics(tmp_path / "cpu"), rel=1e-3)
