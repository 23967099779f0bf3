"""train_state/: what a run keeps beside its drafter for an exact --resume.

train_state/state.pt is one file written atomically: model, optimizer, scheduler, step, epoch,
data cursor, RNG states and the length metrics.jsonl (metrics_log.py) had at that moment. Because
it is a single file, a SIGKILL leaves either the previous state or the new one, never a mix; a
resume truncates metrics.jsonl back to the recorded length, so the log matches the state exactly.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import torch

from drafter_lab import atomic
from drafter_lab.errors import LabError
from drafter_lab.targets.hf import first_line

STATE_DIR = "train_state"
STATE_FILE = "state.pt"
REQUIRED = ("config", "model", "optimizer", "scheduler", "step", "epoch", "cursor", "log_counts", "metrics_bytes", "rng")


def state_path(out_dir) -> Path:
    return Path(out_dir) / STATE_DIR / STATE_FILE


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
        # one state per GPU the saving run saw: a resume on a machine with fewer sets the ones it has
        torch.cuda.set_rng_state_all(state["cuda"][:torch.cuda.device_count()])


def save(out_dir, state: dict) -> None:
    atomic.torch_save(state, state_path(out_dir))


def load(out_dir) -> dict:
    path = state_path(out_dir)
    if not path.exists():
        raise LabError("nothing to resume: train_state/state.pt is missing", out_dir)
    try:
        saved = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # torch raises many types for a damaged pickle
        raise LabError(f"train state is unreadable ({first_line(e)})", path) from None
    # Every state this lab saved holds these (the rest came later, and a resume reads them with defaults);
    # another pickle there was a KeyError traceback in the middle of the resume.
    missing = [k for k in REQUIRED if not isinstance(saved, dict) or k not in saved]
    if missing:
        raise LabError(f"not a train state this lab saved (no {', '.join(missing)})", path)
    return saved
