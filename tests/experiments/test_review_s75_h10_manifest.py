"""Manifest pins from the s75 (h10) mutation audit: the default git record is the package's own checkout,
wherever the run was started from."""

from __future__ import annotations

import io
import platform
import shutil
import subprocess
from pathlib import Path

import pytest

from drafter_lab.experiments import manifest


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git (the image has none)")
def test_git_state_by_default_asks_the_packages_checkout_not_the_working_directory(tmp_path, monkeypatch):
    """A study is often started from elsewhere (a scratch directory, another project): its manifest still
    names the commit of the code that ran, not that directory's (or none)."""
    for name in ("DRAFTER_LAB_GIT_SHA", "DRAFTER_LAB_GIT_DIRTY"):
        monkeypatch.delenv(name, raising=False)
    root = Path(manifest.__file__).resolve().parents[2]
    top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=root, capture_output=True, text=True)
    if top.returncode != 0 or Path(top.stdout.strip()).resolve() != root:
        pytest.skip("an installed copy: no checkout of its own")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True)
    monkeypatch.chdir(tmp_path)
    assert manifest.git_state()["sha"] == head.stdout.strip()


def test_no_container_is_recorded_as_none_and_an_image_alone_as_one(monkeypatch):
    """Neither our images' variables nor a marker file: no container (null), not an empty record."""
    for name in ("DRAFTER_LAB_IMAGE", "DRAFTER_LAB_IMAGE_DIGEST"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(manifest.Path, "exists", lambda self: False)  # this host's own marker files, if any
    assert manifest.container_state() is None
    monkeypatch.setenv("DRAFTER_LAB_IMAGE", "drafter-lab:cpu")
    assert manifest.container_state() == {"image": "drafter-lab:cpu", "digest": None, "markers": []}


def test_a_machine_without_proc_cpuinfo_names_the_cpu_by_the_platform(monkeypatch):
    """macOS has no /proc/cpuinfo: the platform's name, not an UnboundLocalError."""
    def no_cpuinfo(path):
        raise FileNotFoundError(2, "No such file or directory", path)

    monkeypatch.setattr(manifest, "open", no_cpuinfo, raising=False)
    monkeypatch.setattr(manifest.platform, "processor", lambda: "arm")
    assert manifest.cpu_state()["model"] == "arm"


def test_a_cpu_model_name_with_a_colon_in_it_is_kept_whole(monkeypatch):
    monkeypatch.setattr(manifest, "open", lambda path: io.StringIO("model name\t: Vendor CPU: rev 2\n"), raising=False)
    assert manifest.cpu_state()["model"] == "Vendor CPU: rev 2"


def test_build_manifest_takes_the_git_state_now_by_default_and_names_the_python_version(monkeypatch):
    monkeypatch.setattr(manifest, "git_state", lambda: {"sha": "now", "dirty": False})
    m = manifest.build_manifest(command=["study"], config={}, seeds={}, data={}, device={"type": "cpu"})
    assert m["git"] == {"sha": "now", "dirty": False}
    assert m["python"] == platform.python_version()  # "3.11.7", not the build's date or compiler
