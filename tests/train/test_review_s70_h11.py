"""`drafter-lab watch` (review s70, h11): with --json, stdout holds the verdict alone while it follows a run,
and the printed verdict's table shows the last matched validations on the watch's axis."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from drafter_lab.cli import main
from drafter_lab.errors import LabError
from drafter_lab.train import commands
from drafter_lab.train.watch import STOP_EXIT, WatchConfig, judge


def write(run_dir, points: dict[int, float], tokens: int | None = None) -> None:
    """A run directory whose metrics.jsonl holds validations of cond_acc_0 at `points` ({step: value});
    `tokens`: training tokens read per step, logged as train_tokens."""
    run_dir.mkdir(exist_ok=True)
    rows = [{"event": "val", "split": "val", "step": s, "cond_acc_0": v,
             **({"train_tokens": s * tokens} if tokens else {})} for s, v in points.items()]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_following_with_json_keeps_stdout_to_the_verdict(tmp_path, capsys, monkeypatch):
    """`watch --follow --json` printed "waiting for ..." and "step N: keep training" on stdout before the
    verdict: a script reading the JSON it asked for got lines it cannot parse."""
    write(tmp_path / "base", {100: 0.5, 200: 0.6, 300: 0.66})
    (tmp_path / "run").mkdir()
    # The run appears at the follow's first wait, too early to judge; a third validation stops it at the next.
    later = [{100: 0.3, 200: 0.3}, {100: 0.3, 200: 0.3, 300: 0.3}]
    monkeypatch.setattr(commands, "time", SimpleNamespace(sleep=lambda s: write(tmp_path / "run", later.pop(0))))
    code = main(["watch", str(tmp_path / "run"), "--baseline", str(tmp_path / "base"), "--follow", "5", "--json"])
    out, err = capsys.readouterr()
    assert code == STOP_EXIT and not later
    verdict = json.loads(out)  # the whole of stdout
    assert verdict["stop"] and [r["step"] for r in verdict["rows"]] == [100, 200, 300]
    assert err.count("waiting for") == 1 and "step 200: keep training (too early: 2 of 3" in err


def test_a_run_its_own_watch_stopped_is_said_on_stderr_with_json(tmp_path, capsys):
    write(tmp_path / "base", {100: 0.5, 200: 0.5, 300: 0.5})
    write(tmp_path / "run", {100: 0.5, 200: 0.5})
    (tmp_path / "run" / "watch.json").write_text(json.dumps({"step": 200}))
    watch = ["watch", str(tmp_path / "run"), "--baseline", str(tmp_path / "base"), "--follow", "0.05"]
    assert main([*watch, "--json"]) == 0
    out, err = capsys.readouterr()
    assert not json.loads(out)["stop"] and "the run's own watch stopped it at step 200" in err
    assert main(watch) == 0  # without --json, the lines go with the verdict a person reads
    out, err = capsys.readouterr()
    assert "the run's own watch stopped it at step 200" in out and not err


def test_a_note_naming_a_path_with_brackets_prints_it_whole(tmp_path, capsys):
    """The note went to rich as markup: a --val-data path's "[old]" was dropped as a style tag, and one
    holding "[/]" raised MarkupError (a traceback in place of the verdict)."""
    for name, val_data in (("base", "held[old]/val.jsonl"), ("run", "held[/]/val.jsonl")):
        write(tmp_path / name, {100: 0.5, 200: 0.5, 300: 0.5})
        features = {"val": {"sha256": name}, "val_data": val_data}
        (tmp_path / name / "run.json").write_text(json.dumps({"total_steps": 1000, "features": features}))
    assert main(["watch", str(tmp_path / "run"), "--baseline", str(tmp_path / "base")]) == 0
    lines = capsys.readouterr().out.splitlines()  # each one line whatever the terminal's width: paths unbroken
    assert ("note: the runs validate on different sets (held[/]/val.jsonl vs held[old]/val.jsonl): their metrics "
            "do not compare") in lines
    assert lines[-1] == ("keep training: cond_acc_0 +0.0 points against the baseline at step 300: not behind at each "
                         "of the last 3 validations")


def cells(out: str) -> list[list[str]]:
    """The printed table's header and rows, cell by cell."""
    return [[c.strip() for c in line.strip("┃│").split(sep)] for line in out.splitlines()
            for sep in "┃│" if line.startswith(sep)]


