"""Shared-memory all-reduce, CPU backend, across real processes (this file is also the rank script).

Each rank is `python test_allreduce.py SCENARIO RANK WORLD STORE SEED OUTDIR`: every rank draws
all ranks' inputs from the same fresh seed, so each checks its own result against the torch
reference and writes digests; the test compares digests across ranks (bitwise identity).
Sums are compared exactly: the communicator and `sum_native` add in fp32 in rank order and round
once, so any difference is a bug, not rounding.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from drafter_lab.errors import LabError
from drafter_lab.kernels import _ext

pytestmark = pytest.mark.skipif(not _ext.available(), reason=_ext.unavailable_reason() or "extension built")

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
SHM = Path("/dev/shm")


def _sizes(dtype: torch.dtype) -> list[int]:
    es = dtype.itemsize
    # 1 element; sizes that are not a multiple of 16 bytes; 1 MB + 1 element (> capacity: chunked)
    return [1, 7, 1003, 16 // es * 1000 + 3, (1 << 20) // es + 1]


def _digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()[:16]


def _close(a: torch.Tensor, b: torch.Tensor, tol: float) -> bool:
    """|a - b| <= tol * (1 + |b|) everywhere (torch.testing would import far more than a rank needs)."""
    a, b = a.double(), b.double()
    return bool(((a - b).abs() <= tol * (1 + b.abs())).all())


def _poisoned(like: torch.Tensor) -> torch.Tensor:
    return torch.full_like(like, float("nan"))


# ---------------------------------------------------------------- rank side


def rank_correct(comm, rank: int, world: int, seed: int, store: str) -> dict:
    from drafter_lab.kernels.allreduce import (
        AllReduceError,
        CompletedWork,
        all_reduce,
        residual_rmsnorm_native,
        sum_native,
    )

    gen = torch.Generator().manual_seed(seed)
    digests = []
    tuned = comm.one_shot_max_bytes
    for threshold in (comm.capacity, 0):  # everything one-shot, then everything two-shot
        comm.one_shot_max_bytes = threshold
        for dtype in DTYPES:
            for numel in _sizes(dtype):
                parts = [torch.randn(numel, generator=gen).to(dtype) for _ in range(world)]
                ref = sum_native(parts)
                out = _poisoned(ref)
                assert comm.all_reduce(parts[rank], out=out) is out
                assert torch.equal(out, ref), f"{dtype} numel={numel} threshold={threshold}"
                x = parts[rank].clone()
                comm.all_reduce(x)
                assert torch.equal(x, ref), f"in place {dtype} numel={numel}"
                digests.append(_digest(out))
            for rows, hidden in ((1, 1003), (5, 2048)):
                parts = [torch.randn(rows, hidden, generator=gen).to(dtype) for _ in range(world)]
                residual = torch.randn(rows, hidden, generator=gen).to(dtype)
                weight = (1 + 0.1 * torch.randn(hidden, generator=gen)).to(dtype)
                ref_out, ref_res = residual_rmsnorm_native(parts, residual, weight, 1e-6)
                out, res_out = _poisoned(residual), _poisoned(residual)
                comm.allreduce_residual_rmsnorm(parts[rank], residual, weight, 1e-6, out=out, residual_out=res_out)
                assert torch.equal(res_out, ref_res), f"fused residual {dtype} {rows}x{hidden}"
                tol = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}[dtype]
                assert _close(out, ref_out, tol), f"fused output {dtype} {rows}x{hidden}"
                # error against an fp32 reference: no worse than plain PyTorch in this dtype
                ref32, _ = residual_rmsnorm_native([p.double() for p in parts], residual.double(), weight.double(), 1e-6)
                plain_r = torch.stack(parts).sum(0) + residual
                plain_rf = plain_r.float()
                plain = (plain_rf * torch.rsqrt(plain_rf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(dtype) * weight
                err_fused = (out.double() - ref32).abs().max().item()
                err_plain = (plain.double() - ref32).abs().max().item()
                # The fused kernel sums the squares in another order than torch: a few fp32 ulps of the
                # output apart (in fp32, plain *is* the reference, so its error is 0).
                slack = 8 * torch.finfo(torch.float32).eps * ref32.abs().max().item()
                assert err_fused <= err_plain + slack, f"fused error {err_fused} > plain {err_plain} ({dtype})"
                x, r = parts[rank].clone(), residual.clone()
                comm.allreduce_residual_rmsnorm(x, r, weight, 1e-6, out=x, residual_out=r)
                assert torch.equal(r, ref_res) and torch.equal(x, out), f"fused in place {dtype}"
                digests += [_digest(out), _digest(res_out)]
    comm.one_shot_max_bytes = tuned

    # 10,000 calls (2 ranks; 4 ranks share 2 cores in CI, so 1,000), alternating buffers and
    # generations: each result must be its own call's sum
    pool = [[torch.randn(37, generator=gen).to(torch.bfloat16) for _ in range(world)] for _ in range(17)]
    refs = [sum_native(p) for p in pool]
    out = torch.empty(37, dtype=torch.bfloat16)
    for i in range(10_000 if world == 2 else 1_000):
        out.fill_(float("nan"))
        comm.all_reduce(pool[i % 17][rank], out=out)
        if not torch.equal(out, refs[i % 17]):
            raise AssertionError(f"call {i}: wrong result")

    # torch.distributed's call shape
    x = pool[0][rank].clone()
    assert all_reduce(x, group=comm) is None and torch.equal(x, refs[0])
    x = pool[1][rank].clone()
    work = all_reduce(x, op=torch.distributed.ReduceOp.SUM, group=comm, async_op=True)
    assert isinstance(work, CompletedWork) and work.wait() and torch.equal(x, refs[1])
    try:
        all_reduce(x, op="max", group=comm)
        raise AssertionError("op=max accepted")
    except LabError:
        pass

    # mismatched calls fail on every rank (2 ranks: sizes; 4 ranks: dtypes), and stay failed
    if world == 2:
        bad = torch.randn(100 + rank)
    else:
        bad = torch.randn(100).to(torch.bfloat16 if rank == 0 else torch.float32)
    errors = []
    for _ in range(2):
        try:
            comm.all_reduce(bad)
        except AllReduceError as e:
            errors.append(str(e))
    assert len(errors) == 2, errors
    return {"digests": digests, "threshold": tuned, "errors": errors, "segment": comm._impl.name}


def rank_failures(comm, rank: int, world: int, seed: int, store: str) -> dict:
    """Rank 1 first arrives too late (rank 0 times out; rank 1 then learns that rank 0 gave up),
    then, on a second communicator, dies right after init (rank 0 notices the dead pid)."""
    from drafter_lab.kernels.allreduce import AllReduceError, Communicator

    result = {}
    if rank == 1:
        time.sleep(STUCK_TIMEOUT + 1)
    t = time.monotonic()
    try:
        comm.all_reduce(torch.randn(1000))
        raise AssertionError("no error although a rank arrived after the timeout")
    except AllReduceError as e:
        result["late"] = {"error": str(e), "elapsed": time.monotonic() - t}
    comm2 = Communicator(rank, world, path=store, name="second", timeout_s=DEAD_TIMEOUT, one_shot_max_bytes=0)
    if rank == 1:  # dies right after init, without closing; its exit code says whether it saw rank 0 give up
        os._exit(0 if "rank 0 gave up" in result["late"]["error"] else 3)
    t = time.monotonic()
    try:
        comm2.all_reduce(torch.randn(1000))
        raise AssertionError("no error although rank 1 died")
    except AllReduceError as e:
        result["dead"] = {"error": str(e), "elapsed": time.monotonic() - t}
    return result


def rank_wrap(comm, rank: int, world: int, seed: int, store: str) -> dict:
    """Generations compare modulo 2^32: small one-shot calls across 2^31 and across 2^32 leave the
    phase-1 and higher-block flag lines unwritten, and the two-shot calls after them still work."""
    from drafter_lab.kernels.allreduce import residual_rmsnorm_native, sum_native

    gen = torch.Generator().manual_seed(seed)
    small = [[torch.randn(37, generator=gen) for _ in range(world)] for _ in range(3)]
    big = [torch.randn(3, 40_000, generator=gen) for _ in range(world)]  # 480 KB: several flag blocks
    residual, weight = torch.randn(3, 40_000, generator=gen), torch.rand(40_000, generator=gen) + 0.5
    for start in (2**31 - 40, 2**32 - 40):
        comm.barrier()  # no rank still reads the last call's buffer
        comm._impl._set_generation(start)
        comm.one_shot_max_bytes = comm.capacity
        for i in range(80):
            assert torch.equal(comm.all_reduce(small[i % 3][rank].clone()), sum_native(small[i % 3])), i
        comm.one_shot_max_bytes = 0
        assert torch.equal(comm.all_reduce(big[rank].clone()), sum_native(big)), f"two-shot sum after {start}"
        got = comm.allreduce_residual_rmsnorm(big[rank], residual, weight)
        ref = residual_rmsnorm_native(big, residual, weight)
        assert torch.equal(got[1], ref[1]), f"two-shot fused after {start}"
    return {}


def _voluntary_switches() -> int:
    """This process's voluntary context switches so far (each futex sleep of a wait is one)."""
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith("voluntary_ctxt"))
    return int(line.split()[1])


