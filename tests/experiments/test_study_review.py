"""The study's run directories, manifests and reproduction under concurrency and tolerance: two studies
started in the same second, a resume started beside its run, two reproductions at once, counts under
--rel-tol, and the commit an installed copy records."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
from datetime import datetime

import pytest

from drafter_lab.errors import LabError
from drafter_lab.experiments import manifest, study
from drafter_lab.experiments import reproduce as reproduce_mod
from drafter_lab.experiments.config import get_config
from drafter_lab.experiments.reproduce import compare, flat_metrics


class _Stop(Exception):
    """Raised by a stand-in run_level: the study's directory was chosen, nothing trained."""


class _Frozen(datetime):
    @classmethod
    def now(cls, tz=None):
        return datetime(2026, 12, 5, 10, 0, 0)


def test_two_studies_started_in_the_same_second_get_their_own_run_directories(tmp_path, monkeypatch):
    """The run directory was `<name>-<seconds>`: two `experiment --config smoke` started together (two
    seeds side by side) trained their arms into one directory."""
    level_dirs = []

    def level(cfg, drift, level_dir, cache):
        level_dirs.append(level_dir)
        raise _Stop

    monkeypatch.setattr(study, "datetime", _Frozen)
    monkeypatch.setattr(study, "run_level", level)
    cfg = get_config("smoke")
    for seed in (0, 1):
        with pytest.raises(_Stop):
            study.run_study(dataclasses.replace(cfg, seed=seed), tmp_path / "runs", tmp_path / "cache")
    assert [d.name for d in level_dirs] == ["smoke-20261205-100000", "smoke-20261205-100000-2"]


def test_a_second_study_in_a_run_directory_in_use_is_refused(tmp_path, monkeypatch):
    """`experiment --run-dir X` started while the study in X still runs would train the same arms at once."""
    run_dir, seen = tmp_path / "runs" / "smoke-1", []

    def level(cfg, drift, level_dir, cache):
        seen.append(level_dir)
        if len(seen) == 1:  # the first study is running: a resume of its directory starts beside it
            with pytest.raises(LabError, match="another run is using the run directory"):
                study.run_study(cfg, tmp_path / "runs", cache, run_dir=run_dir)
        raise _Stop

    monkeypatch.setattr(study, "run_level", level)
    with pytest.raises(_Stop):
        study.run_study(get_config("smoke"), tmp_path / "runs", tmp_path / "cache", run_dir=run_dir)
    assert seen == [run_dir]
    with pytest.raises(_Stop):  # the lock went with the first study
        study.run_study(get_config("smoke"), tmp_path / "runs", tmp_path / "cache", run_dir=run_dir)


def test_a_resume_with_another_config_beside_its_running_study_is_refused_as_running(tmp_path, monkeypatch):
    """The resume check read the manifest before taking the lock: a resume with another config started
    beside the running study was told its config differs, not that the directory is in use."""
    run_dir = tmp_path / "runs" / "smoke-1"
    cfg = get_config("smoke")

    def level(cfg_, drift, level_dir, cache):
        with pytest.raises(LabError, match="another run is using the run directory"):
            study.run_study(dataclasses.replace(cfg, seed=cfg.seed + 1), tmp_path / "runs", cache, run_dir=run_dir)
        raise _Stop

    monkeypatch.setattr(study, "run_level", level)
    with pytest.raises(_Stop):
        study.run_study(cfg, tmp_path / "runs", tmp_path / "cache", run_dir=run_dir)
    with pytest.raises(LabError, match="holds a study made with another config"):  # and once it is done
        study.run_study(dataclasses.replace(cfg, seed=cfg.seed + 1), tmp_path / "runs", tmp_path / "cache",
                        run_dir=run_dir)


@pytest.mark.parametrize("below", [False, True])
def test_a_run_directory_that_is_a_file_is_refused_in_one_line(tmp_path, monkeypatch, below):
    """run_study from Python (the CLI refuses it earlier) met mkdir's FileExistsError for a file."""
    monkeypatch.setattr(study, "run_level", lambda *a: pytest.fail("a stage ran"))
    (tmp_path / "f").write_text("x")
    run_dir = tmp_path / "f" / "run" if below else tmp_path / "f"
    with pytest.raises(LabError, match=rf"^{run_dir}: is a file or lies below one, not a directory$"):
        study.run_study(get_config("smoke"), tmp_path / "runs", tmp_path / "cache", run_dir=run_dir)
    assert (tmp_path / "f").read_text() == "x"


