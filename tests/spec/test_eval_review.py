"""Review of the local `eval`: the phase clock on a CUDA device other than the current one."""

from __future__ import annotations

import torch

from drafter_lab.spec.phases import PhaseClock


def test_cuda_clock_records_on_the_decodes_device(monkeypatch):
    """`eval --device cuda:1`: the events were recorded on the current device's stream (cuda:0), idle,
    so the split timed the host's enqueueing, not cuda:1's kernels."""
    streams = []

    class Event:
        def __init__(self, enable_timing=False):
            pass

        def record(self, stream=None):
            streams.append(stream)

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: f"stream of {device}")
    clock = PhaseClock(torch.device("cuda", 1))
    clock.mark("verify")
    assert streams == ["stream of cuda:1"] * 2
