"""The watch's rules still unpinned after two audits (helper h6): the gap is fitted over the window
alone, a replay with a window of one judges the run's first validation, the note on rendering is
symmetric in which run is older, an online run and a captured one are not compared on their chat
settings, a run without watch.json was not stopped, a hand-edited or unreadable run.json is one line,
and "stop" exits with status 3 as the README tells a script."""

from __future__ import annotations

import dataclasses
import json

import pytest

from drafter_lab.cli import main
from drafter_lab.errors import LabError
from drafter_lab.train.watch import WatchConfig, comparison_note, judge, read_run, replay, stopped_at


def curve(points: dict[int, float]) -> list[dict]:
    return [{"event": "val", "split": "val", "step": s, "cond_acc_0": v} for s, v in points.items()]


FLAT = curve({100: 0.5, 200: 0.5, 300: 0.5, 400: 0.5, 500: 0.5, 600: 0.5})


def test_the_gap_is_fitted_over_the_window_not_the_whole_run():
    """A run that climbed early and then went flat 5 points behind: the line over all its validations
    rises, the one over the last three does not: it is not closing."""
    run = curve({100: 0.1, 200: 0.2, 300: 0.3, 400: 0.45, 500: 0.45, 600: 0.45})
    v = judge(run, FLAT, WatchConfig(), None)
    assert v.stop and v.parity is None and v.reason.endswith("(-5.0 / -5.0 / -5.0 points), not closing")


def test_a_replay_with_a_window_of_one_judges_the_first_validation():
    cfg = dataclasses.replace(WatchConfig(), watch_window=1)
    v = replay(curve({100: 0.2, 200: 0.2, 300: 0.2}), FLAT, cfg, 600)
    assert v is not None and [r["step"] for r in v.rows] == [100]


def test_a_new_run_against_a_baseline_from_before_tokenizers_or_encodings_were_recorded_is_not_flagged():
    """Either run may be the older one: a baseline that records no tokenizer is not "t1 vs none"."""
    def online(**rendering):
        return {"config": {"batch_size": 8}, "features": {"sha256": "ee", "val_fraction": 0.1, "online": "/c.jsonl",
                                                          "chat_template_sha256": "aa", **rendering}}
    new, old = online(tokenizer_sha256="t1"), online()
    assert comparison_note(new, old, "step") is None and comparison_note(old, new, "step") is None
    new, old = online(encoded_sha256="e1", turns="each"), online()  # nor one that records no encoding
    assert comparison_note(new, old, "step") is None and comparison_note(old, new, "step") is None


def test_an_online_run_and_a_captured_one_are_not_compared_on_chat_settings():
    """Captured features record their rendering in their manifest, not in the run: an online run's
    chat_template_kwargs against a captured run's none is no difference the watch can tell."""
    online = {"config": {"batch_size": 8}, "features": {"sha256": "ee", "val_fraction": 0.1, "online": "/c.jsonl",
                                                        "chat_template_sha256": "aa",
                                                        "chat_template_kwargs": {"enable_thinking": False}}}
    captured = {"config": {"batch_size": 8}, "features": {"manifest_sha256": "aa", "dir": "/f"}}
    assert comparison_note(online, captured, "step") is None and comparison_note(captured, online, "step") is None


def test_a_run_without_a_verdict_was_not_stopped(tmp_path):
    """None, not step 0: that would end `watch --follow` on a run that has logged only its step-0 validation."""
    assert stopped_at(tmp_path) is None


@pytest.mark.parametrize("record, problem", [({"total_steps": True}, "its total_steps true is not a number"),
                                             ({"total_tokens": "9"}, 'its total_tokens "9" is not a number')])
def test_a_hand_edited_planned_length_is_one_line(tmp_path, record, problem):
    """true is an int to Python: a total of 1 step; a string: a TypeError comparing it on the token axis."""
    (tmp_path / "metrics.jsonl").write_text("")
    (tmp_path / "run.json").write_text(json.dumps(record))
    with pytest.raises(LabError, match=f"run.json: not a run record: {problem}$"):
        read_run(tmp_path)


def test_a_run_record_that_cannot_be_read_is_one_line(tmp_path, monkeypatch):
    import errno

    from drafter_lab import atomic

    (tmp_path / "metrics.jsonl").write_text("")
    (tmp_path / "run.json").write_text("{}")

    def denied(path, missing, owner=None):
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr(atomic, "read_json", denied)
    with pytest.raises(LabError, match=r"run\.json: cannot be read \(Permission denied\)$"):
        read_run(tmp_path)


def test_stop_exits_with_status_3(tmp_path, capsys):
    """The README's contract for a script that kills the run: 3 is "stop", 0 "keep training"."""
    for name, points in (("base", {100: 0.5, 200: 0.6, 300: 0.66}), ("run", {100: 0.2, 200: 0.2, 300: 0.2})):
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in curve(points)))
    assert main(["watch", str(tmp_path / "run"), "--baseline", str(tmp_path / "base")]) == 3
    assert "stop" in capsys.readouterr().out
    assert main(["watch", str(tmp_path / "base"), "--baseline", str(tmp_path / "base")]) == 0
