"""Mutation audit s77 (h3): the all-reduce benchmark's `python -m` entry and `_run`'s progress, in a
subprocess and a spawned rank (seconds each), apart from the in-process tests beside them."""

from __future__ import annotations

import contextlib
import subprocess
import sys

from drafter_lab import progress
from drafter_lab.kernels import bench_allreduce as bar


def test_python_dash_m_refuses_bad_input_in_one_line():
    """The docstring's `python -m drafter_lab.kernels.bench_allreduce` entry ends a LabError as the CLI does."""
    p = subprocess.run([sys.executable, "-m", "drafter_lab.kernels.bench_allreduce", "--ranks", "0"],
                       capture_output=True, text=True, timeout=120)
    assert (p.returncode, p.stderr, p.stdout) == (2, "error: --ranks must be in 1..16, got 0\n", "")


def _reports(rank, world, store_path, args, queue):
    """Spawned rank (module level, so the child imports it): two sizes done, then its result."""
    queue.put(("progress", 1024))
    queue.put(("progress", 2048))
    queue.put(("done", {"cpu": {1024: 1.0}}, {"cpu": {1024: "1-shot"}}))


def test_each_progress_message_advances_the_bar_and_the_result_is_rank_0s(monkeypatch):
    shown = []

    @contextlib.contextmanager
    def bar_of(what, total):
        shown.append((what, total))
        yield lambda: shown.append("advance")

    monkeypatch.setattr(progress, "progress", bar_of)
    assert bar._run(_reports, 1, None, 2, "sizes") == ({"cpu": {1024: 1.0}}, {"cpu": {1024: "1-shot"}})
    assert shown == [("sizes", 2), "advance", "advance"]
