"""A diverged run (its loss nan or inf) stops with a one-line error before its weights are written:
the run directory keeps its last finite checkpoint, and --resume goes on from it. It logged NaN for
every step, exited 0 and saved a NaN drafter over the last good one."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from drafter_lab.cli import main
from drafter_lab.errors import LabError
from drafter_lab.train import state
from drafter_lab.train.config import TrainConfig
from drafter_lab.train.loop import train
from drafter_lab.train.metrics_log import read_metrics
from drafter_lab.train.ttt import TTTObjective

from .two_ranks import run_two_ranks

ARGS = ["--draft-vocab-size", "128", "--batch-size", "4", "--ttt-steps", "2", "--threads", "1"]


def _finite(out) -> None:
    """Every weight in the run directory, and the train state's, is finite."""
    for path in out.rglob("*.safetensors"):
        assert all(t.isfinite().all() for t in load_file(str(path)).values()), path
    s = state.load(out)
    assert all(t.isfinite().all() for t in s["model"].values())
    assert all(t.isfinite().all() for group in s["optimizer"]["state"].values() for t in group.values())


def test_a_huge_learning_rate_stops_the_run_with_one_line(peaked_llama, features, tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["train", "--target", str(peaked_llama), "--data", str(features), "--out", str(out), *ARGS,
            "--lr", "1e12", "--warmup-steps", "0", "--grad-clip", "0", "--max-steps", "6", "--checkpoint-every", "1", "--log-every", "1"]
    for again in ([], ["--resume"]):  # the resume starts from the kept step 1, and diverges the same way
        assert main(argv + again) == 2
        err = capsys.readouterr().err.strip().splitlines()  # a progress line may come first
        assert err[-1] == (f"error: {out}: loss is nan at step 2: the run diverged (lower --lr, or set --grad-clip); "
                           "the last checkpoint, step 1, is kept"), err
        assert "Traceback" not in "".join(err)
        assert state.load(out)["step"] == 1
        _finite(out)
        assert [(r["event"], r["step"]) for r in read_metrics(out)] == [("train", 1)]


def test_resume_from_the_kept_checkpoint_equals_an_uninterrupted_run(peaked_llama, features, tmp_path, monkeypatch):
    """One step's loss nan (a bad batch, a bf16 overflow): the checkpoint after it refuses to write the
    NaN weights, so --resume, once the cause is gone, trains on from the one before."""
    cfg = TrainConfig(draft_vocab_size=128, batch_size=4, ttt_steps=2, lr=3e-3, warmup_steps=2, max_steps=8,
                      checkpoint_every=2, log_every=10, threads=1)
    train(cfg, peaked_llama, features, tmp_path / "full")

    real, calls = TTTObjective.forward, [0]

    def nan_at_step_5(self, *a, **k):
        loss, counts = real(self, *a, **k)
        if torch.is_grad_enabled():  # a training step's, not validation's
            calls[0] += 1
            if calls[0] == 5:
                loss = loss * float("nan")
        return loss, counts

    out = tmp_path / "run"
    monkeypatch.setattr(TTTObjective, "forward", nan_at_step_5)
    with pytest.raises(LabError) as e:
        train(cfg, peaked_llama, features, out)
    assert str(e.value) == (f"{out}: loss is nan at step 5: the run diverged (lower --lr); "
                            "the last checkpoint, step 4, is kept")
    assert state.load(out)["step"] == 4
    _finite(out)
    monkeypatch.setattr(TTTObjective, "forward", real)
    assert train(cfg, peaked_llama, features, out, resume=True)["step"] == 8
    assert (out / "model.safetensors").read_bytes() == (tmp_path / "full" / "model.safetensors").read_bytes()


def test_an_inf_gradient_norm_stops_it_too(peaked_llama, features, tmp_path, monkeypatch):
    cfg = TrainConfig(draft_vocab_size=128, batch_size=4, ttt_steps=2, lr=3e-3, grad_clip=1.0, max_steps=3,
                      threads=1)
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", lambda params, clip: torch.tensor(float("inf")))
    with pytest.raises(LabError, match=r": gradient norm is inf at step 1: the run diverged \(lower --lr\); "
                                       "no checkpoint was written$"):
        train(cfg, peaked_llama, features, tmp_path / "run")
    assert not state.state_path(tmp_path / "run").exists()


DIVERGED = """
import math

seen = [[5, math.inf, 0.5], [4, math.nan, math.nan]][rank]  # rank 1 diverged first
fields = dict(out_dir=Path(args[0]), kept_step=3, cfg=types.SimpleNamespace(grad_clip=0.0),
              nonfinite=torch.tensor(seen, dtype=torch.float64))
"""


def test_every_rank_stops_at_the_first_diverged_step_of_any(tmp_path):
    """Two real gloo ranks, each with its own first non-finite step: both stop, naming the same one,
    and neither waits in a collective the other left."""
    done = run_two_ranks(tmp_path, DIVERGED, "check_finite", tmp_path)
    assert [code for code, _, _ in done] == [2, 2], [err[-2000:] for _, _, err in done]
    line = (f"error: {tmp_path}: loss is nan at step 4: the run diverged (lower --lr, or set --grad-clip); "
            "the last checkpoint, step 3, is kept\n")
    assert [out for _, out, _ in done] == [line, line]

