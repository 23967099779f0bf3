"""All-reduce (CPU backend) edge cases: a closed communicator's properties, what a failed init
leaves behind, a fixed name reused at once, and sums at sizes and world sizes the main test skips."""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from drafter_lab.kernels import _ext

pytestmark = pytest.mark.skipif(not _ext.available(), reason=_ext.unavailable_reason() or "extension built")

SHM = Path("/dev/shm")


def _tag(what: str) -> str:
    return f"test-{what}-{os.getpid()}-{secrets.token_hex(4)}"


def test_a_closed_communicators_properties_are_one_line_errors():
    """capacity, rank and world_size raised the native CommError (no LabError: a traceback)."""
    from drafter_lab.kernels.allreduce import AllReduceError, Communicator

    comm = Communicator(0, 1, name=_tag("closed"), one_shot_max_bytes=0)
    comm.close()
    for prop in ("capacity", "rank", "world_size"):
        with pytest.raises(AllReduceError, match="^this communicator is closed$"):
            getattr(comm, prop)
    assert repr(comm) == "Communicator(closed)"


def test_a_failed_init_leaves_no_segment_while_its_error_is_held():
    """The error's traceback held the half-built communicator, so its segment stayed named and
    mapped by a live pid: a retry of the name (a REPL keeps the last error) read 'in use'."""
    from drafter_lab.kernels.allreduce import AllReduceError, Communicator

    tag = _tag("failed-init")
    errors = []
    for _ in range(2):
        try:
            Communicator(0, 2, name=tag, timeout_s=0.2)
        except AllReduceError as e:
            errors.append(e)  # held, as sys.last_value holds it
        assert not (SHM / f"drafter_lab_ar.{tag}").exists()
    assert all("timed out" in str(e) for e in errors), errors


def _rank0_in_init_barrier(tag: str, timeout_s: float):
    """A native rank 0 of 2 on `tag` that runs the init barrier but not connect's unlink after it."""
    from drafter_lab.kernels.allreduce import _native

    native = _native()
    return native.Communicator(native.segment_name(tag), 0, 2, 1 << 20, 16, timeout_s, "cpu", -1)


def test_a_name_reused_at_once_waits_for_rank_0s_new_segment():
    """Rank 0 unlinks the name only after the init barrier: a rank 1 that closed and reopened the
    name before that joined the finished group's segment, its init barrier passed at once, and its
    calls then failed or timed out while rank 0 waited for it on the new segment."""
    from drafter_lab.kernels.allreduce import Communicator

    tag = _tag("reuse")
    old = _rank0_in_init_barrier(tag, 10.0)
    t = threading.Thread(target=old.barrier)  # the init barrier, the unlink not yet done
    t.start()
    Communicator(1, 2, name=tag, timeout_s=10, one_shot_max_bytes=0).close()
    t.join()
    results, errors = {}, []

    def rank0():
        try:
            old.close()  # rank 0 removes the old name and makes the new group's segment
            with Communicator(0, 2, name=tag, timeout_s=10, one_shot_max_bytes=0) as comm:
                results[0] = comm.all_reduce(torch.full((5,), 1.0))
        except Exception as e:
            errors.append(e)

    late = threading.Timer(0.3, rank0)
    late.start()
    try:
        with Communicator(1, 2, name=tag, timeout_s=10, one_shot_max_bytes=0) as comm:
            results[1] = comm.all_reduce(torch.full((5,), 2.0))
    finally:
        late.join()
    assert not errors, errors
    assert all(torch.equal(results[r], torch.full((5,), 3.0)) for r in (0, 1))
    assert not (SHM / f"drafter_lab_ar.{tag}").exists()


