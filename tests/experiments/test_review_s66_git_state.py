"""A checkout whose status git cannot tell is recorded with dirty unknown, not clean."""

from __future__ import annotations

import subprocess

from drafter_lab.experiments import manifest


def test_an_unreadable_index_leaves_dirty_unknown(tmp_path, monkeypatch):
    for name in ("DRAFTER_LAB_GIT_SHA", "DRAFTER_LAB_GIT_DIRTY"):
        monkeypatch.delenv(name, raising=False)

    def git(*args):
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path,
                              check=True, capture_output=True, text=True).stdout.strip()

    git("init", "-q")
    (tmp_path / "f").write_text("x")
    git("add", "f")
    git("commit", "-qm", "one")
    sha = git("rev-parse", "HEAD")
    assert manifest.git_state(tmp_path) == {"sha": sha, "dirty": False}
    (tmp_path / ".git" / "index").write_bytes(b"DIRC broken")  # `git status` fails on it; HEAD still reads
    assert manifest.git_state(tmp_path) == {"sha": sha, "dirty": None}
