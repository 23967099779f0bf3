"""`train` and `watch` input the run would meet as a traceback, refused in one line first."""

from __future__ import annotations

import json

import pytest

from drafter_lab import cli


def _train(target, data, out, *extra) -> int:
    return cli.main(["train", "--target", str(target), "--data", str(data), "--out", str(out), "--max-steps", "1",
                     "--draft-vocab-size", "64", *extra])


def test_negative_threads(peaked_llama, features, tmp_path, capsys):
    assert _train(peaked_llama, features, tmp_path / "run", "--threads", "-1") == 2
    assert capsys.readouterr().err.strip() == "error: --threads must be >= 0 and finite, got -1"
    assert not (tmp_path / "run").exists()


def test_out_below_a_file(peaked_llama, features, tmp_path, capsys):
    (tmp_path / "file").write_text("")
    out = tmp_path / "file" / "run"
    assert _train(peaked_llama, features, out) == 2
    assert capsys.readouterr().err.strip() == f"error: {out}: --out lies below a file, not a directory"


@pytest.mark.parametrize("follow", ["-1", "nan", "inf"])
def test_watch_follow_that_is_no_interval(tmp_path, capsys, follow):
    for name in ("run", "base"):  # no run.json: still training, so --follow would sleep
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.jsonl").write_text(json.dumps({"split": "val", "step": 10, "cond_acc_0": 0.5}) + "\n")
    assert cli.main(["watch", str(tmp_path / "run"), "--baseline", str(tmp_path / "base"), "--follow", follow]) == 2
    assert capsys.readouterr().err.strip() == f"error: --follow must be a finite number of seconds >= 0, got {float(follow)}"


def test_draft_config_that_is_a_directory(peaked_llama, features, tmp_path, capsys):
    assert _train(peaked_llama, features, tmp_path / "run", "--draft-config", str(tmp_path)) == 2
    assert capsys.readouterr().err.strip() == f"error: {tmp_path}: is a directory, not a JSON file"
