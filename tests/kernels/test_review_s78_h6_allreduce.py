"""Mutation audit s78 (h6) of allreduce.py's module-level helpers: the autotune's prefix rule, the Work
a CPU async call returns, the op names it takes, and the fp32 references the kernels are checked against."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist

from drafter_lab.kernels import _ext
from drafter_lab.kernels import allreduce as ar

built = pytest.mark.skipif(not _ext.available(), reason=_ext.unavailable_reason() or "extension built")


@pytest.mark.parametrize("won, best", [([True, True, False], 2), ([True, False, True], 1), ([False, True, True], 0),
                                       ([True, True, True], 4)])
def test_an_algorithm_covers_the_sizes_up_to_its_first_loss(won, best):
    assert ar._largest_prefix([1, 2, 4], won) == best


def test_a_cpu_work_is_done_and_holds_the_summed_tensor_itself():
    t = torch.ones(3)
    work = ar.CompletedWork(t)
    assert (work.wait(), work.is_completed(), work.is_success(), work.exception(), work.synchronize()) == (
        True, True, True, None, None)
    (got,) = work.result()
    (fut,) = work.get_future().wait()
    assert got is t and fut is t


@pytest.mark.parametrize("op, want", [("sum", dist.ReduceOp.SUM), ("Max", dist.ReduceOp.MAX),
                                      (dist.ReduceOp.MIN, dist.ReduceOp.MIN)])
def test_a_reduce_op_is_taken_by_name_or_as_itself(op, want):
    assert ar._reduce_op(op) == want


def test_an_unknown_reduce_op_name_is_bad_input():
    with pytest.raises(ar.AllReduceInputError) as e:
        ar._reduce_op("mean")
    assert str(e.value) == "unknown reduce op 'mean'"


def test_a_torch_group_gets_the_resolved_op_and_its_async_flag(monkeypatch):
    calls = []
    monkeypatch.setattr(dist, "all_reduce", lambda tensor, op, group, async_op: calls.append((tensor, op, group, async_op)) or "work")
    t = torch.ones(2)
    assert ar.all_reduce(t, op="max", group="torch group", async_op=True) == "work"
    assert calls == [(t, dist.ReduceOp.MAX, "torch group", True)]


@built
def test_our_group_sums_in_place_and_refuses_any_other_op():
    with ar.Communicator(0, 1, name=f"s78h6-{os.getpid()}") as comm:
        t = torch.full((4,), 2.0)
        assert ar.all_reduce(t, group=comm) is None
        assert torch.equal(t, torch.full((4,), 2.0))
        work = ar.all_reduce(t, op="SUM", group=comm, async_op=True)
        assert isinstance(work, ar.CompletedWork) and work.result()[0] is t
        with pytest.raises(ar.AllReduceInputError) as e:
            ar.all_reduce(t, op="max", group=comm)
        assert str(e.value) == "the shared-memory all-reduce only sums, got op='max'"
    with pytest.raises(ar.AllReduceError, match="this communicator is closed"):  # the call reaches it (a sum of one is t)
        ar.all_reduce(t, group=comm)


@built
def test_stale_segment_cleanup_returns_a_list():
    assert isinstance(ar.cleanup_stale_segments(), list)


def _parts():
    gen = torch.Generator().manual_seed(7)
    return [torch.randn(2, 64, generator=gen).to(torch.bfloat16) * s for s in (1e-3, 2e-3, 3e-3)]


def test_the_sum_reference_adds_every_rank_in_fp32_and_rounds_once():
    parts = _parts()
    want = (parts[0].float() + parts[1].float() + parts[2].float()).to(torch.bfloat16)
    got = ar.sum_native(parts)
    assert got.dtype == torch.bfloat16 and torch.equal(got, want)


def test_the_fused_reference_is_residual_plus_sum_then_rmsnorm_with_eps_1e_6():
    """Values near 1e-3 so that eps (1e-6) weighs as much as the mean square."""
    parts = _parts()
    residual = parts[0].flip(-1)
    weight = torch.linspace(0.5, 2.0, 64).to(torch.bfloat16)
    r = parts[0].float() + parts[1].float() + parts[2].float() + residual.float()
    normed = r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + 1e-6) * weight.float()
    out, res = ar.residual_rmsnorm_native(parts, residual, weight)
    assert out.dtype == res.dtype == torch.bfloat16
    assert torch.equal(res, r.to(torch.bfloat16)) and torch.equal(out, normed.to(torch.bfloat16))
