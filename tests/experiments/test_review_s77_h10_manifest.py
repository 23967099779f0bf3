"""Review s77 (h10) of manifest.git_state: a work tree whose state git cannot read is recorded as
unknown, not as clean."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from drafter_lab.experiments import manifest


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git (the image has none)")
def test_an_index_git_cannot_read_leaves_the_commit_and_an_unknown_dirty_flag(tmp_path, monkeypatch):
    for name in ("DRAFTER_LAB_GIT_SHA", "DRAFTER_LAB_GIT_DIRTY"):
        monkeypatch.delenv(name, raising=False)

    def git(*args):
        return subprocess.run(["git", "-c", "user.email=lab@example.com", "-c", "user.name=lab", *args],
                              cwd=tmp_path, capture_output=True, text=True, check=True).stdout.strip()

    git("init", "-q")
    git("commit", "-q", "--allow-empty", "-m", "start")
    (tmp_path / ".git" / "index").write_bytes(b"garbage")  # rev-parse HEAD never reads it; status fails
    assert manifest.git_state(tmp_path) == {"sha": git("rev-parse", "HEAD"), "dirty": None}