def rank_sleeps(comm, rank: int, world: int, seed: int, store: str) -> dict:
    """2000 calls in which rank 1 arrives 2 ms late every 100th, so that rank 0 sleeps 20 times;
    returns each rank's voluntary context switches over them."""
    x = torch.ones(4096, dtype=torch.bfloat16)
    for _ in range(200):
        comm.all_reduce(x)
    before = _voluntary_switches()
    for i in range(2000):
        if rank == 1 and i % 100 == 0:
            time.sleep(0.002)
        comm.all_reduce(x)
    return {"switches": _voluntary_switches() - before}


def rank_fork(comm, rank: int, world: int, seed: int, store: str) -> dict:
    """Rank 1 forks a child that closes its copy of the communicator (as a worker forked after init
    might), then both ranks go on; rank 1 arrives 0.3 s late, past the peers' liveness checks."""
    x = torch.full((5,), rank + 1.0)
    assert torch.equal(comm.all_reduce(x.clone()), torch.full((5,), 3.0))
    if rank == 1:
        child = os.fork()
        if child == 0:
            comm.close()
            os._exit(0)
        os.waitpid(child, 0)
        time.sleep(0.3)
    return {"sum": comm.all_reduce(x.clone()).tolist()}


STUCK_TIMEOUT = 1.0
DEAD_TIMEOUT = 10.0
SCENARIOS = {"correct": (rank_correct, None, 30.0), "failures": (rank_failures, 0, STUCK_TIMEOUT),
             "wrap": (rank_wrap, 0, 30.0), "sleeps": (rank_sleeps, None, 30.0),
             "fork": (rank_fork, 0, 5.0)}  # a set threshold: no autotune calls write flag lines first


