"""The all-reduce's store rendezvous: each rank's n-th communicator meets its peers' n-th whichever
Store object, thread or process made it, and a bad `path=` is one line naming it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading

import pytest
import torch
import torch.distributed as dist

from drafter_lab.kernels import _ext

pytestmark = pytest.mark.skipif(not _ext.available(), reason=_ext.unavailable_reason() or "extension built")

# Rank 1 opens a fresh Store object over the file for each communicator (the earlier ones stay
# alive with their communicators); rank 0 keeps one. Both sum over two communicators.
RANK = """
import sys, torch, torch.distributed as dist
from drafter_lab.kernels.allreduce import Communicator
rank, path = int(sys.argv[1]), sys.argv[2]
store = dist.FileStore(path, 2)
comms = [Communicator(rank, 2, store=store if rank == 0 else dist.FileStore(path, 2), timeout_s=10,
                      one_shot_max_bytes=0) for _ in range(2)]
for i, comm in enumerate(comms):
    assert torch.equal(comm.all_reduce(torch.full((5,), rank + 1.0)), torch.full((5,), 3.0)), i
    comm.close()
"""


def test_a_rank_that_recreates_its_store_object_meets_its_peers(tmp_path):
    """The count was kept per process by id(store): rank 1's second Store object started again at
    0 while rank 0 published under 1, so rank 1 waited for a key that never came."""
    path = str(tmp_path / "store")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = [
        subprocess.Popen([sys.executable, "-c", RANK, str(r), path], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
        for r in range(2)
    ]
    logs = [p.communicate(timeout=120)[0] for p in procs]
    for r, p in enumerate(procs):
        assert p.returncode == 0, f"rank {r}:\n{logs[r]}"


def test_ranks_as_threads_of_one_process_share_a_store():
    """Both threads counted in the one per-process dict: one got key 0 and the other key 1."""
    from drafter_lab.kernels.allreduce import Communicator

    store, world = dist.HashStore(), 2
    results, errors = {}, []

    def rank(r):
        try:
            for i in range(3):
                with Communicator(r, world, store=store, timeout_s=10, one_shot_max_bytes=0) as comm:
                    results[r, i] = comm.all_reduce(torch.full((3,), r + 1.0))
        except Exception as e:
            errors.append(e)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert all(torch.equal(v, torch.full((3,), 3.0)) for v in results.values()) and len(results) == 6
    # tidy: the published segment names are gone, only one counter per rank is left
    assert store.num_keys() == world
    assert not store.check([f"drafter_lab/allreduce/default/{i}" for i in range(3)])


@pytest.mark.parametrize("where", ["missing/store", "."])
def test_a_path_that_cannot_hold_the_store_is_one_line_naming_it(tmp_path, where):
    from drafter_lab.errors import LabError
    from drafter_lab.kernels.allreduce import AllReduceError, Communicator

    path = tmp_path / where
    with pytest.raises(AllReduceError, match=f"^{re.escape(str(path))}: cannot open the rendezvous file store: "):
        Communicator(0, 1, path=path, one_shot_max_bytes=0)
    assert issubclass(AllReduceError, LabError)


@pytest.mark.parametrize("content", [b"hello, not a store\n", "cut", "odd"])
def test_a_file_that_is_no_file_store_is_one_line_naming_it(tmp_path, content):
    """torch's FileStore read 'hell' as a record length and waited for its bytes forever; a store file
    cut inside a record, or ending on a key without its value, likewise."""
    path = tmp_path / "store"
    if isinstance(content, str):  # a real store's file, then spoiled
        store = dist.FileStore(str(path), 2)
        store.set("key", "value")
        del store  # closed before the spoiling (its destructor reads the file); one of two users keeps it
        data = path.read_bytes()
        path.write_bytes(data[:-2] if content == "cut" else data + b"\x03\x00\x00\x00abc")
    else:
        path.write_bytes(content)
    code = f"from drafter_lab.kernels.allreduce import Communicator; Communicator(0, 1, path={str(path)!r}, one_shot_max_bytes=0)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert f"AllReduceError: {path}: is not a torch.distributed FileStore file" in proc.stderr.splitlines()[-1]


def test_a_file_store_file_from_a_finished_run_is_taken(tmp_path):
    """The check reads a real store's records: a file kept by an earlier store (its keys, its refcount) works."""
    from drafter_lab.kernels.allreduce import Communicator

    path = tmp_path / "store"
    first = dist.FileStore(str(path), 2)
    first.set("x" * 300, "y")  # a length past one byte
    comm = Communicator(0, 1, path=path, one_shot_max_bytes=0)
    assert torch.equal(comm.all_reduce(torch.ones(3)), torch.ones(3))
    comm.close()


@pytest.mark.parametrize("rank", [-1, 2])
def test_a_rank_outside_the_group_is_refused_at_once(rank):
    """Through a store, it waited out the whole timeout and then blamed rank 0."""
    from drafter_lab.errors import LabError
    from drafter_lab.kernels.allreduce import Communicator

    with pytest.raises(LabError, match=f"^rank {rank} is outside 0..1$"):
        Communicator(rank, 2, store=dist.HashStore(), timeout_s=30, one_shot_max_bytes=0)


def test_a_communicator_whose_rendezvous_failed_still_has_a_repr(monkeypatch):
    """A traceback (pytest's, a debugger's) shows the half-built object: its repr raised AttributeError."""
    from drafter_lab.kernels import allreduce

    seen = []
    monkeypatch.setattr(allreduce.Communicator, "_rendezvous", lambda self, *a: seen.append(repr(self)) or 1 / 0)
    with pytest.raises(ZeroDivisionError):
        allreduce.Communicator(0, 2, store=dist.HashStore(), one_shot_max_bytes=0)
    assert seen == ["Communicator(not connected)"]
