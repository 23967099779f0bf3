"""metrics.jsonl: a run's train and validation records, one JSON object per line.

Free of torch, so that reading a run (the watch, the CLI's parsers) stays light.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from drafter_lab.atomic import dumps, nan_for_null
from drafter_lab.errors import LabError

METRICS = "metrics.jsonl"
RUN_FILE = "run.json"
"""The run's record beside its metrics: config, drafter shape, target (with its fingerprint), data,
planned length."""
TRANSFER_FILE = "transfer.json"
"""A transfer run's report of what it took from its source drafter (remap, rows copied, heads)."""
BEST_DIR, BEST_FILE = "best", "best.json"
"""keep_best's drafter directory, and the file in it naming its validation (metric, value, step)."""


class MetricsLog:
    """metrics.jsonl: one JSON object per line, each appended with one O_APPEND write (more after a short one)."""

    def __init__(self, path, enabled: bool = True):
        self.path = Path(path)
        self.enabled = enabled

    def write(self, record: dict) -> None:
        if not self.enabled:
            return
        line = (dumps(record) + "\n").encode()  # strict JSON: a NaN metric is null, read back as NaN
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            view = memoryview(line)
            while view:  # a disk filling mid-line writes part of it: the rest raises, or completes the line
                view = view[os.write(fd, view):]
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
        if not self.enabled:
            return
        exists = self.path.exists()
        now = self.path.stat().st_size if exists else 0
        # Cut back, it would be padded with NUL bytes, which no reader parses; gone, the run would log on
        # in a new file without the rows its state has counted.
        if now < size:
            what = (f"holds {now} bytes, fewer than the {size} its checkpoint recorded: it was cut or replaced"
                    if exists else f"is missing, though its checkpoint recorded {size} bytes")
            raise LabError(f"{what}; restore it or start a new run", self.path)
        if now > size:
            os.truncate(self.path, size)


def read_metrics(path) -> list[dict]:
    """The records of a metrics.jsonl (or of the one in a run directory). A last line without its
    newline is a record still being written by a run in flight, and is left out. A null value is a NaN
    metric (`MetricsLog.write`), and reads as NaN again."""
    path = Path(path)
    if path.is_dir():
        path = path / METRICS
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:  # a disk error's garbage, or not a metrics file at all
        raise LabError(f"not UTF-8 text (byte {e.start})", path) from None
    except IsADirectoryError:  # a run directory's metrics.jsonl that is a directory
        raise LabError("is a directory, not a metrics file", path) from None
    lines = text.split("\n")[:-1]  # the piece after the last newline is unfinished
    rows = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except (ValueError, RecursionError) as e:  # also an integer of over 4300 digits, or nesting too deep
            raise LabError(f"line {i} is not valid JSON ({e})", path) from None
        if not isinstance(row, dict):
            raise LabError(f"line {i} is not a metrics record (a JSON object)", path)
        step = row.get("step")
        # a hand-edited row: every reader orders and matches by it (and the watch reads it as a float)
        if type(step) is not int or not 0 <= step < 2**63:
            what = ('no "step"' if "step" not in row else f'"step" {json.dumps(step)} is not an integer'
                    if type(step) is not int else f'"step" {step} is not a step (0 to 2**63 - 1)')
            raise LabError(f"line {i} is not a metrics record: {what}", path)
        rows.append(nan_for_null(row))
    return rows
