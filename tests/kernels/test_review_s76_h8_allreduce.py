"""The communicator's Python face, mutation audit s76 (h8): the autotune's timing (warm-ups dropped,
microseconds), its choice from the ranks' summed timings and at ties, distinct names on one store,
the published key cleared, close() letting go of a `path=` store, and the fused op's default eps.
Ranks are threads of this process."""

from __future__ import annotations

import os
import secrets
import time
import types

import pytest
import torch
import torch.distributed as dist
from test_allreduce_review import _pair, _tuned_pair  # this directory is on sys.path (pytest prepends it)

from drafter_lab.kernels import _ext

pytestmark = pytest.mark.skipif(not _ext.available(), reason=_ext.unavailable_reason() or "extension built")


def _tag(what: str) -> str:
    return f"test-s76h8-{what}-{os.getpid()}-{secrets.token_hex(4)}"


def test_a_timing_is_the_median_of_the_calls_after_three_warm_ups_in_microseconds(monkeypatch):
    """On a clock where the i-th call takes i us, the 15 timed calls after 3 warm-ups (3..17 us)
    have the median 10 us: a warm-up counted, a call more or less, or another unit moves it."""
    from drafter_lab.kernels import allreduce

    now = [0.0]
    calls = []

    def call(fn, *args):
        calls.append(args)
        now[0] += len(calls) - 1  # in us: the i-th call (from 0) takes i
        return None

    monkeypatch.setattr(allreduce, "time", types.SimpleNamespace(perf_counter=lambda: now[0] / 1e6, sleep=time.sleep))
    with allreduce.Communicator(0, 1, name=_tag("median"), one_shot_max_bytes=0) as comm:
        x = torch.zeros(8)
        monkeypatch.setattr(comm, "_call", call)
        assert comm._median_call_us(x, 2) == pytest.approx(10.0, rel=1e-9)
    assert len(calls) == 18 and all(a[0] is x and a[1] is x and a[2] == 2 for a in calls)


def _timings(monkeypatch, median):
    from drafter_lab.kernels.allreduce import Communicator

    monkeypatch.setattr(Communicator, "_median_call_us", median)
    return _tuned_pair(4 << 20)


def test_ranks_that_time_differently_choose_from_the_summed_timings(monkeypatch):
    """Rank 1 times one-shot slow from 16 KiB, rank 0 never: the sums (11 us against 4 us) make both
    stop at 4 KiB, where each rank's own timings gave them different thresholds (and mixed algorithms)."""

    def median(self, x, algo, reps=15):
        slow = self.rank == 1 and x.numel() * x.element_size() >= 16 << 10
        return {1: 10.0 if slow else 1.0, 2: 2.0}[algo]

    results = _timings(monkeypatch, median)
    assert results[0][0] == results[1][0] == 4 << 10


def test_one_shot_keeps_the_sizes_it_ties_at(monkeypatch):
    """Equal timings keep one-shot (one step, not two) up to the capacity."""
    results = _timings(monkeypatch, lambda self, x, algo, reps=15: 1.0)
    (got, capacity), other = results[0], results[1]
    assert other == (got, capacity) and got == capacity


def test_groups_of_distinct_names_on_one_store_do_not_meet():
    """Two TP groups on one store tell their rendezvous apart by name: a rank 1 of another name waits
    for a key its group's rank 0 never publishes, and that rank 0 for a peer that never comes."""
    from drafter_lab.kernels.allreduce import AllReduceError, Communicator

    store = dist.HashStore()
    names = {0: "group-a", 1: "group-b"}
    comms, errors = _pair(lambda r: Communicator(r, 2, store=store, name=names[r], timeout_s=1, one_shot_max_bytes=0))
    for c in comms.values():
        c.close()
    assert sorted(errors) == [0, 1] and all(isinstance(e, AllReduceError) for e in errors.values()), errors


def test_rank_0_clears_the_key_it_published_once_its_group_has_met():
    """The segment name's key is deleted after the rendezvous (a `path=` file kept no stale name), even in
    a group of one; the next communicator of that name is published under the next number."""
    from drafter_lab.kernels.allreduce import Communicator

    store = dist.HashStore()
    for n in range(2):
        with Communicator(0, 1, store=store, name="tp", one_shot_max_bytes=0) as comm:
            assert torch.equal(comm.all_reduce(torch.ones(2)), torch.ones(2))
        assert not store.check([f"drafter_lab/allreduce/tp/{n}"])
    assert store.add("drafter_lab/allreduce-count/0/1/tp", 0) == 2


def test_close_lets_go_of_a_path_store_so_its_file_is_removed(tmp_path):
    """torch removes a FileStore's file once every rank's store is gone: close() drops the communicator's,
    so a closed (but still referenced) communicator leaves no file behind."""
    from drafter_lab.kernels.allreduce import Communicator

    path = tmp_path / "store"
    comm = Communicator(0, 1, path=path, one_shot_max_bytes=0)
    assert path.exists()
    comm.close()
    assert not path.exists()
    assert repr(comm) == "Communicator(closed)"


def test_the_fused_op_and_its_reference_default_to_eps_1e_6():
    """Rows of tiny values, where eps dominates the mean square: the defaults are the eps 1e-6 given."""
    from drafter_lab.kernels.allreduce import Communicator, residual_rmsnorm_native

    x = torch.full((2, 8), 1e-4)
    residual = torch.zeros(2, 8)
    weight = torch.ones(8)
    want = residual_rmsnorm_native([x], residual, weight, eps=1e-6)
    assert want[0][0, 0].item() == pytest.approx(1e-4 / (1e-8 + 1e-6) ** 0.5, rel=1e-5)
    assert all(torch.equal(a, b) for a, b in zip(residual_rmsnorm_native([x], residual, weight), want))
    with Communicator(0, 1, name=_tag("eps"), one_shot_max_bytes=0) as comm:
        got = comm.allreduce_residual_rmsnorm(x.clone(), residual, weight)
    assert all(torch.allclose(a, b, rtol=1e-6, atol=0) for a, b in zip(got, want))


def test_an_unknown_backend_is_named_as_such_before_any_device_check():
    """Unchecked, "nccl" went on to the CUDA backends' device check: "needs a CUDA device" where CUDA
    is missing, a native error past it; the message names the backends there are."""
    from drafter_lab.errors import LabError
    from drafter_lab.kernels.allreduce import Communicator

    with pytest.raises(LabError, match=r"^unknown all-reduce backend 'nccl'; choose one of cpu, cuda-host, cuda-ipc$"):
        Communicator(0, 1, name=_tag("backend"), backend="nccl")
