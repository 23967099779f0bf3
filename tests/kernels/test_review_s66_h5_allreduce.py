"""The communicator's Python face, mutation audit s66 (h5): the `path=` store check on real FileStore
files, the boundary settings it takes, a timed threshold's largest size, a given LL threshold beside a
timed one, `with` closing, the clean-up's grace for a segment being created, and the fused op's eps and
its reference's one rounding. Ranks are threads of this process."""

from __future__ import annotations

import os
import secrets
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from test_allreduce_review import _pair, _tuned_pair  # this directory is on sys.path (pytest prepends it)

from drafter_lab.errors import LabError
from drafter_lab.kernels import _ext

pytestmark = pytest.mark.skipif(not _ext.available(), reason=_ext.unavailable_reason() or "extension built")


def _tag(what: str) -> str:
    return f"test-s66h5-{what}-{os.getpid()}-{secrets.token_hex(4)}"


def test_a_store_file_whose_last_record_deleted_a_key_is_taken(tmp_path):
    """FileStore's delete_key appends the key with an empty value (a 4-byte zero length), as rank 0's
    rendezvous does last: a file ending on it is whole, not a record cut short."""
    from drafter_lab.kernels.allreduce import Communicator

    path = tmp_path / "store"
    store = dist.FileStore(str(path), 2)
    store.set("k", "v")
    store.delete_key("k")
    assert path.read_bytes().endswith(bytes(4))
    with Communicator(0, 1, path=path, one_shot_max_bytes=0) as comm:
        assert torch.equal(comm.all_reduce(torch.ones(3)), torch.ones(3))


def test_a_record_a_peer_is_appending_is_waited_for(tmp_path, monkeypatch):
    """A peer's append in flight reads as a cut record: the check reads the file again before refusing it."""
    from drafter_lab.kernels import allreduce

    def record(b: bytes) -> bytes:
        return len(b).to_bytes(4, "little") + b

    path = tmp_path / "store"
    whole = record(b"key") + record(b"value")
    path.write_bytes(whole[:6])  # the peer has written the key's length and one byte
    monkeypatch.setattr(allreduce.time, "sleep", lambda s: path.write_bytes(whole))
    allreduce._check_file_store(path)


def test_a_path_not_there_yet_is_created(tmp_path):
    """The usual first run: `path=` names a file no one has made."""
    from drafter_lab.kernels.allreduce import Communicator

    path = tmp_path / "fresh"
    with Communicator(0, 1, path=path, one_shot_max_bytes=0) as comm:
        assert path.exists()
        assert torch.equal(comm.all_reduce(torch.full((4,), 2.0)), torch.full((4,), 2.0))


def test_store_and_path_together_are_refused(tmp_path):
    from drafter_lab.kernels.allreduce import Communicator

    with pytest.raises(LabError, match=r"^pass store= or path=, not both$"):
        Communicator(0, 1, store=dist.HashStore(), path=tmp_path / "store")
    assert not (tmp_path / "store").exists()


def test_the_largest_world_and_block_count_are_taken():
    """The limits are inclusive: 16 ranks (rank 0 waits for the 15 others, then times out naming one)
    and the native layer's most blocks per call."""
    from drafter_lab.kernels.allreduce import AllReduceError, Communicator, _native

    native = _native()
    with pytest.raises(AllReduceError, match=r"rank \d+ \(not attached\)"):
        Communicator(0, native.max_ranks, name=_tag("world"), timeout_s=0.3, one_shot_max_bytes=0)
    with Communicator(0, 1, name=_tag("blocks"), blocks=native.max_blocks, one_shot_max_bytes=0) as comm:
        x = torch.randn(1000)
        assert torch.equal(comm.all_reduce(x.clone()), x)


def test_the_timed_sizes_include_the_capacity_itself(monkeypatch):
    """At a capacity that is itself a timed size (1 MB), a one-shot loss there keeps one-shot below it:
    timing only the sizes under the capacity made it one-shot up to the capacity."""
    from drafter_lab.kernels.allreduce import Communicator

    def median(self, x, algo, reps=15):
        slow = x.numel() * x.element_size() == 1 << 20
        return {1: 3.0 if slow else 1.0, 2: 2.0}[algo]

    monkeypatch.setattr(Communicator, "_median_call_us", median)
    results = _tuned_pair(1 << 20)
    assert results[0] == results[1] == (256 << 10, 1 << 20)


def test_a_given_ll_threshold_is_kept_beside_a_timed_one_shot():
    """ll_max_bytes= given with one_shot_max_bytes=None (timed) is applied, so the cpu backend refuses
    it as it does beside a given one-shot threshold, instead of dropping it for the timed 0."""
    from drafter_lab.kernels.allreduce import AllReduceInputError, Communicator

    with pytest.raises(AllReduceInputError, match="the cpu backend takes ll_max_bytes=0"):
        Communicator(0, 1, name=_tag("ll"), ll_max_bytes=1024)
    with Communicator(0, 1, name=_tag("ll0"), ll_max_bytes=0) as comm:
        assert comm.ll_max_bytes == 0 and comm.one_shot_max_bytes == comm.capacity


