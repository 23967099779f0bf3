"""train()'s barrier after the run, a torchrun-only line (a 1-process Dist's barrier does nothing), seen
in-process through a stand-in Dist that notes when it is called."""
from __future__ import annotations

import torch

from drafter_lab.train import distributed, loop, state
from drafter_lab.train.config import TrainConfig


class _Noting(distributed.Dist):
    """One rank that notes, at each barrier, whether the run's final train state is on disk."""

    out = None
    at_barrier: list = []

    def barrier(self) -> None:
        self.at_barrier.append(state.state_path(self.out).exists())


def test_every_rank_waits_at_a_barrier_once_its_run_is_done(peaked_llama, features, tmp_path, monkeypatch):
    """Else a rank done first starts what comes next (the study's next arm, eval) while another still
    checkpoints: its collectives would meet the other's and hang."""
    _Noting.out, _Noting.at_barrier = tmp_path / "run", []
    monkeypatch.setattr(loop.distributed, "setup", lambda device: _Noting(0, 1, 0, torch.device("cpu")))
    cfg = TrainConfig(draft_vocab_size=128, max_steps=1, batch_size=8, ttt_steps=1, warmup_steps=0, threads=1)
    loop.train(cfg, peaked_llama, features, tmp_path / "run")
    assert _Noting.at_barrier == [True]