def rank_main(scenario: str, rank: int, world: int, store: str, seed: int, outdir: str) -> None:
    from drafter_lab.kernels.allreduce import Communicator

    fn, threshold, timeout = SCENARIOS[scenario]
    comm = Communicator(rank, world, path=store, timeout_s=timeout, one_shot_max_bytes=threshold)
    result = fn(comm, rank, world, seed, store)
    comm.close()
    Path(outdir, f"rank{rank}.json").write_text(json.dumps(result))


# ---------------------------------------------------------------- test side


def _launch(scenario: str, world: int, tmp_path: Path) -> tuple[list[subprocess.Popen], Path, int]:
    seed = secrets.randbits(31)
    outdir = tmp_path / f"{scenario}-{world}"
    outdir.mkdir()
    store = str(outdir / "store")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, scenario, str(r), str(world), store, str(seed), str(outdir)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(world)
    ]
    return procs, outdir, seed


def _collect(procs, outdir: Path, seed: int, expect_ok: range | list[int]) -> list[dict]:
    logs = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise AssertionError(f"ranks hung (seed {seed})") from None
        logs.append(out)
    for r in expect_ok:
        assert procs[r].returncode == 0, f"rank {r} failed (seed {seed}):\n{logs[r]}"
    return [json.loads((outdir / f"rank{r}.json").read_text()) for r in expect_ok]


@pytest.mark.parametrize("world", [2, 4])
def test_sums_match_torch_and_agree_bitwise_across_ranks(world, tmp_path):
    procs, outdir, seed = _launch("correct", world, tmp_path)
    results = _collect(procs, outdir, seed, range(world))
    assert all(r["digests"] == results[0]["digests"] for r in results), f"ranks differ (seed {seed})"
    assert len({r["threshold"] for r in results}) == 1, "ranks chose different one-shot thresholds"
    for r in results:
        assert "mismatch" in r["errors"][0] and "failed earlier" in r["errors"][1], r["errors"]
    assert not (SHM / results[0]["segment"].lstrip("/")).exists(), "segment name not unlinked after init"


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2 or not Path("/proc/self/status").exists(),
                    reason="needs 2 cores (with fewer, a rank that woke its peer sleeps at once by design) and Linux")
def test_a_late_peer_does_not_leave_the_ranks_sleeping_in_turn(tmp_path):
    """Once a rank has slept and been woken, two ranks with a core each go back to spinning: each
    of rank 1's 20 late arrivals costs about one sleep, not a futex ping-pong in which each rank
    sleeps because it woke the other (that made about 900 sleeps of these 2000 calls)."""
    procs, outdir, seed = _launch("sleeps", 2, tmp_path)
    results = _collect(procs, outdir, seed, range(2))
    assert all(r["switches"] < 200 for r in results), results


