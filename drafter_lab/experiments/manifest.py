"""Run manifests: enough to say what produced a run directory, and to re-run it."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
import sys
from pathlib import Path

from drafter_lab import atomic

PACKAGES = ("drafter_lab", "torch", "transformers", "tokenizers", "safetensors", "numpy", "sglang")


def git_state(root: Path | None = None) -> dict:
    """Commit sha and whether the work tree differs from it; unknown outside a checkout."""
    root = root or Path(__file__).resolve().parents[2]

    def git(*args):
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10)

    try:
        sha = git("rev-parse", "HEAD")
        if sha.returncode != 0:
            return {"sha": None, "dirty": None}
        dirty = git("status", "--porcelain", "--untracked-files=no").stdout.strip() != ""
        return {"sha": sha.stdout.strip(), "dirty": dirty}
    except (OSError, subprocess.TimeoutExpired):
        return {"sha": None, "dirty": None}


def container_state() -> dict | None:
    """The image digest when running inside one of our containers (set by the Containerfiles)."""
    digest = os.environ.get("DRAFTER_LAB_IMAGE_DIGEST")
    in_container = digest is not None or Path("/run/.containerenv").exists() or Path("/.dockerenv").exists()
    if not in_container:
        return None
    return {"image": os.environ.get("DRAFTER_LAB_IMAGE"), "digest": digest}


def package_versions() -> dict:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return out


def build_manifest(*, command: list[str], config: dict, seeds: dict, data: dict) -> dict:
    return {
        "command": command,
        "git": git_state(),
        "container": container_state(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "packages": package_versions(),
        "config": config,
        "seeds": seeds,
        "data": data,
    }


def write_manifest(run_dir, manifest: dict) -> None:
    atomic.write_json(Path(run_dir) / "manifest.json", manifest)