def test_a_rank_arriving_after_its_peer_gave_up_on_init_is_told_so():
    """The last rank to arrive passes the init barrier without waiting, so it never looked at the
    abort: it joined a group whose rank 0 had already failed, and its segment then leaked."""
    from drafter_lab.kernels.allreduce import AllReduceError, Communicator, _native

    tag = _tag("late-init")
    rank0 = _rank0_in_init_barrier(tag, 0.2)
    with pytest.raises(_native().CommError, match="timed out"):
        rank0.connect()  # gave up, not yet closed
    try:
        with pytest.raises(AllReduceError, match=r"rank 0 gave up: all-reduce timed out.*rank 1 arrived after it"):
            Communicator(1, 2, name=tag, timeout_s=5, one_shot_max_bytes=0)
    finally:
        rank0.close()
    assert not (SHM / f"drafter_lab_ar.{tag}").exists()


RANK = """
import sys, torch
from drafter_lab.kernels.allreduce import Communicator, sum_native
rank, world, path, seed = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
comm = Communicator(rank, world, path=path, timeout_s=30, max_bytes=8192, blocks=3, one_shot_max_bytes=0)
g = torch.Generator().manual_seed(seed)
for threshold in (comm.capacity, 0):
    comm.one_shot_max_bytes = threshold
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for numel in (0, 1, 33, 1025, 8192 // dtype.itemsize + 7):  # empty, odd, past the capacity
            parts = [(torch.randn(numel, generator=g) * 100).to(dtype) for _ in range(world)]
            ref = sum_native(parts)
            out = torch.full_like(ref, float("nan"))
            assert comm.all_reduce(parts[rank], out=out) is out and torch.equal(out, ref), (dtype, numel)
            x = torch.empty(numel + 1, dtype=dtype)[1:].copy_(parts[rank])  # in place, off the storage start
            assert torch.equal(comm.all_reduce(x), ref), (dtype, numel)
comm.close()
"""