def test_a_forked_child_closing_its_copy_leaves_the_rank_in_the_group(tmp_path):
    """A child's close() cleared the parent's seat: its peer failed with "rank 1 closed its communicator"."""
    procs, outdir, seed = _launch("fork", 2, tmp_path)
    results = _collect(procs, outdir, seed, range(2))
    assert all(r["sum"] == [3.0] * 5 for r in results), results


def test_generations_wrap_around(tmp_path):
    procs, outdir, seed = _launch("wrap", 2, tmp_path)
    _collect(procs, outdir, seed, range(2))


def test_dead_and_late_ranks_raise_instead_of_hanging(tmp_path):
    procs, outdir, seed = _launch("failures", 2, tmp_path)
    (result,) = _collect(procs, outdir, seed, [0])
    assert procs[1].returncode == 0, "the late rank did not learn that rank 0 gave up"
    late, dead = result["late"], result["dead"]
    assert "timed out after 1 s" in late["error"] and "rank 1" in late["error"], late["error"]
    assert STUCK_TIMEOUT <= late["elapsed"] < STUCK_TIMEOUT + 20
    assert "rank 1" in dead["error"] and "exited" in dead["error"], dead["error"]
    assert dead["elapsed"] < DEAD_TIMEOUT, "a dead rank should be noticed before the timeout"


def test_init_times_out_naming_the_missing_rank_and_leaves_no_segment():
    from drafter_lab.kernels.allreduce import AllReduceError, Communicator

    tag = f"test-init-{os.getpid()}-{secrets.token_hex(4)}"
    with pytest.raises(AllReduceError, match=r"rank 1 \(not attached\)"):
        Communicator(0, 2, name=tag, timeout_s=0.3)
    assert not (SHM / f"drafter_lab_ar.{tag}").exists()


def _stamped(seg: Path) -> bool:
    """The segment exists and its creator wrote the header's magic (it is created, sized, then stamped)."""
    try:
        with open(seg, "rb") as f:
            return f.read(8) != bytes(8)
    except FileNotFoundError:
        return False