def test_the_table_holds_the_last_ten_matched_validations_at_their_training_tokens(tmp_path, capsys):
    write(tmp_path / "base", {s: 0.5 for s in range(100, 1300, 100)}, tokens=10)
    write(tmp_path / "run", {s: 0.5 + s / 1e5 for s in range(100, 1300, 100)}, tokens=10)
    assert main(["watch", str(tmp_path / "run"), "--baseline", str(tmp_path / "base"),
                 "--watch-axis", "train_tokens"]) == 0
    header, *rows = cells(capsys.readouterr().out)
    assert header == ["step", "training tokens", "run", "baseline", "gap"]
    assert rows[0] == ["300", "3,000", "0.5030", "0.5000", "+0.0030"]
    assert [r[0] for r in rows] == [str(s) for s in range(300, 1300, 100)]


def test_on_the_step_axis_the_table_has_no_tokens_and_too_early_none(tmp_path, capsys):
    write(tmp_path / "base", {100: 0.5, 200: 0.6, 300: 0.66})
    write(tmp_path / "run", {100: 0.4})
    watch = ["watch", str(tmp_path / "run"), "--baseline", str(tmp_path / "base")]
    assert main(watch) == 0
    assert cells(capsys.readouterr().out) == [["step", "run", "baseline", "gap"], ["100", "0.4000", "0.5000", "-0.1000"]]
    write(tmp_path / "run", {0: 0.0})  # step 0 is never matched: nothing to tabulate
    assert main(watch) == 0
    out = capsys.readouterr().out
    assert not cells(out) and "run against baseline" not in out and "too early: 0 of 3" in out


def test_a_run_resumed_past_where_its_own_watch_stopped_it_is_still_followed(tmp_path, capsys, monkeypatch):
    """watch.json stays behind when the run is resumed without the watch: only a run that logged nothing after
    that step is over, so the follow goes on and judges what the resumed run logs."""
    write(tmp_path / "base", {s: 0.5 for s in range(100, 700, 100)})
    write(tmp_path / "run", {100: 0.5, 200: 0.5, 300: 0.5})  # stopped at 200, resumed to 300
    (tmp_path / "run" / "watch.json").write_text(json.dumps({"step": 200}))
    # nothing new at the first poll: the latest verdict is said once, not at every poll
    later = [{100: 0.5, 200: 0.5, 300: 0.5}, {100: 0.5, 200: 0.5, 300: 0.5, 400: 0.3, 500: 0.3, 600: 0.3}]
    monkeypatch.setattr(commands, "time", SimpleNamespace(sleep=lambda s: write(tmp_path / "run", later.pop(0))))
    assert main(["watch", str(tmp_path / "run"), "--baseline", str(tmp_path / "base"), "--follow", "5"]) == STOP_EXIT
    out = capsys.readouterr().out
    assert "own watch stopped it" not in out and out.count("keep training") == 1 and "step 300: keep training" in out


def test_an_unknown_metric_lists_the_validation_metrics_the_run_has():
    """Its scores, not its counts, schedule or timing: the names a --watch-metric may take."""
    row = {"event": "val", "split": "val", "step": 100, "cond_acc_0": 0.5, "loss_0": 1.2, "positions": 40,
           "lr": 0.001, "elapsed_s": 3.0}
    with pytest.raises(LabError, match=r"^run: no validation metric 'cond_acc_9' \(it has: cond_acc_0, loss_0\)$"):
        judge([row], [row], WatchConfig(watch_metric="cond_acc_9"), None, "run", "base")


def test_every_validation_after_step_0_is_matched_the_first_step_too():
    rows = [{"event": "val", "split": "val", "step": s, "cond_acc_0": 0.5} for s in range(4)]
    assert [r["step"] for r in judge(rows, rows, WatchConfig(), None).rows] == [1, 2, 3]


def test_a_gap_closing_over_a_window_of_two_steps_one_apart_keeps_it_training():
    """The fitted line's slope over two validations at steps 1 and 2 (a spread of 0.5): closing, not flat."""
    base = [{"event": "val", "split": "val", "step": s, "cond_acc_0": 0.5} for s in range(3)]
    run = [{"event": "val", "split": "val", "step": s, "cond_acc_0": v} for s, v in ((1, 0.3), (2, 0.45))]
    v = judge(run, base, WatchConfig(watch_window=2), None)
    assert not v.stop and v.parity == pytest.approx(7 / 3)
    assert "behind at steps 1 / 2 (-20.0 / -5.0 points) but closing, parity near step 2" in v.reason


def test_parity_at_the_runs_last_step_is_closing_in_time():
    base = [{"event": "val", "split": "val", "step": s, "cond_acc_0": 0.75} for s in range(3)]
    run = [{"event": "val", "split": "val", "step": s, "cond_acc_0": v} for s, v in ((1, 0.25), (2, 0.5))]
    v = judge(run, base, WatchConfig(watch_window=2), 3)
    assert v.parity == 3.0 and not v.stop  # gaps -0.5 / -0.25: exact in binary, the line meets 0 at step 3
    assert judge(run, base, WatchConfig(watch_window=2), 2).stop
