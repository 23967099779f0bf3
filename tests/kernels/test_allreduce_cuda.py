"""CUDA backends of the all-reduce (host-staged and IPC), on whatever GPUs are visible.

Ranks are several communicators in this one process, each launching on its own stream: on a
single GPU, ranks as separate processes would be time-sliced (kernels of different contexts do not
run at the same time without MPS), and a kernel spinning on a peer's flag would wait for the next
slice. Streams of one context run concurrently, which is how the ranks of a real TP group behave.
"""

from __future__ import annotations

import os
import secrets
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import pytest
import torch

from drafter_lab.kernels import _ext

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not _ext.available(), reason=_ext.unavailable_reason() or "extension built"),
    pytest.mark.skipif(
        _ext.available() and not _ext.load().allreduce.with_cuda, reason="drafter_lab._C was built without CUDA"
    ),
]

BACKENDS = ("cuda-host", "cuda-ipc")
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _group(world: int, backend: str, **kw):
    from drafter_lab.kernels.allreduce import Communicator

    tag = f"test-cuda-{os.getpid()}-{secrets.token_hex(4)}"
    kw.setdefault("one_shot_max_bytes", 0)
    kw.setdefault("timeout_s", 10.0)
    devices = torch.cuda.device_count()
    with ThreadPoolExecutor(world) as pool:  # construction waits for all ranks: one thread each
        return list(
            pool.map(lambda r: Communicator(r, world, name=tag, backend=backend, device=r % devices, **kw), range(world))
        )


def _on_streams(comms, calls):
    """Runs calls[r] (no arguments) for every rank on its own stream of its device; waits for all, then
    raises what every rank's kernels recorded, if any did."""
    streams = [torch.cuda.Stream(device=c.device) for c in comms]
    for c, s, call in zip(comms, streams, calls):
        with torch.cuda.device(c.device), torch.cuda.stream(s):
            call()
    for s in streams:
        s.synchronize()
    from drafter_lab.kernels.allreduce import AllReduceError

    errors = []  # every rank's: a peer that failed first explains another's timeout
    for r, c in enumerate(comms):
        try:
            c.check()
        except AllReduceError as e:
            errors.append(f"rank {r}: {e}")
    if errors:
        raise AllReduceError("; ".join(errors))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("world", [2, 4])
