"""All-reduce segments seen from another pid namespace (containers that share /dev/shm, not pids).

A segment records its creator's namespace: from another one its pids mean nothing (kill() answers
for an unrelated process or none), so cleanup_stale leaves it alone and a rank refuses to join it.
The creator runs in a real new pid namespace (unshare), at a pid that no process has out here."""
import os
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("drafter_lab._C")

INNER = r"""
import os, sys, time
want, tag = int(sys.argv[1]), sys.argv[2]
while True:  # pids in a new namespace count up from 1: fork until the next one is `want`
    pid = os.fork()
    if pid == 0:
        if os.getpid() != want:
            os._exit(0)
        import torch  # noqa: F401
        from drafter_lab.kernels.allreduce import Communicator
        print("creating", flush=True)
        try:
            Communicator(0, 2, name=tag, timeout_s=60, one_shot_max_bytes=0)  # waits for rank 1
        except Exception as e:
            print(f"rank 0: {e}", flush=True)
        os._exit(0)
    os.waitpid(pid, 0)
    if pid >= want:
        break
"""


def _free_pid() -> int | None:
    """A low pid no process has here (the namespace forks its way up to it), below the ones being
    handed out, so none takes it meanwhile. /proc/N of a thread answers, unlisted, as kill() does."""
    return next((p for p in range(100, 5000) if not any(os.path.exists(f"/proc/{q}") for q in (p, p + 1))), None)


@pytest.fixture
def foreign_rank0():
    if shutil.which("unshare") is None:
        pytest.skip("needs util-linux's unshare")
    probe = subprocess.run(["unshare", "-Urpf", "--mount-proc", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot make a pid namespace here: {probe.stderr.decode().strip()}")
    from drafter_lab._C import allreduce as native

    tag, want = f"test-pidns-{os.getpid()}-{secrets.token_hex(4)}", _free_pid()
    if want is None:
        pytest.skip("no free pid below 5000 to create the segment at")
    shm = Path("/dev/shm") / native.segment_name(tag).lstrip("/")
    inner = subprocess.Popen(["unshare", "-Urpf", "--mount-proc", sys.executable, "-c", INNER, str(want), tag],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=Path.cwd())
    try:
        deadline = time.monotonic() + 60
        while not shm.exists():
            assert inner.poll() is None and time.monotonic() < deadline, inner.communicate()[0]
            time.sleep(0.05)
        time.sleep(0.2)  # its header is stamped within milliseconds of the file appearing
        if os.path.exists(f"/proc/{want}"):
            pytest.skip(f"pid {want} was taken out here meanwhile")
        yield tag, shm, inner
    finally:
        inner.kill()
        inner.wait()
        shm.unlink(missing_ok=True)


def test_cleanup_leaves_another_namespaces_live_segment(foreign_rank0):
    """Its creator's pid, dead out here, read as a killed run's: the live segment was unlinked."""
    from drafter_lab._C import allreduce as native

    tag, shm, inner = foreign_rank0
    assert native.segment_name(tag) not in native.cleanup_stale(0.0)
    assert shm.exists() and inner.poll() is None


def test_a_rank_refuses_a_segment_of_another_namespace(foreign_rank0):
    """It waited out its timeout for the segment 'to be recreated (its creator is dead)', and rank 0
    for a rank 'not attached'; now both say why at once."""
    from drafter_lab.kernels.allreduce import AllReduceError, Communicator

    tag, _, inner = foreign_rank0
    t0 = time.monotonic()
    with pytest.raises(AllReduceError, match=r"^rank 1: shared-memory segment \S+ was created in another pid "
                                             r"namespace \(\d+, this process: \d+\): all ranks must share one"):
        Communicator(1, 2, name=tag, timeout_s=30, one_shot_max_bytes=0)
    assert time.monotonic() - t0 < 25  # refused at once, not after the timeout
    out = inner.communicate(timeout=30)[0]
    assert "rank 0: " in out and "another pid namespace" in out, out
