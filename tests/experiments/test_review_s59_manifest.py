"""The manifest's git state is the code the study ran: taken as it began, not as it ended (a commit or a
checkout during the hours a study runs was recorded as the code that made it)."""

from __future__ import annotations

import json

import pytest
import torch
from test_reproduce import TINY  # this directory is on sys.path (pytest prepends it)

from drafter_lab.experiments import study


@pytest.mark.slow
def test_the_manifest_records_the_code_as_the_study_began(tmp_path, monkeypatch):
    from drafter_lab.experiments import manifest

    states = iter([{"sha": "began", "dirty": False}])  # the study's first look; every later one sees a commit
    monkeypatch.setattr(study, "git_state", lambda: next(states, {"sha": "later", "dirty": True}))
    monkeypatch.setattr(manifest, "git_state", lambda root=None: {"sha": "later", "dirty": True})
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run_dir = study.run_study(TINY, tmp_path / "runs", tmp_path / "cache", run_dir=tmp_path / "runs" / "r")
    finally:
        torch.set_num_threads(before)
    assert json.loads((run_dir / "manifest.json").read_text())["git"] == {"sha": "began", "dirty": False}
