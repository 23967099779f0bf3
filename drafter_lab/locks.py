"""One builder at a time for a shared cache entry.

Two runs of the study that share a cache (two drift levels started side by side, or the same command
twice) would otherwise capture into one feature directory, or train one source drafter, at once: their
journals and train states interleave. `building` holds an exclusive flock on a hidden file beside the
entry while it is built; the second run waits, then finds the entry done and reuses it. The kernel
drops the lock when its holder dies, so a killed run leaves nothing stale behind.
"""

from __future__ import annotations

import contextlib
import fcntl
from pathlib import Path

from drafter_lab.atomic import make_parent
from drafter_lab.errors import LabError
from drafter_lab.progress import log


@contextlib.contextmanager
def building(path: Path, what: str, wait: bool = True):
    """Hold the lock of cache entry `path` (what: how the wait is logged) for the `with` block;
    `wait=False`: a LabError if another run holds it."""
    path = Path(path)
    make_parent(path)
    entry = path.resolve()  # `--out .` names no entry to put the lock beside
    with open(entry.with_name(f".{entry.name}.lock"), "a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if not wait:
                raise LabError(f"another run is using the {what}", path.parent) from None
            log(f"waiting for another run that is building the {what} ({path})")
            fcntl.flock(fh, fcntl.LOCK_EX)
        yield
