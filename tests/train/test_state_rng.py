"""A train state's RNG states restore on another machine's GPU count."""

from __future__ import annotations

import torch

from drafter_lab.train import state


def test_a_resume_on_fewer_gpus_sets_the_states_of_those_it_has(monkeypatch):
    """A state saved on 4 GPUs resumed on 1: torch's set_rng_state_all would index the missing devices."""
    saved = state.rng_state()
    saved["cuda"] = [torch.ByteTensor([i]) for i in range(4)]
    got = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", lambda states: got.extend(states))
    state.set_rng_state(saved)
    assert [int(t[0]) for t in got] == [0]
    assert torch.equal(torch.get_rng_state(), saved["torch"])
