"""All-reduce review: a child forked after init, a close or a second call on another thread while
a call is in flight, and reduce-op names on the dist.all_reduce-shaped wrapper. Scenarios that
crashed run in their own interpreter, so a crash fails the test instead of pytest."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import textwrap

import pytest
import torch

from drafter_lab.kernels import _ext

pytestmark = pytest.mark.skipif(not _ext.available(), reason=_ext.unavailable_reason() or "extension built")


def _tag(what: str) -> str:
    return f"test-s61-{what}-{os.getpid()}-{secrets.token_hex(4)}"


def _python(code: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))


def _finish(procs: list[subprocess.Popen]) -> list[str]:
    logs = []
    for p in procs:
        try:
            logs.append(p.communicate(timeout=60)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise AssertionError("ranks hung") from None
    for p, log in zip(procs, logs):
        assert p.returncode == 0, f"exit {p.returncode}:\n{log}"
    return logs


FORK_RANK = """
    import os, sys, threading, time, torch
    from drafter_lab.kernels.allreduce import AllReduceError, Communicator
    rank, name = int(sys.argv[1]), sys.argv[2]
    comm = Communicator(rank, 2, name=name, timeout_s=10, one_shot_max_bytes=0)
    x = torch.full((5,), rank + 1.0)
    sums = [comm.all_reduce(x.clone()).tolist()]
    if rank == 0:
        time.sleep(0.5)  # rank 1's thread waits inside its call meanwhile
        sums.append(comm.all_reduce(x.clone()).tolist())
    else:
        t = threading.Thread(target=lambda: sums.append(comm.all_reduce(x.clone()).tolist()))
        t.start()
        time.sleep(0.2)
        child = os.fork()  # a worker forked after init, while a thread holds the communicator
        if child == 0:
            try:
                comm.all_reduce(torch.full((5,), 100.0))
                os._exit(3)
            except AllReduceError as e:
                refused = "was forked from it" in str(e)
            comm.close()  # its copy of the call lock is held by a thread the child lacks
            os._exit(0 if refused else 4)
        _, status = os.waitpid(child, 0)
        assert os.waitstatus_to_exitcode(status) == 0, status
        t.join()
    sums += [comm.all_reduce(x.clone()).tolist() for _ in range(3)]
    assert sums == [[3.0] * 5] * 5, sums
    comm.close()
"""


def test_a_child_forked_after_init_is_refused_and_the_group_goes_on():
    """The child posted the rank's flags as its own: rank 0's call summed the child's tensor (101,
    not 3) and nothing raised. The child must not wait for the lock a thread it lacks holds."""
    name = _tag("fork")
    _finish([_python(FORK_RANK, str(r), name) for r in (0, 1)])


CLOSE_IN_FLIGHT = """
    import threading, time, sys, torch
    from drafter_lab.kernels.allreduce import AllReduceError, Communicator
    name = sys.argv[1]
    peer = []
    t = threading.Thread(target=lambda: peer.append(Communicator(1, 2, name=name, timeout_s=10, one_shot_max_bytes=0)))
    t.start()
    comm = Communicator(0, 2, name=name, timeout_s=1, one_shot_max_bytes=0)
    t.join()
    errors = []

    def call():  # rank 1 never calls: this waits out its timeout with the GIL released
        try:
            comm.all_reduce(torch.ones(10))
        except AllReduceError as e:
            errors.append(str(e))

    caller = threading.Thread(target=call)
    caller.start()
    time.sleep(0.3)  # inside the wait by now (if not, the close merely comes first)
    comm.close()
    caller.join()
    assert len(errors) == 1 and ("timed out" in errors[0] or "closed" in errors[0]), errors
    assert repr(comm) == "Communicator(closed)"
    peer[0].close()
"""


def test_a_close_on_another_thread_waits_for_the_call_in_flight():
    """close() unmapped the segment while a call on another thread still read it: a segfault."""
    _finish([_python(CLOSE_IN_FLIGHT, _tag("close"))])


TWO_THREADS_RANK = """
    import sys, threading, torch
    from drafter_lab.kernels.allreduce import Communicator
    rank, name = int(sys.argv[1]), sys.argv[2]
    comm = Communicator(rank, 2, name=name, timeout_s=20, one_shot_max_bytes=4096)
    calls, bad = 1500, []

    def run(n, numel):
        x = torch.full((numel,), rank + 1.0)
        for i in range(n):
            out = comm.all_reduce(x, out=torch.empty_like(x))
            if not torch.equal(out, torch.full_like(x, 3.0)):
                bad.append(i)

    # rank 0 calls from two threads at once; rank 1 from one. Each call of either size must pair
    # with a call of the same size, so both of rank 0's threads send 2000 elements.
    threads = [threading.Thread(target=run, args=(calls, 2000)) for _ in range(2 if rank == 0 else 0)]
    for t in threads:
        t.start()
    if rank == 1:
        run(2 * calls, 2000)
    for t in threads:
        t.join()
    assert not bad, bad[:10]
    comm.close()
"""


def test_calls_from_two_threads_of_one_rank_take_turns():
    """Two threads shared the generation counter and the slot: calls got the same generation or
    posted flags out of order (wrong sums, "out of step", or a timeout)."""
    name = _tag("threads")
    _finish([_python(TWO_THREADS_RANK, str(r), name) for r in (0, 1)])


@pytest.mark.parametrize("op", ["SUM", "Sum", "sum"])
def test_a_sum_named_in_any_case_reaches_the_communicator(op):
    """A torch group took op="SUM" (its name is looked up case-blind) while a Communicator refused
    it as "only sums"."""
    import torch.distributed as dist

    from drafter_lab.kernels.allreduce import AllReduceInputError, Communicator, all_reduce

    with Communicator(0, 1, name=_tag("op"), one_shot_max_bytes=0) as comm:
        x = torch.arange(4.0)
        assert all_reduce(x, op=op, group=comm) is None and torch.equal(x, torch.arange(4.0))
        assert all_reduce(x, op=dist.ReduceOp(dist.ReduceOp.SUM), group=comm, async_op=True).wait()
        for other in ("max", dist.ReduceOp.AVG, dist.ReduceOp(dist.ReduceOp.MAX)):
            with pytest.raises(AllReduceInputError, match="only sums"):
                all_reduce(x, op=other, group=comm)
