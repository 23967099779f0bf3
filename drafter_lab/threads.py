"""torch CPU thread counts scoped to one piece of work."""

from __future__ import annotations

import contextlib


@contextlib.contextmanager
def torch_threads(n: int):
    """Run with `n` torch CPU threads (0 = leave as is), restoring the previous count after.

    The lab's tiny models run fastest and steadiest on one thread when cores are shared: OpenMP
    threads spin-wait whenever another process holds a core."""
    import torch

    before = torch.get_num_threads()
    if n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
