"""`PhaseClock`: a decode's wall time split by phase, on the host clock or on CUDA events."""

from __future__ import annotations

import time

import pytest
import torch

from drafter_lab.spec import phases
from drafter_lab.spec.phases import PhaseClock


def test_cpu_clock_charges_each_interval_to_the_phase_that_ends_it(monkeypatch):
    ticks = iter([10.0, 10.5, 11.25, 11.5, 13.0])
    monkeypatch.setattr(phases.time, "perf_counter", lambda: next(ticks))
    clock = PhaseClock(torch.device("cpu"))
    for phase in ("prefill", "verify", "accept", "verify"):
        clock.mark(phase)
    assert clock.seconds() == {"prefill": 0.5, "verify": 0.75 + 1.5, "accept": 0.25}
    assert list(clock.seconds()) == ["prefill", "verify", "accept"]
    assert clock.elapsed() == [0.5, 1.25, 1.5, 3.0]


def test_add_keeps_every_phase_of_either():
    assert phases.add({"prefill": 1.0, "verify": 2.0}, {"verify": 0.5, "extend": 0.25}) == \
        {"prefill": 1.0, "verify": 2.5, "extend": 0.25}


@pytest.mark.gpu
def test_cuda_clock_adds_up_to_the_wall_time_without_waiting():
    x = torch.randn(2048, 2048, device="cuda")
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    clock = PhaseClock(x.device)
    for _ in range(5):
        y = x @ x
        clock.mark("matmul")
        time.sleep(0.01)  # host work the device waits on
        clock.mark("host")
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    split = clock.seconds()
    assert list(split) == ["matmul", "host"] and min(split.values()) > 0
    assert split["host"] >= 0.9 * 5 * 0.01  # device idle while the host slept: charged to the host phase
    assert sum(split.values()) <= wall
    assert torch.isfinite(y).all()
