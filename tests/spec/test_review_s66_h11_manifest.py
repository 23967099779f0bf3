"""Pins from the s66 (h11) mutation audit of experiments/manifest.py: the manifest's git record names this
checkout's commit by default, falls back to the image's record where git has no commit to name or is not
installed (an unknown dirty flag stays unknown), the CPU is named on machines whose /proc/cpuinfo has no
"model name" line (ARM), a podman container and a GPU's CUDA build are recorded, and a manifest keeps the
git state and device it is given."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

import drafter_lab
from drafter_lab.experiments import manifest


@pytest.fixture
def no_image_record(monkeypatch):
    for name in ("DRAFTER_LAB_GIT_SHA", "DRAFTER_LAB_GIT_DIRTY"):
        monkeypatch.delenv(name, raising=False)


NEEDS_GIT = pytest.mark.skipif(shutil.which("git") is None, reason="needs git (the image has none)")


@NEEDS_GIT
def test_git_state_by_default_names_the_checkout_holding_the_package(no_image_record):
    root = Path(drafter_lab.__file__).resolve().parent.parent
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True)
    if not (root / ".git").exists() or head.returncode != 0:
        pytest.skip("an installed copy: no checkout of its own")
    assert manifest.git_state()["sha"] == head.stdout.strip()


@NEEDS_GIT
def test_a_checkout_without_a_commit_records_no_sha(tmp_path, no_image_record):
    # `git rev-parse HEAD` there prints "HEAD" and fails: that is no commit
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    assert manifest.git_state(tmp_path) == {"sha": None, "dirty": None}


def test_without_git_installed_the_image_record_is_used(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no git on it: running git raises FileNotFoundError
    monkeypatch.setenv("DRAFTER_LAB_GIT_SHA", "abc123")
    monkeypatch.setenv("DRAFTER_LAB_GIT_DIRTY", "true")
    assert manifest.git_state(tmp_path) == {"sha": "abc123", "dirty": True, "from": "image"}


class _Cpuinfo:
    def __init__(self, text):
        self.lines = text.splitlines(keepends=True)

    def __call__(self, path):
        assert path == "/proc/cpuinfo"
        return self

    def __enter__(self):
        return iter(self.lines)

    def __exit__(self, *exc):
        return False


def test_a_cpu_without_a_model_name_line_is_named_by_the_platform(monkeypatch):
    monkeypatch.setattr(manifest, "open", _Cpuinfo("processor\t: 0\nBogoMIPS\t: 50.00\n"), raising=False)
    monkeypatch.setattr(manifest.platform, "processor", lambda: "aarch64")
    assert manifest.cpu_state()["model"] == "aarch64"
    monkeypatch.setattr(manifest.platform, "processor", lambda: "")
    assert manifest.cpu_state()["model"] is None  # nothing known: null, not ""
    monkeypatch.setattr(manifest, "open", _Cpuinfo("model name\t: Example CPU @ 3GHz\n"), raising=False)
    assert manifest.cpu_state()["model"] == "Example CPU @ 3GHz"


def test_an_image_record_without_its_dirty_flag_does_not_claim_clean_code(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("DRAFTER_LAB_GIT_SHA", "abc123")
    monkeypatch.delenv("DRAFTER_LAB_GIT_DIRTY", raising=False)
    assert manifest.git_state(tmp_path) == {"sha": "abc123", "dirty": None, "from": "image"}


def test_a_podman_container_is_recorded_by_its_marker(monkeypatch):
    for name in ("DRAFTER_LAB_IMAGE", "DRAFTER_LAB_IMAGE_DIGEST"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(manifest.Path, "exists", lambda self: str(self) == "/run/.containerenv")
    assert manifest.container_state() == {"image": None, "digest": None, "markers": ["/run/.containerenv"]}


def test_a_cuda_device_records_the_cuda_build(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda dev: "GPU X")
    monkeypatch.setattr(torch.version, "cuda", "12.4")  # a CPU build's None would hide a dropped field
    assert manifest.device_state("cuda") == {"type": "cuda", "name": "GPU X", "cuda": "12.4"}


def test_build_manifest_records_what_it_is_given_and_write_manifest_names_the_file(tmp_path):
    began = {"sha": "began", "dirty": False}
    m = manifest.build_manifest(command=["study", "x.json"], config={"seed": 3}, seeds={"seed": 3},
                                data={"d": 1}, device={"type": "cuda", "name": "GPU X", "cuda": "12.4"}, git=began)
    assert (m["command"], m["git"], m["device"], m["config"], m["seeds"], m["data"]) == (
        ["study", "x.json"], began, {"type": "cuda", "name": "GPU X", "cuda": "12.4"}, {"seed": 3}, {"seed": 3},
        {"d": 1})
    assert {"container", "python", "platform", "cpu", "packages"} <= set(m)
    manifest.write_manifest(tmp_path, m)
    assert json.loads((tmp_path / "manifest.json").read_text()) == m