def test_leaving_a_with_block_closes_the_communicator():
    from drafter_lab.kernels.allreduce import AllReduceError, Communicator

    tag = _tag("with")
    with Communicator(0, 1, name=tag, one_shot_max_bytes=0) as comm:
        assert repr(comm).startswith("Communicator(rank=0, world_size=1")
    assert repr(comm) == "Communicator(closed)"
    with pytest.raises(AllReduceError):
        comm.all_reduce(torch.ones(2))
    with open("/proc/self/maps") as f:
        assert tag not in f.read(), "the segment is still mapped"


@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="needs /dev/shm")
def test_cleanup_by_default_spares_a_segment_still_being_created():
    """A segment without its header may be a creator's between shm_open and the stamp: the default
    clean-up leaves it until it has aged past the grace period, then removes it as a killed init's."""
    from drafter_lab.kernels.allreduce import cleanup_stale_segments

    seg = Path("/dev/shm") / f"drafter_lab_ar.{_tag('creating')}"
    seg.write_bytes(b"")
    try:
        os.utime(seg, (time.time() - 10, time.time() - 10))  # within the 30 s grace
        assert f"/{seg.name}" not in cleanup_stale_segments()
        assert seg.exists()
        os.utime(seg, (time.time() - 60, time.time() - 60))
        assert f"/{seg.name}" in cleanup_stale_segments()
        assert not seg.exists()
    finally:
        seg.unlink(missing_ok=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_fused_op_and_its_reference_use_the_eps_given(dtype):
    """Small activations, where eps is most of the mean square: the kernel and the reference both
    honour eps=0.5 (not the default 1e-6), as a model's own rms_norm_eps must be."""
    from drafter_lab.kernels.allreduce import Communicator, residual_rmsnorm_native

    gen = torch.Generator().manual_seed(0)
    x = (0.1 * torch.randn(3, 256, generator=gen)).to(dtype)
    residual = (0.1 * torch.randn(3, 256, generator=gen)).to(dtype)
    weight = (0.5 + torch.rand(256, generator=gen)).to(dtype)
    r = x.double() + residual.double()
    want = r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + 0.5) * weight.double()
    ref_out, ref_res = residual_rmsnorm_native([x], residual, weight, 0.5)
    tol = {torch.float32: 1e-5, torch.bfloat16: 1e-2}[dtype]
    torch.testing.assert_close(ref_out.double(), want, rtol=tol, atol=tol)
    with Communicator(0, 1, name=_tag("eps"), one_shot_max_bytes=0) as comm:
        out, res = comm.allreduce_residual_rmsnorm(x, residual, weight, 0.5)
    assert torch.equal(res, ref_res)
    torch.testing.assert_close(out.double(), want, rtol=tol, atol=tol)


def test_the_reference_residual_rounds_once():
    """bf16 parts 1 and 2^-8 with a residual of 2^-8: in fp32 the residual sum is 1 + 2^-7, which bf16
    holds; rounding the parts' sum before adding the residual gives 1 (each half-ulp add rounds back
    to even)."""
    from drafter_lab.kernels.allreduce import residual_rmsnorm_native

    half_ulp = torch.tensor([2.0**-8], dtype=torch.bfloat16)
    parts = [torch.ones(1, dtype=torch.bfloat16), half_ulp]
    _, res = residual_rmsnorm_native(parts, half_ulp.clone(), torch.ones(1, dtype=torch.bfloat16))
    assert res.item() == 1 + 2.0**-7


class _SlowDelete:
    """A Store whose delete_key lags (rank 0 descheduled between its connect and the key's removal)."""

    def __init__(self, store):
        self._store = store

    def __getattr__(self, name):
        return getattr(self._store, name)

    def delete_key(self, key):
        time.sleep(0.5)
        return self._store.delete_key(key)


def test_a_rank_ahead_of_rank_0s_clean_up_waits_for_the_next_segment():
    """Rank 1 starts its second communicator while rank 0 has not yet removed the first one's key: each
    rank's count in the store gives the second its own key, so rank 1 does not take the first (already
    unlinked) segment's name for the second's."""
    from drafter_lab.kernels.allreduce import Communicator

    store = dist.HashStore()

    def rank(r):
        comms = [Communicator(r, 2, store=_SlowDelete(store) if r == 0 else store, timeout_s=10, one_shot_max_bytes=0)
                 for _ in range(2)]
        try:
            return [c.all_reduce(torch.full((3,), r + 1.0)).tolist() for c in comms]
        finally:
            for c in comms:
                c.close()

    results, errors = _pair(rank)
    assert not errors, errors
    assert results[0] == results[1] == [[3.0] * 3] * 2
