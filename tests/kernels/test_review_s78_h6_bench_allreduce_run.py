"""Mutation audit s78 (h6) of the all-reduce benchmark's `_run`, which spawns the ranks: after a result
it lets them finish closing; after a failure it gives the live ones a short grace, then kills and
reaps them, removes what their segments left in /dev/shm, and names every exit code."""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import pytest

from drafter_lab.errors import LabError
from drafter_lab.kernels import bench_allreduce as bar


def _reports_then_closes(rank, world, store_path, args, queue):
    """Spawned rank (module level, so the child imports it): its result, then a slow close."""
    queue.put(("progress", 1))
    queue.put(("done", "result", rank))
    time.sleep(1.0)
    Path(args.closed).write_text("closed")


def _outlives_a_dead_peer(rank, world, store_path, args, queue):
    """Rank 0 leaves a segment in /dev/shm and would end 0 only after 45 s (as a rank waiting on a dead
    peer would); the other rank dies at once."""
    if rank:
        os._exit(3)
    Path(f"/dev/shm/drafter_lab_ar.{os.getpid()}.s78h6").write_bytes(b"segment")
    time.sleep(45)


def test_a_run_returns_rank_0s_result_once_the_ranks_have_closed(tmp_path):
    closed = tmp_path / "closed"
    got = bar._run(_reports_then_closes, 1, argparse.Namespace(closed=str(closed)), 1, "test")
    assert got == ("result", 0)
    assert closed.read_text() == "closed"  # joined, not killed in its close


def test_a_failed_run_kills_the_live_ranks_after_the_grace_and_removes_their_segments(monkeypatch):
    monkeypatch.setattr(bar, "FAILED_RANKS_GRACE_S", 0.5)  # rank 0 is killed well before its 45 s end
    before = set(Path("/dev/shm").glob("drafter_lab_ar.*.s78h6"))
    with pytest.raises(LabError) as e:
        bar._run(_outlives_a_dead_peer, 2, argparse.Namespace(), 1, "test")
    assert str(e.value) == "benchmark ranks failed (exit codes [-9, 3]); see their tracebacks above"
    assert not set(Path("/dev/shm").glob("drafter_lab_ar.*.s78h6")) - before
