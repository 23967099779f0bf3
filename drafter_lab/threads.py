"""torch CPU thread counts scoped to one piece of work."""

from __future__ import annotations

import contextlib
import os

from drafter_lab.errors import LabError


def check_threads(n: int, name: str = "--threads") -> None:
    """Refuse a thread count past 4 per CPU. torch takes any count and OpenMP starts that many
    threads at the first op: past the process limit that op fails, in whatever ran it (a model load
    blamed), and the process then segfaults."""
    most = 4 * (os.cpu_count() or 1)
    if n > most:
        raise LabError(f"{name} must be at most {most} (4 per CPU), got {n}")


@contextlib.contextmanager
def torch_threads(n: int):
    """Run with `n` torch CPU threads (0 = leave as is), restoring the previous count after.

    The lab's tiny models run fastest and steadiest on one thread when cores are shared: OpenMP
    threads spin-wait whenever another process holds a core."""
    import torch

    check_threads(n, "threads")
    before = torch.get_num_threads()
    if n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
