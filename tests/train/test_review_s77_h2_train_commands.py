"""Mutation review s77 (h2) of drafter_lab/train/commands.py: `train` and `watch` on the command line, with
train() replaced (nothing is read): several watch flags named in one refusal, the note a norm_before_residual
run leaves, which of a --config file and a flag a refusal names, and what a follow and a verdict print."""

from __future__ import annotations

import pytest

from drafter_lab.cli import main

TRAIN = ["train", "--target", "no-target", "--data", "d", "--out", "no-out"]


def test_two_watch_settings_without_stop_if_behind_are_named_together(trained, cli_error):
    assert cli_error([*TRAIN, "--watch-window", "4", "--watch-margin", "0.1"]) == (
        "error: --watch-margin and --watch-window apply with --stop-if-behind only")
    assert trained == []


@pytest.mark.parametrize("norm, rank, noted", [("true", "0", True), ("false", "0", False), ("true", "1", False)])
def test_only_rank_0_of_a_norm_before_residual_run_notes_that_sglang_would_not_serve_it(
        trained, monkeypatch, capsys, norm, rank, noted):
    monkeypatch.setenv("RANK", rank)
    assert main([*TRAIN, "--drafter-norm-before-residual", norm]) == 0
    assert trained[0]["cfg"].drafter_norm_before_residual is (norm == "true")
    assert ("is a norm_before_residual drafter" in capsys.readouterr().err) is noted


def _runs(tmp_path, run: dict[int, float], base: dict[int, float]) -> list[str]:
    """`watch` of a run and a baseline whose metrics.jsonl hold val cond_acc_0 at {step: value}."""
    import json

    for name, points in (("run", run), ("base", base)):
        (tmp_path / name).mkdir(exist_ok=True)
        rows = [{"event": "val", "split": "val", "step": s, "cond_acc_0": v} for s, v in points.items()]
        (tmp_path / name / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return ["watch", str(tmp_path / "run"), "--baseline", str(tmp_path / "base")]


def test_a_follow_says_its_first_matched_validation(tmp_path, capsys, monkeypatch):
    """One matched step at the first check is news too: the follow says it, then the run's own watch ends it."""
    import json
    import time

    argv = _runs(tmp_path, {100: 0.5}, {100: 0.5, 200: 0.5, 300: 0.5})
    monkeypatch.setattr(time, "sleep", lambda s: (tmp_path / "run" / "watch.json").write_text(json.dumps({"step": 100})))
    assert main([*argv, "--follow", "5"]) == 0
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step ")]
    assert said == ["step 100: keep training (too early: 1 of 3 validations matched with the baseline)"]


def test_runs_that_compare_get_no_note(tmp_path, capsys):
    argv = _runs(tmp_path, {100: 0.5}, {100: 0.5})
    for name in ("run", "base"):  # the same settings and validation set
        (tmp_path / name / "run.json").write_text('{"total_steps": 1000, "config": {"batch_size": 4}}')
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "keep training" in out and "note" not in out


def test_a_files_bad_value_checked_before_a_flags_names_the_file(trained, tmp_path, cli_error):
    """The file's lr draws the first complaint; put back to its default, the flag's batch size draws another:
    the file alone is refused, so the complaint is the file's."""
    (tmp_path / "t.toml").write_text("lr = -1\n")
    assert cli_error([*TRAIN, "--config", "t.toml", "--batch-size", "0"]) == (
        "error: t.toml: lr must be >= 0 and finite, got -1.0")
    assert trained == []


def test_a_files_value_refused_only_beside_a_flags_names_the_file(trained, tmp_path, cli_error):
    """The file's batch_size 0 with its own batch_tokens passes; the flag's batch_tokens 0 makes it a refusal,
    and the flag alone (the file's fields at their defaults) passes: the file's value is the one refused."""
    (tmp_path / "t.toml").write_text("batch_size = 0\nbatch_tokens = 256\n")
    assert cli_error([*TRAIN, "--config", "t.toml", "--batch-tokens", "0"]) == (
        "error: t.toml: batch_size must be >= 1 (or batch_tokens set), got 0")
    assert trained == []
