"""Review s65 of progress.py and experiments/manifest.py: a rank-0 progress (maybe_progress) counts
against its total and writes its closing line, a float field is shortened in the log, work of no known
total logs its count alone, and a manifest's git record counts only a checkout whose top is the code's own
and ignores untracked files."""

from __future__ import annotations

import subprocess

import pytest

from drafter_lab.experiments import manifest
from drafter_lab.progress import maybe_progress, progress


def test_maybe_progress_shown_counts_against_its_total_and_closes_with_a_line(capsys):
    with maybe_progress("tokenize", 2, True) as advance:
        advance()
        advance()
    assert "tokenize 2/2" in capsys.readouterr().err
    with maybe_progress("tokenize", 2, False) as advance:
        advance(loss=1.0)
    assert capsys.readouterr().err == ""


def test_a_float_field_is_logged_to_four_significant_digits(capsys):
    with progress("train", 1, every_s=3600) as advance:
        advance(loss=1.23456789, step=7)
    assert "train 1/1" in (err := capsys.readouterr().err) and "loss=1.235 step=7" in err


def test_work_of_no_known_total_logs_its_count_alone(capsys):
    with progress("scan", None, every_s=0) as advance:
        advance(2)
    assert capsys.readouterr().err.startswith("scan 2 [")


@pytest.fixture
def checkout(tmp_path, monkeypatch):
    for name in ("DRAFTER_LAB_GIT_SHA", "DRAFTER_LAB_GIT_DIRTY"):
        monkeypatch.delenv(name, raising=False)
    root = tmp_path / "repo"
    (root / "sub").mkdir(parents=True)
    (root / "f").write_text("x")

    def git(*args):
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=root,
                              check=True, capture_output=True, text=True).stdout.strip()

    git("init", "-q")
    git("add", "f")
    git("commit", "-q", "-m", "one")
    return root, git("rev-parse", "HEAD")


def test_an_untracked_file_leaves_a_checkout_clean(checkout):
    root, sha = checkout
    (root / "new").write_text("scratch")
    assert manifest.git_state(root) == {"sha": sha, "dirty": False}
    (root / "f").write_text("changed")
    assert manifest.git_state(root) == {"sha": sha, "dirty": True}


def test_code_inside_another_repository_is_not_credited_with_its_commit(checkout):
    root, _ = checkout  # an installed copy in a project's .venv: that project's commit says nothing of it
    assert manifest.git_state(root / "sub") == {"sha": None, "dirty": None}


def test_a_digest_alone_still_records_the_container(monkeypatch):
    monkeypatch.delenv("DRAFTER_LAB_IMAGE", raising=False)
    monkeypatch.setenv("DRAFTER_LAB_IMAGE_DIGEST", "sha256:ab")
    monkeypatch.setattr(manifest.Path, "exists", lambda self: False)  # this host's own marker files, if any
    assert manifest.container_state() == {"image": None, "digest": "sha256:ab", "markers": []}


def test_a_package_not_installed_is_left_out_not_recorded_as_none(monkeypatch):
    monkeypatch.setattr(manifest, "PACKAGES", ("drafter_lab", "no-such-package-s65"))
    assert list(manifest.package_versions()) == ["drafter_lab"]
