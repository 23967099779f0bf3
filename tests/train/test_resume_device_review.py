"""A train state written on a GPU resumes on a machine without one: its tensors are saved as CUDA
tensors (torch.load refuses them there unless mapped) and its RNG states carry the GPUs'. Made here
by saving the state with every storage tagged cuda:0, as a CUDA run's torch.save tags it
(tests/train/test_train_cuda.py does the same from a real GPU run)."""

from __future__ import annotations

import pytest
import torch
import torch.serialization

from drafter_lab.train import state
from drafter_lab.train.config import TrainConfig
from drafter_lab.train.loop import train
from drafter_lab.train.metrics_log import read_metrics

CFG = TrainConfig(draft_vocab_size=128, max_steps=4, epochs=1, batch_size=8, ttt_steps=2, lr=3e-3, warmup_steps=1,
                  log_every=1, checkpoint_every=2, eval_batch_size=8, threads=1, device="cpu")


class _Stop(Exception):
    """Ends a run right after a checkpoint, as a kill would."""


def test_a_train_state_written_on_a_gpu_resumes_on_the_cpu(peaked_llama, features, tmp_path, monkeypatch):
    train(CFG, peaked_llama, features, tmp_path / "whole")
    save = state.save

    def save_as_a_gpu_run(out_dir, s):
        s = {**s, "rng": {**s["rng"], "cuda": [torch.zeros(16, dtype=torch.uint8)]}}
        with monkeypatch.context() as m:
            m.setattr(torch.serialization, "location_tag", lambda storage: "cuda:0")
            save(out_dir, s)
        if s["step"] == 2:
            raise _Stop

    monkeypatch.setattr(state, "save", save_as_a_gpu_run)
    out = tmp_path / "moved"
    with pytest.raises(_Stop):
        train(CFG, peaked_llama, features, out)
    monkeypatch.setattr(state, "save", save)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="on a CUDA device but torch.cuda.is_available"):
        torch.load(state.state_path(out), weights_only=False)  # what a resume without map_location meets
    train(CFG, peaked_llama, features, out, resume=True)

    def rows(run):
        return [{k: v for k, v in r.items() if k != "elapsed_s"} for r in read_metrics(run)]

    assert rows(out) == rows(tmp_path / "whole")
