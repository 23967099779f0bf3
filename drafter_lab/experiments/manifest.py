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


def _image_git_state() -> dict:
    """What the image build recorded (Containerfile ENV): an installed copy has no checkout to ask."""
    sha = os.environ.get("DRAFTER_LAB_GIT_SHA")
    dirty = {"true": True, "false": False}.get(os.environ.get("DRAFTER_LAB_GIT_DIRTY", ""))
    if not sha or sha == "unknown":
        return {"sha": None, "dirty": None}
    return {"sha": sha, "dirty": dirty, "from": "image"}


def git_state(root: Path | None = None) -> dict:
    """Commit sha and whether the work tree differs from it; inside our images, the build's record.
    Only a checkout whose top is `root` counts: an installed (not editable) copy's site-packages may lie
    inside another repository (a project's .venv), whose commit says nothing of the code that ran."""
    root = root or Path(__file__).resolve().parents[2]

    def git(*args):
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10)

    try:
        top = git("rev-parse", "--show-toplevel")
        if top.returncode != 0 or Path(top.stdout.strip()).resolve() != Path(root).resolve():
            return _image_git_state()
        sha = git("rev-parse", "HEAD")
        if sha.returncode != 0:
            return _image_git_state()
        status = git("status", "--porcelain", "--untracked-files=no")
        # a status git could not tell (an index it cannot read) is unknown, not clean
        return {"sha": sha.stdout.strip(), "dirty": status.stdout.strip() != "" if status.returncode == 0 else None}
    except (OSError, subprocess.TimeoutExpired):
        return _image_git_state()


def container_state() -> dict | None:
    """Image name and digest inside one of our containers: the Containerfiles set DRAFTER_LAB_IMAGE;
    the digest exists only after the build, so containers/build.py passes it at run time. Any other
    container is recorded by the marker file that gave it away, with no image."""
    image, digest = os.environ.get("DRAFTER_LAB_IMAGE"), os.environ.get("DRAFTER_LAB_IMAGE_DIGEST")
    markers = [m for m in ("/run/.containerenv", "/.dockerenv") if Path(m).exists()]
    if image is None and digest is None and not markers:
        return None
    return {"image": image, "digest": digest, "markers": markers}


def cpu_state() -> dict:
    """The CPU, and the instruction set torch's CPU kernels dispatch to: vectorised reductions round
    differently on another ISA, so a run there may differ in its digits where a rerun on the same
    machine (host or image) is bit for bit the same."""
    import torch

    model = None
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), None)
    except OSError:
        pass
    return {"model": model or platform.processor() or None, "torch_capability": torch.backends.cpu.get_cpu_capability()}


def package_versions() -> dict:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return out


def device_state(device: str) -> dict:
    """The device a run's `device` setting resolved to, with the GPU's name: CUDA kernels round
    otherwise than the CPU's (and one GPU model's than another's), and regeneration samples from the
    device's own random streams, so a run made on another device differs for that alone."""
    import torch

    from drafter_lab.targets.hf import resolve_device

    dev = resolve_device(device)
    if dev.type != "cuda":
        return {"type": dev.type}
    return {"type": "cuda", "name": torch.cuda.get_device_name(dev), "cuda": torch.version.cuda}


def build_manifest(*, command: list[str], config: dict, seeds: dict, data: dict, device: dict,
                   git: dict | None = None) -> dict:
    """`git`: the state taken when the run began (default: now)."""
    return {
        "command": command,
        "git": git_state() if git is None else git,
        "container": container_state(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu": cpu_state(),
        "device": device,
        "packages": package_versions(),
        "config": config,
        "seeds": seeds,
        "data": data,
    }


def write_manifest(run_dir, manifest: dict) -> None:
    atomic.write_json(Path(run_dir) / "manifest.json", manifest)
