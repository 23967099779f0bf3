"""A checkout whose status git cannot tell is recorded with dirty unknown, not clean."""

from __future__ import annotations

import subprocess

from drafter_lab.experiments import manifest


def test_a_status_git_cannot_tell_leaves_dirty_unknown(tmp_path, monkeypatch):
    """`git status` failing (an index it cannot read) while HEAD reads: its empty output meant "clean".
    git is faked: the image the smoke tests run in has none."""
    for name in ("DRAFTER_LAB_GIT_SHA", "DRAFTER_LAB_GIT_DIRTY"):
        monkeypatch.delenv(name, raising=False)
    answers = {"--show-toplevel": (0, f"{tmp_path}\n"), "HEAD": (0, "abc123\n"), "status": (128, "")}

    def git(cmd, **kwargs):
        code, out = next(answer for arg, answer in answers.items() if arg in cmd)
        return subprocess.CompletedProcess(cmd, code, out, "fatal: index file corrupt" if code else "")

    monkeypatch.setattr(manifest.subprocess, "run", git)
    assert manifest.git_state(tmp_path) == {"sha": "abc123", "dirty": None}
    answers["status"] = (0, " M f\n")
    assert manifest.git_state(tmp_path) == {"sha": "abc123", "dirty": True}
    answers["status"] = (0, "")
    assert manifest.git_state(tmp_path) == {"sha": "abc123", "dirty": False}
