"""Atomic writes survive a power loss, not only a kill: the directory holding a rename is fsynced after
it, and a directory's files before it. Where the directories cannot be swapped, the old one set aside
is only ever deleted under another name, so a delete killed midway is never restored as the content."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from drafter_lab import atomic


def _record(monkeypatch) -> list[tuple[str, str]]:
    """('fsync', path) and ('move', destination) in the order they happen."""
    events: list[tuple[str, str]] = []
    real_fsync, real_replace, real_exchange = os.fsync, os.replace, atomic.exchange

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(a, b):
        real_replace(a, b)
        events.append(("move", str(b)))

    def exchange(a, b):
        done = real_exchange(a, b)
        if done:
            events.append(("move", str(b)))
        return done

    monkeypatch.setattr(atomic.os, "fsync", fsync)
    monkeypatch.setattr(atomic.os, "replace", replace)
    monkeypatch.setattr(atomic, "exchange", exchange)
    return events


def _synced_after_last_move(events, path: Path) -> bool:
    last = max(i for i, e in enumerate(events) if e == ("move", str(path)))
    return ("fsync", str(path.parent)) in events[last + 1:]


def test_a_written_file_s_directory_is_fsynced_after_the_rename(tmp_path, monkeypatch):
    events = _record(monkeypatch)
    atomic.write_json(tmp_path / "run.json", {"a": 1})
    assert _synced_after_last_move(events, tmp_path / "run.json")


@pytest.mark.parametrize("swap", [True, False], ids=["exchange", "fallback"])
def test_a_written_directory_is_fsynced_whole_and_its_parent_after_the_swap(tmp_path, monkeypatch, swap):
    path = tmp_path / "best"
    for text in ("old", "new"):  # a new path, then one replaced
        events = _record(monkeypatch)
        if not swap:
            monkeypatch.setattr(atomic, "exchange", lambda a, b: False)
        with atomic.atomic_dir(path) as d:
            (d / "sub").mkdir()
            (d / "sub" / "f").write_text(text)  # as save_pretrained and copytree write: no fsync
            written = {str(d), str(d / "sub"), str(d / "sub" / "f")}
        first_move = min(i for i, e in enumerate(events) if e[0] == "move")
        assert written <= {p for kind, p in events[:first_move] if kind == "fsync"}
        assert _synced_after_last_move(events, path) and (path / "sub" / "f").read_text() == text
        monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best"]


def _dir_with(path: Path, text: str) -> Path:
    with atomic.atomic_dir(path) as d:
        for name in ("a", "b"):
            (d / name).write_text(text)
    return path


def _killed_while_deleting_the_old_version(monkeypatch) -> None:
    """rmtree of the old version deletes one of its files, then the process is killed."""
    real = shutil.rmtree

    def rmtree(p, *args, **kwargs):
        a = Path(p) / "a"
        if a.is_file() and a.read_text() == "old":
            a.unlink()
            raise KeyboardInterrupt
        real(p, *args, **kwargs)

    monkeypatch.setattr(atomic.shutil, "rmtree", rmtree)


def _next_process(monkeypatch) -> None:
    monkeypatch.undo()
    monkeypatch.setattr(atomic, "exchange", lambda a, b: False)
    monkeypatch.setattr(atomic, "_WRITING", set())  # the killed process's temps are no one's now


def _half_old_is_never_restored(path: Path, monkeypatch) -> None:
    """The new version landed; the user deletes it, and the next write fails: nothing may appear."""
    _next_process(monkeypatch)
    assert (path / "a").read_text() == "new"
    shutil.rmtree(path)
    with pytest.raises(RuntimeError), atomic.atomic_dir(path):
        raise RuntimeError("this write fails")
    assert not path.exists()  # not the half-deleted old version, files missing, as if it were whole
    _dir_with(path, "new")
    assert sorted(p.name for p in path.parent.iterdir()) == ["best"]


def test_without_the_swap_a_kill_while_deleting_the_old_version_leaves_nothing_to_restore(tmp_path, monkeypatch):
    path = _dir_with(tmp_path / "best", "old")
    monkeypatch.setattr(atomic, "exchange", lambda a, b: False)
    _killed_while_deleting_the_old_version(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        _dir_with(path, "new")
    _half_old_is_never_restored(path, monkeypatch)


def test_an_old_version_left_beside_the_new_one_is_deleted_under_another_name(tmp_path, monkeypatch):
    """Killed after both moves, before the old version left its name: the next write deletes it, and a
    kill during that delete leaves nothing to restore either."""
    path = _dir_with(tmp_path / "best", "old")
    old = tmp_path / ".best.old"
    shutil.copytree(path, old)
    for name in ("a", "b"):
        (path / name).write_text("new")
    _next_process(monkeypatch)
    _killed_while_deleting_the_old_version(monkeypatch)
    with pytest.raises(KeyboardInterrupt), atomic.atomic_dir(path):
        pass
    _half_old_is_never_restored(path, monkeypatch)
