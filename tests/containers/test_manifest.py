"""Run manifests inside and outside the images: the commit comes from git in a checkout and from the
image's recorded build args elsewhere; the smoke's manifest check accepts only this image and commit."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import uuid
from pathlib import Path

from drafter_lab.experiments import manifest

_spec = importlib.util.spec_from_file_location("containers_build_m", Path(__file__).resolve().parents[2] / "containers" / "build.py")
build = sys.modules[_spec.name] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(build)


def _git(cwd, *args):
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd,
                          capture_output=True, text=True, check=True).stdout.strip()


def test_git_state_from_a_checkout_then_from_the_image_record(tmp_path, monkeypatch):
    recorded = uuid.uuid4().hex + uuid.uuid4().hex[:8]
    monkeypatch.setenv("DRAFTER_LAB_GIT_SHA", recorded)
    monkeypatch.setenv("DRAFTER_LAB_GIT_DIRTY", "false")

    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "f").write_text("1")
    _git(repo, "add", "f")
    _git(repo, "commit", "-q", "-m", "x")
    head = _git(repo, "rev-parse", "HEAD")
    assert manifest.git_state(repo) == {"sha": head, "dirty": False}
    (repo / "f").write_text("2")
    assert manifest.git_state(repo) == {"sha": head, "dirty": True}

    # An installed copy (no checkout around it), as in the images.
    plain = tmp_path / "site-packages"
    plain.mkdir()
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    assert manifest.git_state(plain) == {"sha": recorded, "dirty": False, "from": "image"}
    monkeypatch.setenv("DRAFTER_LAB_GIT_SHA", "unknown")
    assert manifest.git_state(plain) == {"sha": None, "dirty": None}


def test_container_state_names_our_image(monkeypatch):
    digest = "sha256:" + uuid.uuid4().hex * 2
    monkeypatch.setenv("DRAFTER_LAB_IMAGE", "localhost/drafter-lab-cpu:abc")
    monkeypatch.setenv("DRAFTER_LAB_IMAGE_DIGEST", digest)
    state = manifest.container_state()
    assert (state["image"], state["digest"]) == ("localhost/drafter-lab-cpu:abc", digest)

    monkeypatch.delenv("DRAFTER_LAB_IMAGE")
    monkeypatch.delenv("DRAFTER_LAB_IMAGE_DIGEST")
    other = manifest.container_state()
    # This host may itself be a container: then only its marker is recorded, with no image.
    assert other is None or (other["image"] is None and other["digest"] is None and other["markers"])


def test_smoke_manifest_check_accepts_only_this_image_and_commit(tmp_path):
    digest, sha = "sha256:" + uuid.uuid4().hex, uuid.uuid4().hex
    path = tmp_path / "manifest.json"

    def check(rec_digest, rec_sha, want_sha=sha):
        path.write_text(json.dumps({"container": {"digest": rec_digest}, "git": {"sha": rec_sha, "dirty": False},
                                    "packages": {"torch": "x"}}))
        return subprocess.run([sys.executable, "-c", build.MANIFEST_CHECK, str(path), digest, want_sha],
                              capture_output=True, text=True)

    assert check(digest, sha).returncode == 0
    bad = check("sha256:other", sha)
    assert bad.returncode != 0 and "expected" in bad.stderr
    assert check(digest, sha[::-1]).returncode != 0
    assert check(digest, None, want_sha="-").returncode == 0


def test_recorded_build_args_carry_the_full_commit():
    sha, dirty = build.git_tag()
    args = build.recorded_args("localhost/drafter-lab-base:bookworm", "localhost/drafter-lab-cpu:t")
    assert args["GIT_DIRTY"] == str(dirty).lower()
    if sha != "nogit":
        assert args["GIT_SHA"] == sha and len(sha) == 40
        assert build.image_tag().split("-")[0] == sha[:12]
