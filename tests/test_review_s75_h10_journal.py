"""Journal pins from the s75 (h10) mutation audit: a journal closes its file itself (no ResourceWarning, no
descriptor left on a discarded file), syncs it to disk as it closes, and a run that loses the race to lock
a journal it just made is refused in one line and still closes cleanly."""

from __future__ import annotations

import os
import warnings

import pytest

from drafter_lab import journal as journal_module
from drafter_lab.errors import LabError
from drafter_lab.journal import Journal


def _open_fds(path) -> int:
    """This process's open descriptors on `path`, unlinked or not."""
    names, count = {str(path), f"{path} (deleted)"}, 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}") in names
        except FileNotFoundError:  # the descriptor listdir itself used
            pass
    return count


def _unclosed(caught, path) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, ResourceWarning) and str(path) in str(w.message)]


def test_close_closes_the_file_itself(tmp_path):
    """Left to the garbage collector, the file closes with a ResourceWarning, and only when collected."""
    path = tmp_path / "j"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        with Journal(path, {}) as journal:
            journal.append({"n": 1})
        with Journal(path, {}) as journal:  # opened (and locked) at construction, as a resume is
            assert journal.records == [{"n": 1}]
    assert _unclosed(caught, path) == []


def test_discard_lets_go_of_the_removed_file(tmp_path):
    """A discarded journal still referenced (a sweep's, until its function returns) holds no descriptor."""
    path = tmp_path / "j"
    journal = Journal(path, {})
    journal.append({"n": 1})
    assert _open_fds(path) == 1
    journal.discard()
    assert not path.exists() and _open_fds(path) == 0


def test_close_syncs_the_journal_to_disk(tmp_path, monkeypatch):
    """Flushed records survive a killed process; a power cut needs them on disk, which close sees to."""
    path = tmp_path / "j"
    synced, fsync = [], os.fsync

    def spy(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        fsync(fd)

    monkeypatch.setattr(os, "fsync", spy)
    journal = Journal(path, {})
    journal.append({"n": 1})
    journal.close()
    assert str(path) in synced


def test_losing_the_race_to_lock_a_new_journal_is_refused_and_closes_cleanly(tmp_path, monkeypatch):
    """Another run can open and lock the file between this run making it and locking it: this run's append
    is refused in one line, its file closed, and its `with` exit raises nothing over that line."""
    path = tmp_path / "j"
    others = []

    def racing_open(file, mode="r", *args, **kwargs):
        f = open(file, mode, *args, **kwargs)
        if mode == "xb":  # just made: the other run (a real journal) opens and locks it first
            others.append(Journal(path, {"seed": 1}))
        return f

    monkeypatch.setattr(journal_module, "open", racing_open, raising=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        with pytest.raises(LabError, match=f"^{path}: another run is writing this journal"):
            with Journal(path, {"seed": 1}) as journal:
                journal.append({"n": 1})
    assert _unclosed(caught, path) == []
    [other] = others
    with other:
        other.append({"n": 2})
    assert Journal(path, {"seed": 1}).records == [{"n": 2}]
