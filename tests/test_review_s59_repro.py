"""Reproducibility path: containers/build.py's engine probe and smoke --runs, noxfile's recorded versions,
reproduce's device note."""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

from drafter_lab.experiments.reproduce import machine_note

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


build = _load("containers_build_s59", ROOT / "containers" / "build.py")


def test_a_docker_whose_info_hangs_is_skipped_not_a_traceback(tmp_path, monkeypatch):
    for name in ("docker", "podman"):
        (tmp_path / name).write_text("#!/bin/sh\nexit 0\n")
        (tmp_path / name).chmod(0o755)
    real = subprocess.run

    def hung(cmd, **kw):  # `docker info` against a daemon that never answers
        if cmd[1:] == ["info"]:
            raise subprocess.TimeoutExpired(cmd, kw.get("timeout"))
        return real(cmd, **kw)
    monkeypatch.setattr(build.subprocess, "run", hung)
    assert build.detect_engine(path=str(tmp_path)).name == "podman"


class _Built:
    name = "stub"

    def exists(self, ref):
        return True

    def digest(self, ref):
        pytest.fail("the smoke went past its --runs check")


@pytest.mark.parametrize("below", [False, True])
def test_smoke_runs_naming_a_file_is_one_line(tmp_path, below):
    f = tmp_path / "notes.txt"
    f.write_text("")
    runs = f / "runs" if below else f
    with pytest.raises(build.BuildError, match="--runs"):
        build.smoke(_Built(), argparse.Namespace(runs=str(runs)), build.Timer())


@pytest.fixture
def noxfile(monkeypatch):
    def session(*args, **kwargs):
        return args[0] if args and callable(args[0]) else (lambda f: f)
    monkeypatch.setitem(sys.modules, "nox", types.SimpleNamespace(session=session, options=types.SimpleNamespace()))
    return _load("noxfile_s59", ROOT / "noxfile.py")


@pytest.mark.parametrize("packages", [["transformers"], "transformers==5.24.0", 3])
def test_recorded_packages_that_are_not_a_mapping_pin_nothing(noxfile, tmp_path, packages):
    (tmp_path / "manifest.json").write_text(json.dumps({"packages": packages}))
    assert noxfile.recorded_versions([str(tmp_path)]) == []


def test_machine_note_names_the_cuda_builds_when_the_gpu_model_is_the_same():
    old = {"device": {"type": "cuda", "name": "NVIDIA H100", "cuda": "12.8"}}
    new = {"device": {"type": "cuda", "name": "NVIDIA H100", "cuda": "13.0"}}
    note = machine_note(old, new)
    assert "12.8" in note and "13.0" in note


@pytest.mark.parametrize(("a", "b", "said"), [
    ({"sha": "a" * 40, "dirty": False}, {"sha": "a" * 40, "dirty": False}, None),
    ({"sha": "a" * 40, "dirty": False}, {"sha": "b" * 40, "dirty": False}, "at aaaaaaaaaaaa, this run at bbbbbbbbbbbb:"),
    ({"sha": "a" * 40, "dirty": True}, {"sha": "a" * 40, "dirty": False},
     "at aaaaaaaaaaaa with uncommitted changes, this run at aaaaaaaaaaaa:"),
    ({}, {"sha": "b" * 40, "dirty": False}, None),  # a run that recorded none (outside a checkout and images)
])
def test_reproduce_names_the_code_each_run_ran(a, b, said):
    """reproduce said nothing when the code that made the original was another commit, or a dirty tree."""
    from drafter_lab.experiments.reproduce import code_note

    note = code_note({"git": a}, {"git": b})
    assert note is None if said is None else said in note