@contextlib.contextmanager
def _waiting_rank0(prefix: str):
    """A process that created segment `<prefix>-...` as rank 0 of 2 and waits for rank 1; yields
    (tag, segment path) once the header is stamped, and kills the process on leaving."""
    tag = f"{prefix}-{os.getpid()}-{secrets.token_hex(4)}"
    seg = SHM / f"drafter_lab_ar.{tag}"
    code = (
        "from drafter_lab.kernels.allreduce import Communicator\n"
        f"Communicator(0, 2, name={tag!r}, timeout_s=60)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code], env=dict(os.environ, OMP_NUM_THREADS="1"))
    try:
        deadline = time.monotonic() + 60
        while not _stamped(seg):
            assert child.poll() is None and time.monotonic() < deadline, "rank 0 never created its segment"
            time.sleep(0.05)
        yield tag, seg
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()


def test_stale_segment_of_a_killed_run_is_removed_at_next_init():
    from drafter_lab.kernels.allreduce import Communicator, cleanup_stale_segments

    with _waiting_rank0("test-stale") as (tag, seg):
        assert str("/" + seg.name) not in cleanup_stale_segments(), "removed a live run's segment"
        assert seg.exists()
    assert seg.exists(), "a killed init should leave its segment behind"
    with Communicator(0, 1, name=f"{tag}-next", one_shot_max_bytes=0):
        pass
    assert not seg.exists(), "stale segment survived the next init"


def test_a_segment_being_created_is_not_taken_over():
    """A segment of the name without its header yet may be another creator's between shm_open and the
    stamp: taking it over left two rank 0s, their peers attached to one. Once it has aged past the
    grace period it is a killed init's, and is replaced."""
    from drafter_lab.kernels.allreduce import AllReduceError, Communicator

    tag = f"test-creating-{os.getpid()}-{secrets.token_hex(4)}"
    seg = SHM / f"drafter_lab_ar.{tag}"
    seg.write_bytes(b"")  # shm_open(O_CREAT) done, not yet sized nor stamped
    try:
        with pytest.raises(AllReduceError, match="in use by a live process or still being created"):
            Communicator(0, 1, name=tag)
        os.utime(seg, (time.time() - 60, time.time() - 60))
        with Communicator(0, 1, name=tag) as comm:
            x = torch.randn(5)
            assert torch.equal(comm.all_reduce(x.clone()), x)
    finally:
        seg.unlink(missing_ok=True)


def test_a_segment_of_another_layout_version_is_refused():
    from drafter_lab.kernels.allreduce import AllReduceError, Communicator, cleanup_stale_segments

    with _waiting_rank0("test-version") as (tag, seg):
        with open(seg, "r+b") as f:  # Header.version, after the 8-byte magic: as an older lab wrote it
            f.seek(8)
            f.write((1).to_bytes(4, "little"))
        with pytest.raises(AllReduceError, match=r"layout version 1, this drafter_lab reads version 2"):
            Communicator(1, 2, name=tag, timeout_s=5)
    cleanup_stale_segments(0)
    assert not seg.exists()


def test_single_rank_and_bad_input():
    from drafter_lab.kernels.allreduce import AllReduceError, AllReduceInputError, Communicator

    with pytest.raises(LabError, match="rendezvous"):
        Communicator(0, 1)
    with pytest.raises(LabError, match="backend"):
        Communicator(0, 1, name="x", backend="nccl")
    comm = Communicator(0, 1, name=f"test-single-{os.getpid()}", max_bytes=4096)
    x = torch.randn(3000)  # 12 KB: three chunks of 4 KB
    out = _poisoned(x)
    comm.all_reduce(x, out=out)
    assert torch.equal(out, x)
    w = torch.rand(1024) + 0.5
    r = torch.randn(2, 1024)
    from drafter_lab.kernels.allreduce import residual_rmsnorm_native

    got = comm.allreduce_residual_rmsnorm(x[:2048].view(2, 1024), r, w)
    ref = residual_rmsnorm_native([x[:2048].view(2, 1024)], r, w)
    torch.testing.assert_close(got[0], ref[0], rtol=1e-5, atol=1e-5)
    assert torch.equal(got[1], ref[1])
    with pytest.raises(AllReduceInputError, match="dtype"):
        comm.all_reduce(torch.arange(4))
    with pytest.raises(AllReduceInputError, match="contiguous"):
        comm.all_reduce(torch.randn(4, 4).t())
    with pytest.raises(AllReduceInputError, match="match"):
        comm.all_reduce(torch.randn(4), out=torch.randn(5))
    with pytest.raises(AllReduceInputError, match="out must match the input's dtype and shape"):
        comm.all_reduce(torch.randn(8), out=torch.randn(2, 4))  # as many elements, another shape
    with pytest.raises(AllReduceInputError, match="residual must match the input's dtype and shape"):
        comm.allreduce_residual_rmsnorm(r, torch.randn(1, 2048), w)
    with pytest.raises(AllReduceInputError, match="overlaps"):
        y = torch.randn(8)
        comm.all_reduce(y[:6], out=y[2:])
    with pytest.raises(AllReduceInputError, match="weight"):
        comm.allreduce_residual_rmsnorm(r, r.clone(), torch.ones(7))
    # An output starting one row into an input would overwrite rows before they are read.
    buf = torch.randn(3, 1024)
    with pytest.raises(AllReduceInputError, match="residual_out partially overlaps residual"):
        comm.allreduce_residual_rmsnorm(r, buf[:2], w, residual_out=buf[1:])
    with pytest.raises(AllReduceInputError, match="out partially overlaps residual"):
        comm.allreduce_residual_rmsnorm(r, buf[:2], w, out=buf[1:])
    with pytest.raises(AllReduceInputError, match="out must not overlap weight"):
        comm.allreduce_residual_rmsnorm(r, r.clone(), buf[0], out=buf[:2])
    res = r.clone()  # in place is fine: residual_out and out may be residual and x themselves
    got = comm.allreduce_residual_rmsnorm(x[:2048].view(2, 1024), res, w, residual_out=res)
    assert got[1].data_ptr() == res.data_ptr() and torch.equal(res, ref[1])
    with pytest.raises(AllReduceInputError, match="does not fit"):
        comm.allreduce_residual_rmsnorm(torch.randn(1, 2048), torch.randn(1, 2048), torch.ones(2048))
    assert comm.ll_capacity == 0 and comm.ll_max_bytes == 0, "the cpu backend has no LL area"
    with pytest.raises(AllReduceInputError, match="LL protocol.*CUDA"):
        comm.ll_max_bytes = 1024
    with pytest.raises(ValueError, match="LL protocol.*CUDA"):  # the native layer: algo 3 forces LL
        comm._impl.all_reduce(x, x, 3)
    with pytest.raises(ValueError, match="algo must be"):
        comm._impl.fused(r, r, w, r.clone(), r.clone(), 1e-6, 3)
    comm.close()
    with pytest.raises(AllReduceError, match="closed"):
        comm.all_reduce(x)


if __name__ == "__main__":
    rank_main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5]), sys.argv[6])
