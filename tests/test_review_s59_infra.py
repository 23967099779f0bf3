"""Review s59: a lock for `--out .`, a directory write over the current directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from drafter_lab import locks
from drafter_lab.errors import LabError


def test_out_dot_is_locked_as_its_directory(tmp_path, monkeypatch):
    """`data prepare --out .` (or import-specforge's) was pathlib's "empty name" ValueError; the lock
    is the one the directory's full path takes, so the two spellings exclude each other."""
    entry = tmp_path / "features"
    entry.mkdir()
    monkeypatch.chdir(entry)
    with locks.building(entry, "feature directory"):
        with pytest.raises(LabError, match="another run is using the feature directory"):
            with locks.building(locks.Path("."), "feature directory", wait=False):
                pass
    with locks.building(locks.Path("."), "feature directory", wait=False):
        pass
    assert (tmp_path / ".features.lock").is_file()


def test_a_directory_write_over_the_current_directory_is_one_line(tmp_path, monkeypatch):
    """`export --out .` was pathlib's ValueError ('.' has no name); `--out $PWD`, or a parent of it, swapped
    the current directory away and left the shell in a deleted one."""
    from drafter_lab.atomic import atomic_dir

    here = tmp_path / "out" / "inner"
    here.mkdir(parents=True)
    monkeypatch.chdir(here)
    for path in (".", here, tmp_path / "out"):
        with pytest.raises(LabError, match="is \\(or holds\\) the current directory"):
            with atomic_dir(path):
                pass
    assert here.is_dir() and Path.cwd() == here
    with atomic_dir("sub") as tmp:  # below it, written as before
        (tmp / "f").write_text("x")
    assert (here / "sub" / "f").read_text() == "x"
