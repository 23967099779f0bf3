"""Review of the all-reduce benchmark's ranks: one that dies must end the run with one line naming every
rank's exit code (the others were each given a minute to notice, then killed unreaped), and leave no
segment in /dev/shm. Values given twice are timed once."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest

from drafter_lab.errors import LabError
from drafter_lab.kernels import bench_allreduce as bar

pytestmark = pytest.mark.skipif(not bar._ext.available(), reason=bar._ext.unavailable_reason() or "built")


def _dies_before_its_communicator(rank, world, store_path, args, queue):
    """Spawned rank (module level, so the child imports it): the last rank exits once the gloo group
    is up, while rank 0 has made its segment and waits for it to attach."""
    if rank == world - 1:
        bar.Communicator = lambda *a, **k: os._exit(3)
    bar._latency_worker(rank, world, store_path, args, queue)


def _dies_at_once(rank, world, store_path, args, queue):
    """The last rank exits before the gloo rendezvous, where the others wait for 30 minutes."""
    if rank == world - 1:
        os._exit(3)
    bar._latency_worker(rank, world, store_path, args, queue)


def _segments() -> set[str]:
    return {p.name for p in Path("/dev/shm").glob("drafter_lab_ar.*")}


@pytest.mark.parametrize("worker", [_dies_at_once, _dies_before_its_communicator], ids=lambda w: w.__name__)
def test_a_rank_that_dies_ends_the_run_and_leaks_no_segment(worker):
    args = argparse.Namespace(backends=["cpu"], sizes=[1024], dtype="bfloat16", iters=5, timeout=60.0)
    before = _segments()
    with pytest.raises(LabError, match="benchmark ranks failed") as e:
        bar._run(worker, 3, args, 1, "test")
    assert "None" not in str(e.value), "a killed rank's exit code was read before it was reaped"
    assert "3" in str(e.value)
    assert not _segments() - before


@pytest.mark.parametrize("flags", [["--backends", "cpu", "cpu"], ["--ranks", "2", "2"],
                                   ["--tp-sim", "--tokens", "1", "2", "2"]])
def test_a_value_given_twice_is_timed_once(monkeypatch, flags):
    """--backends, --ranks and --tokens given a value twice timed it twice, printed two rows for it and
    wrote it twice into the JSON (--sizes keeps each once)."""
    seen = []
    monkeypatch.setattr(bar, "tp_sim", seen.append)
    monkeypatch.setattr(bar, "latency_table", seen.append)
    monkeypatch.setattr(bar, "refuse_unwritable", lambda *a: None)
    bar.main(["--ranks", "2", "--backends", "cpu", *flags])  # the last of a flag given twice wins
    (args,) = seen
    assert (args.backends, args.ranks, args.tokens) == (["cpu"], [2], [1, 2] if "--tp-sim" in flags else [1, 2, 4, 8])
