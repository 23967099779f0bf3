"""What a run leaves beside its drafter: train_state/ (for an exact --resume) and metrics.jsonl.

train_state/state.pt is one file written atomically: model, optimizer, scheduler, step, epoch,
data cursor, RNG states and the length metrics.jsonl had at that moment. Because it is a single
file, a SIGKILL leaves either the previous state or the new one, never a mix; a resume truncates
metrics.jsonl back to the recorded length, so the log matches the state exactly.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import numpy as np
import torch

from drafter_lab import atomic
from drafter_lab.errors import LabError

STATE_DIR = "train_state"
STATE_FILE = "state.pt"
METRICS = "metrics.jsonl"


def state_path(out_dir) -> Path:
    return Path(out_dir) / STATE_DIR / STATE_FILE


class MetricsLog:
    """metrics.jsonl: one JSON object per line, each appended with a single O_APPEND write."""

    def __init__(self, path, enabled: bool = True):
        self.path = Path(path)
        self.enabled = enabled

    def write(self, record: dict) -> None:
        if not self.enabled:
            return
        line = (json.dumps(record, allow_nan=True) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)

    def sync_size(self) -> int:
        """fsync and return the current length (recorded in the train state)."""
        if not self.enabled or not self.path.exists():
            return 0
        with open(self.path, "rb+") as f:
            os.fsync(f.fileno())
            return os.fstat(f.fileno()).st_size

    def truncate(self, size: int) -> None:
        """Drop lines written after the checkpoint that recorded `size` (a file already that size is
        left untouched)."""
        if self.enabled and self.path.exists() and self.path.stat().st_size != size:
            os.truncate(self.path, size)


def read_metrics(path) -> list[dict]:
    """The records of a metrics.jsonl (or of the one in a run directory). A last line without its
    newline is a record still being written by a run in flight, and is left out."""
    path = Path(path)
    if path.is_dir():
        path = path / METRICS
    lines = path.read_text().split("\n")[:-1]  # the piece after the last newline is unfinished
    return [json.loads(line) for line in lines if line.strip()]


def rng_state() -> dict:
    out = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        out["cuda"] = torch.cuda.get_rng_state_all()
    return out


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save(out_dir, state: dict) -> None:
    atomic.torch_save(state, state_path(out_dir))


def load(out_dir) -> dict:
    path = state_path(out_dir)
    if not path.exists():
        raise LabError("nothing to resume: train_state/state.pt is missing", out_dir)
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # torch raises many types for a damaged pickle
        raise LabError(f"train state is unreadable ({str(e).splitlines()[0][:200]})", path) from None