def test_cuda_sums_match_torch_bitwise(backend, world):
    from drafter_lab.kernels.allreduce import sum_native

    comms = _group(world, backend)
    gen = torch.Generator().manual_seed(secrets.randbits(31))
    for threshold in (comms[0].capacity, 0):
        for c in comms:
            c.one_shot_max_bytes = threshold
        for dtype in DTYPES:
            for numel in (1, 7, 1003, 28 * 1024 + 5, (1 << 20) // dtype.itemsize + 1):
                parts = [torch.randn(numel, generator=gen).to(dtype) for _ in range(world)]
                ref = sum_native(parts)
                ins = [p.to(c.device) for p, c in zip(parts, comms)]
                outs = [torch.full_like(x, float("nan")) for x in ins]
                _on_streams(comms, [partial(c.all_reduce, ins[r], out=outs[r]) for r, c in enumerate(comms)])
                for r in range(world):
                    assert torch.equal(outs[r].cpu(), ref), f"{backend} rank {r} {dtype} numel={numel} threshold={threshold}"
            _check_fused(comms, gen, dtype, 6, 7168, f"{backend} threshold={threshold}")
    for c in comms:
        c.close()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("world", [2, 4])
def test_cuda_ll_sums_match_torch_bitwise(backend, world):
    """LL sums: every dtype, partial packets, unaligned views, in place; then calls whose sizes
    change call to call, so that packets of older calls lie where a reader polls."""
    from drafter_lab.kernels.allreduce import sum_native

    comms = _group(world, backend)
    ll_cap = comms[0].ll_capacity
    assert 0 < ll_cap <= comms[0].capacity // 2
    for c in comms:
        c.ll_max_bytes = ll_cap
    gen = torch.Generator().manual_seed(secrets.randbits(31))

    def check(numel: int, dtype: torch.dtype, offset: int, what: str):
        parts = [torch.randn(numel + offset, generator=gen).to(dtype) for _ in range(world)]
        ref = sum_native([p[offset:] for p in parts])
        ins = [p.to(c.device)[offset:] for p, c in zip(parts, comms)]  # offset 1: not 16-byte aligned
        outs = [torch.full_like(x, float("nan")) for x in ins] if offset == 0 else ins  # offset 1: in place
        _on_streams(comms, [partial(c.all_reduce, ins[r], out=outs[r]) for r, c in enumerate(comms)])
        for r in range(world):
            assert torch.equal(outs[r].cpu(), ref), f"{backend} LL rank {r} {dtype} numel={numel} {what}"

    for dtype in DTYPES:
        for numel in (1, 3, 5, 7, 1003, 28 * 1024 + 5, ll_cap // dtype.itemsize):
            for offset in (0, 1):
                check(numel, dtype, offset, f"offset={offset}")
    sizes = torch.randint(1, ll_cap // 2, (400 if world == 2 else 100,), generator=gen).tolist()
    for i, numel in enumerate(sizes):
        check(numel, torch.bfloat16, 0, f"call {i} of {len(sizes)} with changing sizes")
    for dtype in DTYPES:  # fused: verify-sized rows, and rows that end mid-packet and unaligned
        for rows, hidden in ((1, 7168), (8, 7168), (5, 1001)):
            _check_fused(comms, gen, dtype, rows, hidden, f"LL rows={rows} hidden={hidden}")
    for c in comms:
        c.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_cuda_generations_wrap_around(backend):
    """Small one-shot calls across 2^31 and 2^32 leave the phase-1 flag lines unwritten; the two-shot,
    fused and LL calls after them still work (generations compare modulo 2^32)."""
    from drafter_lab.kernels.allreduce import sum_native

    comms = _group(2, backend)
    gen = torch.Generator().manual_seed(secrets.randbits(31))
    ll_cap = comms[0].ll_capacity

    def check(numel: int, what: str):
        parts = [torch.randn(numel, generator=gen) for _ in comms]
        ins = [p.to(c.device) for p, c in zip(parts, comms)]
        _on_streams(comms, [partial(c.all_reduce, ins[r]) for r, c in enumerate(comms)])
        for r in range(2):
            assert torch.equal(ins[r].cpu(), sum_native(parts)), f"{backend} rank {r}: {what}"

    for start in (2**31 - 40, 2**32 - 40):
        for c in comms:
            c._impl._set_generation(start)
            c.one_shot_max_bytes, c.ll_max_bytes = c.capacity, 0
        for i in range(80):
            check(37, f"one-shot call {i} after {start}")
        for c in comms:
            c.one_shot_max_bytes = 0
        check(200_003, f"two-shot after {start}")
        _check_fused(comms, gen, torch.float32, 6, 7168, f"{backend} two-shot fused after {start}")
        for c in comms:
            c.ll_max_bytes = ll_cap
        check(1003, f"LL after {start}")
    for c in comms:
        c.close()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("algo", ["one-shot", "two-shot", "LL"])
@pytest.mark.parametrize("late", [0, 1])
@pytest.mark.parametrize("full", [False, True])
def test_cuda_a_late_rank_is_waited_for(backend, algo, late, full):
    """A rank whose call starts ~50 ms after its peer's (a sleep ahead of it on its stream) is waited
    for, well inside the timeout, by every algorithm, at 3001 floats and at LL's whole capacity (every
    thread polling); the sums are exact. (The aliasing test below delays rank 1 the same way, at
    full capacity; this one tells a late peer apart from a stale packet.)"""
    from drafter_lab.kernels.allreduce import sum_native

    comms = _group(2, backend)
    for c in comms:
        c.one_shot_max_bytes = c.capacity if algo == "one-shot" else 0
        c.ll_max_bytes = c.ll_capacity if algo == "LL" else 0
    gen = torch.Generator().manual_seed(secrets.randbits(31))
    parts = [torch.randn(comms[0].ll_capacity // 4 if full else 3001, generator=gen) for _ in comms]
    ins = [p.to(c.device) for p, c in zip(parts, comms)]

    def call(r):
        if r == late:
            torch.cuda._sleep(100_000_000)
        comms[r].all_reduce(ins[r])

    _on_streams(comms, [partial(call, r) for r in range(2)])
    for r in range(2):
        assert torch.equal(ins[r].cpu(), sum_native(parts)), f"{backend} {algo} rank {r}, rank {late} late"
    for c in comms:
        c.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_cuda_no_timeout_waits_for_a_late_rank(backend):
    """timeout_s=inf is "no timeout": its nanoseconds were cast out of range (0 on x86), so a kernel
    timed out at its first poll of a peer ~50 ms late."""
    comms = _group(2, backend, timeout_s=float("inf"))
    ins = [torch.full((3001,), r + 1.0, device=c.device) for r, c in enumerate(comms)]

    def call(r):
        if r == 1:
            torch.cuda._sleep(100_000_000)
        comms[r].all_reduce(ins[r])

    _on_streams(comms, [partial(call, r) for r in range(2)])
    assert all(torch.equal(x.cpu(), torch.full((3001,), 3.0)) for x in ins)
    for c in comms:
        c.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_cuda_ll_packets_do_not_alias_2_to_the_32_calls_later(backend):
    """An LL packet left by a large call, under a run of smaller calls, would match its generation
    again 2^32 calls later and be summed before the peer's fresh one lands; the refresh every 2^30
    calls (layout.h) stamps it stale. The counters jump (2^30, then 2^31 on, keeping every peer
    behind) and the peer's call of the alias waits behind a sleep, so a stale packet is read first."""
    from drafter_lab.kernels.allreduce import sum_native

    comms = _group(2, backend)
    gen = torch.Generator().manual_seed(secrets.randbits(31))
    ll_cap = comms[0].ll_capacity
    numel = ll_cap // 4

    def call(data, ll: bool, sleep_rank1: bool = False):
        for c in comms:
            c.ll_max_bytes, c.one_shot_max_bytes = (ll_cap if ll else 0), c.capacity
        ins = [d.to(c.device) for d, c in zip(data, comms)]

        def rank1():
            if sleep_rank1:
                torch.cuda._sleep(100_000_000)  # ~50 ms: rank 0 polls rank 1's packets meanwhile
            comms[1].all_reduce(ins[1])
        _on_streams(comms, [partial(comms[0].all_reduce, ins[0]), rank1])
        return [x.cpu() for x in ins]

    def jump(next_gen: int):
        for c in comms:
            c._impl._set_generation((next_gen - 1) % 2**32)

    g0 = 2**30 - 100
    jump(g0)
    call([torch.randn(numel, generator=gen) for _ in comms], ll=True)  # the packets that could alias
    jump(2**30)  # the refresh of both buffers, by small calls that write no packet there
    for _ in range(2):
        call([torch.randn(7, generator=gen) for _ in comms], ll=False)
    jump(g0 + 2**31 + 10)  # half way: each peer's flag lines stay behind the caller's generation
    for _ in range(2):
        call([torch.randn(7, generator=gen) for _ in comms], ll=False)
    jump(g0 + 2**32)
    fresh = [torch.randn(numel, generator=gen) for _ in comms]
    got = call(fresh, ll=True, sleep_rank1=True)
    for r in range(2):
        assert torch.equal(got[r], sum_native(fresh)), f"{backend} rank {r}: a stale packet was summed"
    for c in comms:
        c.close()


def _check_fused(comms, gen, dtype, rows, hidden, what):
    from drafter_lab.kernels.allreduce import residual_rmsnorm_native

    world = len(comms)
    parts = [torch.randn(rows, hidden, generator=gen).to(dtype) for _ in range(world)]
    residual = torch.randn(rows, hidden, generator=gen).to(dtype)
    weight = (1 + 0.1 * torch.randn(hidden, generator=gen)).to(dtype)
    ref_out, ref_res = residual_rmsnorm_native(parts, residual, weight, 1e-6)
    dev = [c.device for c in comms]
    ins = [p.to(d) for p, d in zip(parts, dev)]
    res = [residual.to(d) for d in dev]
    w = [weight.to(d) for d in dev]
    outs = [torch.full_like(x, float("nan")) for x in ins]
    res_outs = [torch.full_like(x, float("nan")) for x in ins]
    calls = [
        partial(c.allreduce_residual_rmsnorm, ins[r], res[r], w[r], 1e-6, out=outs[r], residual_out=res_outs[r])
        for r, c in enumerate(comms)
    ]
    _on_streams(comms, calls)
    tol = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}[dtype]
    for r in range(world):
        assert torch.equal(res_outs[r].cpu(), ref_res), f"{what}: fused residual rank {r} {dtype}"
        torch.testing.assert_close(outs[r].cpu().float(), ref_out.float(), rtol=tol, atol=tol)
        assert torch.equal(outs[r], outs[0].to(outs[r].device)), f"{what}: ranks differ"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("ll", [False, True])
def test_cuda_graph_replays_advance_flags_on_device(backend, ll):
    from drafter_lab.kernels.allreduce import sum_native

    world = 2
    comms = _group(world, backend, one_shot_max_bytes=1 << 20)
    for c in comms:
        c.ll_max_bytes = c.ll_capacity if ll else 0
    numel = 8 * 7168  # verify-sized bf16 message
    static_in = [torch.empty(numel, dtype=torch.bfloat16, device=c.device) for c in comms]
    static_out = [torch.empty_like(x) for x in static_in]
    graphs = [torch.cuda.CUDAGraph() for _ in comms]
    streams = [torch.cuda.Stream(device=c.device) for c in comms]
    for r, c in enumerate(comms):
        with torch.cuda.device(c.device), torch.cuda.graph(graphs[r], stream=streams[r]):
            c.all_reduce(static_in[r], out=static_out[r])
    gen = torch.Generator().manual_seed(secrets.randbits(31))
    for _ in range(200):
        parts = [torch.randn(numel, generator=gen).to(torch.bfloat16) for _ in range(world)]
        for r in range(world):
            static_in[r].copy_(parts[r])
            static_out[r].fill_(float("nan"))
        for r in range(world):
            with torch.cuda.device(comms[r].device), torch.cuda.stream(streams[r]):
                graphs[r].replay()
        for s in streams:
            s.synchronize()
        ref = sum_native(parts)
        for r in range(world):
            assert torch.equal(static_out[r].cpu(), ref)
    for c in comms:
        c.close()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("ll", [False, True])
def test_cuda_missing_rank_and_mismatch_are_reported(backend, ll):
    from drafter_lab.kernels.allreduce import AllReduceError

    ll_max = 1 << 20 if ll else 0  # LL for every size that fits it
    comms = _group(2, backend, timeout_s=0.5, ll_max_bytes=ll_max)
    x = torch.randn(1000, device=comms[0].device)
    comms[0].all_reduce(x)  # rank 1 never calls: the kernel gives up after the timeout
    torch.cuda.synchronize(comms[0].device)
    # what it waited on, and what it last read there (a never-written slot: the call before the first)
    with pytest.raises(AllReduceError, match=r"timed out.*rank 1 in call #\d+ \(block \d+\) on its (phase-0 flag "
                                             r"line, last read at call #\d+|LL packet \d+, last read stamped #\d+/#\d+)$"):
        comms[0].check()
    with pytest.raises(AllReduceError):
        comms[0].all_reduce(x)
    for c in comms:
        c.close()

    comms = _group(2, backend, ll_max_bytes=ll_max)
    # 100 and 101 floats: the packets of both fall in the same places, only the flag lines differ
    xs = [torch.randn(100 + r, device=c.device) for r, c in enumerate(comms)]
    with pytest.raises(AllReduceError, match="mismatch"):
        _on_streams(comms, [partial(c.all_reduce, x) for c, x in zip(comms, xs)])
    for c in comms:
        c.close()


def test_async_work_is_not_completed_while_the_sum_is_queued():
    """is_completed() said True while the reduction still sat behind other work on the stream; a
    caller polling it before reading the tensor off that stream's order read a partial sum."""
    from drafter_lab.kernels.allreduce import all_reduce

    (comm,) = _group(1, "cuda-ipc")
    x = torch.randn(4096, device=comm.device)
    want = x.clone()
    with torch.cuda.device(comm.device):
        torch.cuda._sleep(200_000_000)  # ~100 ms ahead of the reduction on the same stream
        work = all_reduce(x, group=comm, async_op=True)
        assert not work.is_completed()
        torch.cuda.current_stream().synchronize()
    assert work.is_completed() and torch.equal(x, want)
    comm.close()
