"""Append-only progress files: what a long run has finished, so that a killed run resumes there.

The first line records the settings the work is made with; each further line is one finished unit
of work (a JSON object), flushed as soon as it ends. A kill can leave half a line behind: reading
keeps whole lines only, and the first append cuts the file back to them. A journal made with other
settings is refused with one line naming the file. The file appears with the first record, so a
run that finished nothing leaves nothing behind.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from drafter_lab.errors import LabError


class Journal:
    """`records`: what earlier runs finished, in order. `write=False` reads only (tensor-parallel
    ranks other than 0 must replay the same records without touching the file)."""

    def __init__(self, path: str | os.PathLike, settings: dict, write: bool = True):
        self.path = Path(path)
        self._header = {"settings": settings}
        self._write = write
        self._file = None
        self.records, self._whole_bytes = self._read()

    @staticmethod
    def settings_of(path: str | os.PathLike) -> dict | None:
        """The settings a journal at `path` was begun with; None if there is none (or it is unreadable,
        which the constructor reports)."""
        try:
            with open(path, "rb") as f:
                settings = json.loads(f.readline()).get("settings")
        except (OSError, json.JSONDecodeError, AttributeError):
            return None
        return settings if isinstance(settings, dict) else None

    def _read(self) -> tuple[list[dict], int | None]:
        blob = self.path.read_bytes() if self.path.exists() else b""
        lines = blob.split(b"\n")[:-1]  # a last line without its newline is half-written
        if not lines:
            return [], None
        try:
            same = json.loads(lines[0]) == self._header
        except json.JSONDecodeError:
            same = False
        if not same:
            raise LabError("partial run made with other settings (or from other input); "
                           "delete it or use another --out", self.path)
        records = []
        for n, line in enumerate(lines[1:], start=2):
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                raise LabError(f"line {n} is not JSON; delete the file to start over", self.path) from None
        return records, sum(len(line) + 1 for line in lines)

    def append(self, record: dict) -> None:
        """Record one finished unit of work; it survives a kill once this returns."""
        if not self._write:
            return
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if self._whole_bytes is None:
                self._file = open(self.path, "w", encoding="utf-8")
                self._file.write(json.dumps(self._header) + "\n")
            else:
                os.truncate(self.path, self._whole_bytes)
                self._file = open(self.path, "a", encoding="utf-8")
        self._file.write(json.dumps(record, ensure_ascii=False) + "\n")
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            os.fsync(self._file.fileno())
            self._file.close()
            self._file = None

    def discard(self) -> None:
        """The work's result has landed: the journal is no longer needed."""
        self.close()
        if self._write:
            self.path.unlink(missing_ok=True)

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