def test_sums_of_odd_and_empty_sizes_over_three_ranks(tmp_path):
    seed = secrets.randbits(31)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    args = [str(tmp_path / "store"), str(seed)]
    procs = [
        subprocess.Popen([sys.executable, "-c", RANK, str(r), "3", *args], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
        for r in range(3)
    ]
    logs = [p.communicate(timeout=120)[0] for p in procs]
    for r, p in enumerate(procs):
        assert p.returncode == 0, f"rank {r} (seed {seed}):\n{logs[r]}"


def _pair(make, ranks=(0, 1)):
    """Runs make(rank) for each rank on its own thread; returns ({rank: result}, {rank: error})."""
    results, errors = {}, {}

    def run(r):
        try:
            results[r] = make(r)
        except Exception as e:
            errors[r] = e

    threads = [threading.Thread(target=run, args=(r,)) for r in ranks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results, errors


def _tuned_pair(max_bytes: int) -> dict:
    """Two ranks on one store that tune their thresholds at init: {rank: (one_shot_max_bytes, capacity)}."""
    from drafter_lab.kernels.allreduce import Communicator

    store = dist.HashStore()

    def rank(r):
        with Communicator(r, 2, store=store, timeout_s=10, max_bytes=max_bytes) as comm:
            return comm.one_shot_max_bytes, comm.capacity

    results, errors = _pair(rank)
    assert not errors, errors
    return results


def test_a_barrier_its_peer_gave_up_on_fails_on_the_late_rank_too():
    """A rank arriving after its peer timed out found the peer's flags already posted, so none of
    its waits looked at the abort word: it passed the barrier rank 0 had raised for. (A call late
    the same way returns its sum and fails at the next call: the abort word does not say which call
    a peer gave up on, and checking it after every call failed calls that had completed, where a
    peer failed the next one first; the 4-rank test in test_allreduce.py meets that.)"""
    from drafter_lab.kernels.allreduce import AllReduceError, Communicator

    tag = _tag("late-barrier")
    comms, errors = _pair(lambda r: Communicator(r, 2, name=tag, timeout_s=2, one_shot_max_bytes=1 << 20))
    assert not errors, errors
    try:
        with pytest.raises(AllReduceError, match="timed out after 2 s: rank 0 waited for rank 1"):
            comms[0].barrier()
        with pytest.raises(AllReduceError, match=r"^rank 0 gave up: all-reduce timed out.*rank 1 arrived after it"):
            comms[1].barrier()
        with pytest.raises(AllReduceError, match="rank 0 gave up"):
            comms[1].all_reduce(torch.ones(16))
    finally:
        for comm in comms.values():
            comm.close()


@pytest.mark.parametrize("solo", [0, 1])
def test_a_rendezvous_file_left_by_a_failed_run_does_not_hold_up_the_next(tmp_path, solo):
    """A rank counted its communicators on the store as it began each one, so a run whose rank
    timed out alone left its count one ahead: every later run on that path waited for a key
    the other rank never published."""
    from drafter_lab.kernels.allreduce import AllReduceError, Communicator

    path = tmp_path / "store"
    with pytest.raises(AllReduceError, match="timed out|did not publish"):
        Communicator(solo, 2, path=path, timeout_s=0.3, one_shot_max_bytes=0)

    def rank(r):
        with Communicator(r, 2, path=path, timeout_s=5, one_shot_max_bytes=0) as comm:
            return comm.all_reduce(torch.full((3,), r + 1.0))

    for _ in range(2):  # and the run after that one
        results, errors = _pair(rank)
        assert not errors, errors
        assert all(torch.equal(results[r], torch.full((3,), 3.0)) for r in (0, 1))


KILLED_RANK_1 = """
import sys
from drafter_lab.kernels.allreduce import Communicator
Communicator(1, 2, path=sys.argv[1], timeout_s=60, one_shot_max_bytes=0)
"""


def test_a_rendezvous_file_of_a_killed_run_does_not_hold_up_the_next(tmp_path):
    """A rank 1 killed while it waited for rank 0 had already counted its communicator there."""
    from drafter_lab.kernels.allreduce import Communicator

    path = tmp_path / "store"
    proc = subprocess.Popen([sys.executable, "-c", KILLED_RANK_1, str(path)], env=dict(os.environ, OMP_NUM_THREADS="1"))
    try:
        deadline = time.monotonic() + 60
        while not (path.exists() and path.stat().st_size > 0) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # it counts, then waits for rank 0's key
    finally:
        proc.kill()
        proc.wait()

    def rank(r):
        with Communicator(r, 2, path=path, timeout_s=5, one_shot_max_bytes=0) as comm:
            return comm.all_reduce(torch.full((3,), r + 1.0))

    results, errors = _pair(rank)
    assert not errors, errors
    assert all(torch.equal(results[r], torch.full((3,), 3.0)) for r in (0, 1))


@pytest.mark.parametrize("ask", [{"max_bytes": 8192}, {"blocks": 8}, {"world_size": 3}])
def test_a_rank_that_refuses_rank_0s_segment_makes_rank_0_fail_at_once(ask):
    """Rank 1 raised the mismatch at once but rank 0 waited out the whole timeout for it, then
    blamed rank 1 as 'not attached': now rank 0 raises rank 1's reason."""
    from drafter_lab.kernels.allreduce import AllReduceError, Communicator

    tag = _tag("refused")
    why = (r"shared-memory segment \S+ was created for world size 2, rank 1 expects 3" if "world_size" in ask
           else r"rank 0 created .*; rank 1 asked for ")

    def rank(r):
        sizes = {"world_size": 2, "max_bytes": 4096, "blocks": 16, **(ask if r else {})}
        Communicator(r, sizes.pop("world_size"), name=tag, timeout_s=8, one_shot_max_bytes=0, **sizes)

    _, errors = _pair(rank)
    assert isinstance(errors.get(1), AllReduceError) and re.search(why, str(errors[1])), errors
    assert isinstance(errors.get(0), AllReduceError), errors
    assert re.match(rf"^rank 0: rank 1 gave up: {why}", str(errors[0])), errors[0]
    assert not (SHM / f"drafter_lab_ar.{tag}").exists()
