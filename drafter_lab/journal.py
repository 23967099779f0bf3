"""Append-only progress files: what a long run has finished, so that a killed run resumes there.

The first line records the settings the work is made with; each further line is one finished unit of
work (a JSON object), flushed as soon as it ends. A kill can leave half a line behind: reading keeps
whole lines only, and the first append cuts the file back to them. A journal made with other
settings is refused with one line naming the file. The file appears with the first record, so a run
that finished nothing leaves nothing behind; one that could not make it is refused as it starts. A
writing journal holds an flock on its file, so a second run writing the same one is refused instead
of interleaving its records with the first's (the kernel drops the lock when its holder dies). Lines
are strict JSON, as every file the lab writes (atomic.dumps): settings hold finite numbers only (one
with a NaN, never equal to itself, would refuse every resume), and a record's NaN or infinity reads
back as null.
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

from drafter_lab.atomic import dumps
from drafter_lab.errors import LabError

_HEAD = b'{"settings": '
"""How every journal's first line begins: a file of no whole line that begins otherwise (an input given
as `<out>.partial`) is no half-written journal, to be cut back to nothing."""


def _strict(value) -> bool:
    """Whether `value` writes as strict JSON (no NaN or infinity in it)."""
    try:
        json.dumps(value, allow_nan=False)
    except ValueError:
        return False
    return True


class Journal:
    """`records`: what earlier runs finished, in order. `write=False` reads only (tensor-parallel
    ranks other than 0 must replay the same records without touching the file). `flag` is the option
    that names the output, for the errors' advice."""

    def __init__(self, path: str | os.PathLike, settings: dict, write: bool = True, flag: str = "--out"):
        self.path, self._flag = Path(path), flag
        try:
            self._head = json.dumps({"settings": settings}, allow_nan=False)
        except ValueError:
            bad = [k for k, v in settings.items() if not _strict(v)]
            raise LabError(f"settings {', '.join(map(str, bad))} hold a number JSON has not (NaN or infinity)",
                           self.path) from None
        self._header = json.loads(self._head)  # as it reads back: tuples as lists, keys as text
        if self.path.is_dir():  # else open's or read's traceback
            raise LabError(f"is a directory, not a journal; use another {flag}", self.path)
        self._write = write
        self._file = None  # binary, and locked, while this run writes
        self._cut = False  # the first append cuts the file back to its whole lines
        if write:
            try:
                self._file = open(self.path, "r+b")
            except FileNotFoundError:  # none yet: made and locked at the first append
                self._check_makeable()
            except OSError as e:  # no permission, a link loop: else open's traceback
                raise LabError(f"cannot read and write this journal: {e.strerror}; use another {flag}",
                               self.path) from None
            if self._file is not None:
                self._lock()
        try:
            self.records, self._whole_bytes = self._read()
        except LabError:
            self.close()
            raise

    def _check_makeable(self) -> None:
        """Refuse now, before any work is done, a journal the first append could not make."""
        if self.path.is_symlink():  # open("xb") refuses every link, and would blame another run
            raise LabError(f"is a link to {os.readlink(self.path)}, which does not exist; remove it or use "
                           f"another {self._flag}", self.path)
        parent = self.path.parent
        while not parent.exists():  # the first append makes the missing ones
            if parent.is_symlink():
                raise self._unmakeable(f"{parent} is a broken link")
            parent = parent.parent
        if not parent.is_dir():
            raise self._unmakeable(f"{parent} is not a directory")
        if not os.access(parent, os.W_OK | os.X_OK, effective_ids=True):  # the uid that will write
            raise self._unmakeable(f"{parent} is not writable")

    def _unmakeable(self, why: str) -> LabError:
        return LabError(f"cannot make this journal: {why}; use another {self._flag}", self.path)

    def _lock(self) -> None:
        try:
            fcntl.flock(self._file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            self._file.close()
            self._file = None
            if isinstance(e, BlockingIOError):
                raise LabError("another run is writing this journal; wait for it to end or stop it",
                               self.path) from None
            # e.g. a network file system without locks: writing unlocked could interleave two runs
            raise LabError(f"cannot lock this journal: {e.strerror}; use another {self._flag}", self.path) from None

    @staticmethod
    def settings_of(path: str | os.PathLike) -> dict | None:
        """The settings a journal at `path` was begun with; None if there is none (or it is unreadable,
        which the constructor reports)."""
        try:
            with open(path, "rb") as f:
                settings = json.loads(f.readline()).get("settings")
        except (OSError, ValueError, AttributeError):  # ValueError: not JSON, or not UTF-8
            return None
        return settings if isinstance(settings, dict) else None

    def _read(self) -> tuple[list[dict], int | None]:
        if self._file is not None:
            blob = self._file.read()
        else:
            try:
                blob = self.path.read_bytes()
            except FileNotFoundError:
                blob = b""
            except OSError as e:  # as the constructor's open
                raise LabError(f"cannot read this journal: {e.strerror}; use another {self._flag}",
                               self.path) from None
        lines = blob.split(b"\n")[:-1]  # a last line without its newline is half-written
        if not lines:
            if not (blob.startswith(_HEAD) or _HEAD.startswith(blob)):
                raise LabError(f"is not a journal this lab wrote; move it away or use another {self._flag}", self.path)
            return [], None
        try:
            same = json.loads(lines[0]) == self._header
        except ValueError:  # not JSON, or not UTF-8
            same = False
        if not same:
            raise LabError("partial run made with other settings (or from other input); "
                           f"delete it or use another {self._flag}", self.path)
        records = []
        for n, line in enumerate(lines[1:], start=2):
            try:
                records.append(json.loads(line))
            except ValueError:
                raise LabError(f"line {n} is not JSON; delete the file to start over", self.path) from None
        return records, sum(len(line) + 1 for line in lines)

    def append(self, record: dict) -> None:
        """Record one finished unit of work; it survives a kill once this returns."""
        if not self._write:
            return
        if not self._cut:
            if self._file is None:
                try:
                    self.path.parent.mkdir(parents=True, exist_ok=True)
                except OSError as e:  # the directories changed since the constructor's check
                    raise self._unmakeable(e.strerror) from None
                try:
                    self._file = open(self.path, "xb")
                except FileExistsError:  # another run made it after this one found none
                    raise LabError("another run began this journal meanwhile; run again to resume it",
                                   self.path) from None
                except OSError as e:
                    raise self._unmakeable(e.strerror) from None
                self._lock()
            self._file.truncate(self._whole_bytes or 0)
            self._file.seek(0, os.SEEK_END)
            if self._whole_bytes is None:
                self._file.write(self._head.encode() + b"\n")
            self._cut = True
        self._file.write(dumps(record, ensure_ascii=False).encode() + b"\n")
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            os.fsync(self._file.fileno())
            self._file.close()  # drops the lock
            self._file = None

    def discard(self) -> None:
        """The work's result has landed: the journal is no longer needed."""
        if self._write:  # before the lock drops: a run starting now finds no journal, not a finished one
            self.path.unlink(missing_ok=True)
        self.close()

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
