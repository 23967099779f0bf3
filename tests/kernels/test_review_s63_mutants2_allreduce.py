"""The autotune's thresholds from given timings, a single rank's, and the reference sum's one rounding
(mutation audit, round 2). Ranks are threads of this process."""

from __future__ import annotations

import os
import secrets

import pytest
import torch
from test_allreduce_review import _tuned_pair  # this directory is on sys.path (pytest prepends it)

from drafter_lab.kernels import _ext

pytestmark = pytest.mark.skipif(not _ext.available(), reason=_ext.unavailable_reason() or "extension built")


def _timed(monkeypatch, one_shot_loses_at=()):
    """Timings as given: one-shot (algo 1) beats two-shot (algo 2) but at the sizes named."""
    from drafter_lab.kernels.allreduce import Communicator

    def median(self, x, algo, reps=15):
        slow = x.numel() * x.element_size() in one_shot_loses_at
        return {1: 3.0 if slow else 1.0, 2: 2.0}[algo]

    monkeypatch.setattr(Communicator, "_median_call_us", median)


@pytest.mark.parametrize(("loses_at", "want"), [((), "capacity"), ((64 << 10,), 16 << 10), ((4 << 10,), 0)])
def test_the_one_shot_threshold_is_the_largest_size_before_its_first_loss(monkeypatch, loses_at, want):
    """One-shot winning at every size timed runs up to the capacity (past the largest size timed); a loss
    ends the range there even where one-shot wins again later."""

    _timed(monkeypatch, loses_at)
    results = _tuned_pair(4 << 20)
    (got, capacity), other = results[0], results[1]
    assert other == (got, capacity) and capacity > 1 << 20
    assert got == (capacity if want == "capacity" else want)


def test_a_single_rank_takes_one_shot_up_to_its_capacity_without_timing(monkeypatch):
    _timed(monkeypatch, one_shot_loses_at=(4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20))
    from drafter_lab.kernels.allreduce import Communicator

    with Communicator(0, 1, name=f"test-one-rank-{os.getpid()}-{secrets.token_hex(4)}", max_bytes=2 << 20) as comm:
        assert comm.one_shot_max_bytes == comm.capacity


def test_the_reference_sum_rounds_once():
    """bf16 parts summed in fp32 and rounded at the end: 1 + 2^-8 + 2^-8 is 1 + 2^-7, where a bf16 running
    sum rounds each half-ulp add back to 1."""
    from drafter_lab.kernels.allreduce import sum_native

    parts = [torch.tensor([1.0], dtype=torch.bfloat16), *[torch.tensor([2.0**-8], dtype=torch.bfloat16)] * 2]
    got = sum_native(parts)
    assert got.dtype == torch.bfloat16 and got.item() == 1 + 2.0**-7