def test_two_reproductions_at_once_rerun_into_their_own_directories(tmp_path, monkeypatch):
    """The reproduction's directory was picked as the first name not on disk, and created only when its
    study began: a second `reproduce` of the same run started meanwhile took the same one."""
    orig = tmp_path / "runs" / "orig"
    orig.mkdir(parents=True)
    (orig / "manifest.json").write_text(json.dumps({"config": {"name": "smoke", "target_preset": "micro"}}))
    results = {"levels": [{"drift_knob": 1.0, "arms": [{"key": "a", "final": {"cond_acc_0": 0.5}}],
                           "probe": {"zero_shot": {"cond_acc_0": 0.1}, "verdict": "train from scratch"}}]}
    (orig / "results.json").write_text(json.dumps(results))
    dirs = []

    def rerun(cfg, runs_root, cache, run_dir, command):
        dirs.append(run_dir)
        if len(dirs) == 1:  # the first reproduction is still training when the second starts
            reproduce_mod.reproduce(orig, runs_root, cache)
        run_dir.mkdir(parents=True, exist_ok=True)
        for name in ("manifest.json", "results.json"):
            (run_dir / name).write_text((orig / name).read_text())
        return run_dir

    monkeypatch.setattr(reproduce_mod, "run_study", rerun)
    new_dir, diffs = reproduce_mod.reproduce(orig, tmp_path / "runs", tmp_path / "cache")
    assert diffs == [] and new_dir == dirs[0]
    assert [d.name for d in dirs] == ["orig-repro", "orig-repro2"]


def _results(verify_steps: int, accept: float, step: int = 200) -> dict:
    served = {"served_accept_len": accept, "verify_steps": verify_steps, "spec_tokens": 1536,
              "baseline_tokens": 1536, "lossless_check": "identical", "accept_histogram": {"1": 400, "2": 600}}
    return {"levels": [{"drift_knob": 1.0, "arms": [{"key": "b", "final": {"step": step, "cond_acc_0": 0.5},
                                                      "served": served}],
                        "probe": {"zero_shot": {"cond_acc_0": 0.1}, "verdict": "train from scratch"}}]}


def test_rel_tol_forgives_rounding_not_counts():
    """`--rel-tol` (which the machine note suggests across CPUs) also let counts move: one verify step in
    1000, or an arm that ended a step later, read as identical at 1e-2."""
    a = flat_metrics(_results(1000, 1.5))
    assert compare(a, flat_metrics(_results(1000, 1.5 * (1 + 1e-4))), rel_tol=1e-2) == []
    moved = compare(a, flat_metrics(_results(1001, 1.5, step=201)), rel_tol=1e-2)
    assert [(k, x, y) for k, x, y in moved] == [("drift 1 / arm b / served / verify_steps", 1000, 1001),
                                                 ("drift 1 / arm b / step", 200, 201)]
    assert compare({"n": 2}, {"n": 2.0}) == [] and compare({"x": 0}, {"x": 1e-13}, rel_tol=1e-6) == []


def _git(cwd, *args):
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd,
                          capture_output=True, text=True, check=True).stdout.strip()


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git, to make the enclosing repository (the image has none)")
def test_an_installed_copy_inside_another_repository_does_not_record_its_commit(tmp_path, monkeypatch):
    """`pip install .` into a project's .venv: the copy's site-packages lies inside the project's checkout,
    and the manifest named that project's commit (and dirtiness) as the lab's."""
    monkeypatch.delenv("DRAFTER_LAB_GIT_SHA", raising=False)
    project = tmp_path / "project"
    site = project / ".venv" / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    _git(project, "init", "-q")
    (project / "f").write_text("1")
    _git(project, "add", "f")
    _git(project, "commit", "-q", "-m", "x")
    assert manifest.git_state(site) == {"sha": None, "dirty": None}
    assert manifest.git_state(project)["sha"] == _git(project, "rev-parse", "HEAD")


def test_served_evaluation_runs_on_the_studys_device(tmp_path, monkeypatch):
    """It loaded the target on the CPU whatever `device` said (a GPU study decoded on the CPU)."""
    import dataclasses

    import torch

    from drafter_lab.experiments import study
    from drafter_lab.experiments.config import get_config
    from drafter_lab.spec import eval as spec_eval

    seen = {}
    target = type("T", (), {"device": torch.device("meta")})()
    monkeypatch.setattr("drafter_lab.targets.hf.load_target", lambda path, device="cpu": seen.update(target=device) or target)
    monkeypatch.setattr("drafter_lab.drafter.checkpoint.load_drafter",
                        lambda path, target=None, device="cpu": seen.update(drafter=device) or "drafter")
    monkeypatch.setattr("drafter_lab.data.conversations.read_conversations", lambda path, **kw: ([], {}))
    monkeypatch.setattr(spec_eval, "evaluate", lambda *a, **k: {"served": True})
    cfg = dataclasses.replace(get_config("smoke"), device="cuda:3", served_eval=True)
    assert study._served(cfg, tmp_path / "drafter", tmp_path / "target", tmp_path / "prompts.jsonl") == {"served": True}
    assert seen == {"target": "cuda:3", "drafter": torch.device("meta")}
