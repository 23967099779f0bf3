"""Review of the watch: validations that scored nothing, the encoding note for online runs sharing a
held-out conversations file, a baseline rank 0 cannot read under 2 ranks, and the replay's last step."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from drafter_lab.experiments import report
from drafter_lab.experiments.study import Arm
from drafter_lab.train.watch import WatchConfig, comparison_note, judge, replay

from .two_ranks import run_two_ranks

W = WatchConfig()


def curve(points: dict[int, float], positions: int = 500, metric: str = "cond_acc_0") -> list[dict]:
    return [{"event": "val", "split": "val", "step": s, "positions": positions, metric: v} for s, v in points.items()]


BASE = curve({100: 0.50, 200: 0.60, 300: 0.66, 400: 0.70})


def test_a_validation_that_scored_nothing_is_neither_behind_nor_ahead():
    """No position scored: accuracies read 0.0 (not NaN), which measured nothing; the watch read them
    as 66 points behind (or, in the baseline, as the run far ahead)."""
    empty = curve({100: 0.0, 200: 0.0, 300: 0.0}, positions=0)
    v = judge(empty, BASE, W, 1000)
    assert not v.stop and v.rows == [] and "too early: 0 of 3" in v.reason
    # Scored nothing at one validation: that one is left out, the others still judge.
    run = curve({100: 0.3, 200: 0.3, 300: 0.3, 400: 0.3})
    run[1] = {**run[1], "cond_acc_0": 0.0, "positions": 0}
    assert [r["step"] for r in judge(run, BASE, W, 1000).rows] == [100, 300, 400]
    # A baseline that scored nothing at a step is interpolated around, not read as 0.
    base = [*BASE[:2], {**BASE[2], "cond_acc_0": 0.0, "positions": 0}, BASE[3]]
    v = judge(curve({200: 0.6, 300: 0.65, 400: 0.7}), base, W, 1000)
    assert [r["baseline"] for r in v.rows] == pytest.approx([0.60, 0.65, 0.70])
    assert not v.stop and "not behind" in v.reason
    # Logs from before positions were kept still compare.
    old = [{k: v for k, v in r.items() if k != "positions"} for r in curve({200: 0.3, 300: 0.3, 400: 0.3})]
    assert judge(old, BASE, W, 1000).stop


def test_online_runs_on_other_files_validating_on_one_held_out_file_are_not_flagged():
    """The encoding hash covers the training sequences too: runs on other training files read as
    validating on other sequences ("another lab or transformers version") though their held-out
    set was one and encoded alike."""
    def online(data: str, encoded: str, **settings) -> dict:
        return {"config": {"batch_size": 8}, "features": {
            "sha256": data, "val_fraction": 0.1, "max_length": 96, "online": f"/{data}.jsonl",
            "chat_template_sha256": "aa", "encoded_sha256": encoded, "val": {"sha256": "vv"},
            "val_data": "/v.jsonl", **settings}}

    assert comparison_note(online("a", "e1"), online("b", "e2"), "step") is None
    assert comparison_note(online("a", "e1"), online("b", "e2", turns="each"), "step") == (
        "the runs' conversations encode to other sequences (turns none vs each): they validate on other "
        "sequences, and their metrics do not compare")
    assert comparison_note(online("a", "e1"), online("b", "e2", max_length=128), "step") == (
        "the runs' conversations encode to other sequences (max_length 96 vs 128): they validate on other "
        "sequences, and their metrics do not compare")
    # One training file: the hash still tells another encoding.
    assert comparison_note(online("a", "e1"), online("a", "e2"), "step") == (
        "the runs' conversations encode to other sequences (the same settings: another lab or transformers "
        "version): they validate on other sequences, and their metrics do not compare")


def test_online_runs_rendered_otherwise_on_one_held_out_feature_set_are_not_flagged():
    """Held-out features hold their text already: the training template cannot change what a run
    validates on, yet runs trained with their thinking on and off read as validating on other text."""
    def online(**settings) -> dict:
        return {"config": {"batch_size": 8}, "features": {
            "sha256": "a", "val_fraction": 0.1, "max_length": 96, "online": "/a.jsonl", "chat_template_sha256": "aa",
            "encoded_sha256": "e1", "val": {"manifest_sha256": "mm"}, "val_data": "/held", **settings}}

    off = online(chat_template_kwargs={"enable_thinking": False}, encoded_sha256="e2")
    assert comparison_note(online(), off, "step") is None
    assert comparison_note(online(), online(chat_template_sha256="bb", encoded_sha256="e2"), "step") is None
    other = online(val={"manifest_sha256": "nn"}, val_data="/other")
    assert comparison_note(online(), other, "step") == ("the runs validate on different sets (/held vs /other): "
                                                        "their metrics do not compare")

def test_real_online_runs_on_other_files_with_one_held_out_file_are_not_flagged(peaked_llama, features, held_out,
                                                                               tmp_path):
    import torch

    from drafter_lab.data.capture import CaptureConfig
    from drafter_lab.data.shards import Manifest
    from drafter_lab.train.sources import Online

    convs = Manifest.load(features).source["conversations"]
    fewer = tmp_path / "fewer.jsonl"
    fewer.write_text("".join(Path(convs).read_text().splitlines(keepends=True)[:36]))
    capture = CaptureConfig(max_length=96, val_fraction=0.25)

    def info(path):
        source = Online(peaked_llama, path, capture, torch.device("cpu"), val_data=held_out[0])
        return {"config": {"batch_size": 8}, "features": {**source.describe(), **source.identity()}}

    assert comparison_note(info(convs), info(fewer), "step") is None


WATCH = """
from drafter_lab.train.watch import WatchConfig

base, out = map(Path, args[:2])
fields = dict(watch=(base, WatchConfig()), total=40, total_tokens=4000, out_dir=out, step=int(args[2]),
              stop_reason=None)
"""


def test_a_baseline_rank_0_cannot_read_fails_every_rank(tmp_path):
    """Rank 0 alone reads the baseline (still growing, maybe cut or removed): its LabError left rank 1 in
    the all-reduce, a gloo traceback once rank 0 exited (NCCL: a hang) under launchers that do not kill
    the other ranks as torchrun does. Two real gloo processes, as srun or mpirun start them."""
    base, out = tmp_path / "base", tmp_path / "out"
    base.mkdir()
    out.mkdir()
    (base / "metrics.jsonl").write_text('{"split": "val", "step": 0, "cond_acc_0": 0.1}\n{"split": "val", cut\n')
    (out / "metrics.jsonl").write_text('{"split": "val", "step": 10, "cond_acc_0": 0.1}\n')
    (code0, out0, err0), (code1, out1, err1) = run_two_ranks(tmp_path, WATCH, "check_watch", base, out, 10)
    assert (code0, code1) == (2, 2), err1[-2000:]
    assert out0.startswith(f"error: {base / 'metrics.jsonl'}: line 2 is not valid JSON")
    assert out1 == f"error: {out}: the watch failed on rank 0 at step 10 (its error is in rank 0's output)\n"


def test_the_replay_judges_no_validation_at_the_runs_last_step():
    """train never judges its last validation (the run is over): a study's report said the watch "would
    have stopped (b) at step 40 of 40" from a verdict train would never have given."""
    run = curve({100: 0.55, 200: 0.5, 300: 0.5, 400: 0.5})  # behind at 200 / 300 / 400 only
    assert judge(run, BASE, W, 400).stop
    assert replay(run, BASE, W, 400) is None
    assert replay(run, BASE, W, 500).rows[-1]["step"] == 400
    tokens = dataclasses.replace(W, watch_axis="train_tokens")
    run = [{**r, "train_tokens": 10 * r["step"]} for r in run]
    base = [{**r, "train_tokens": 10 * r["step"]} for r in BASE]
    assert replay(run, base, tokens, 4000) is None and replay(run, base, tokens, 5000).stop

    def arm(key, points):
        return Arm(key, f"({key})", history=[{"split": "val", "step": s, "cond_acc_0": v} for s, v in points.items()])

    a = arm("a", {10: 0.3, 20: 0.5, 30: 0.6, 40: 0.7, 50: 0.75})
    assert report.watch_stop(a, arm("b", {10: 0.3, 20: 0.38, 30: 0.38, 40: 0.383}))[:2] == (None, 40)
    at, steps, _ = report.watch_stop(a, arm("b", {10: 0.3, 20: 0.38, 30: 0.38, 40: 0.383, 50: 0.39}))
    assert (at, steps) == (40, 50)


def test_watch_on_a_finished_run_judges_no_validation_at_its_last_step(tmp_path, capsys):
    """train never judges the validation at its last step, nor does the replay; `drafter-lab watch` did,
    so a finished run whose final validation trailed got "stop" (exit 3) that train would never have
    said, and a script polling `watch --follow` killed a run that was over."""
    import json

    from drafter_lab.cli import main
    from drafter_lab.train.watch import STOP_EXIT

    def write(name, points, total):
        (tmp_path / name).mkdir(exist_ok=True)
        (tmp_path / name / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in curve(points)))
        (tmp_path / name / "run.json").write_text(json.dumps({"total_steps": total}))

    write("base", {100: 0.5, 200: 0.6, 300: 0.66, 400: 0.7, 500: 0.72}, 500)
    write("run", {100: 0.5, 200: 0.55, 300: 0.6, 400: 0.6}, 400)  # behind at 200 / 300 / 400 only
    watch = ["watch", str(tmp_path / "run"), "--baseline", str(tmp_path / "base")]
    assert main(watch) == 0
    out = capsys.readouterr().out
    assert out.startswith("the run has finished (400 steps): its last validation is not judged")
    assert "keep training" in out and "stop" not in out
    assert main([*watch, "--follow", "0.01", "--json"]) == 0  # finished: no wait
    verdict = json.loads(capsys.readouterr().out)
    assert verdict["finished"] and not verdict["stop"] and verdict["rows"][-1]["step"] == 300
    write("run", {100: 0.5, 200: 0.55, 300: 0.6, 400: 0.6}, 500)  # step 400 is not its last: judged
    assert main(watch) == STOP_EXIT
    assert "the run has finished" not in capsys.readouterr().out


def test_a_baseline_that_cannot_be_read_is_one_line(tmp_path, capsys, monkeypatch):
    """An unreadable metrics.jsonl (permissions), or one removed after read_run's check, was an
    OSError's traceback, not a one-line error."""
    import errno

    from drafter_lab.cli import main
    from drafter_lab.train import watch

    base = tmp_path / "base"
    base.mkdir()
    (base / "metrics.jsonl").write_text("")

    def denied(path):
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr(watch, "read_metrics", denied)
    assert main(["watch", str(base), "--baseline", str(base)]) == 2
    assert capsys.readouterr().err == f"error: {base / 'metrics.jsonl'}: cannot be read (Permission denied)\n"


RACE = WATCH + """
from drafter_lab.train import watch

if args[3] == "full":
    import errno
    import os

    from drafter_lab import atomic

    def full(path, text):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # as write() raises it: no file named

    atomic.write_text = full
if args[3] == "removed":
    real = watch.read_metrics

    def racing(path):
        if Path(path).parent == base:
            Path(path).unlink()  # the baseline removed after read_run's check, before its read
        return real(path)

    watch.read_metrics = racing
"""


@pytest.mark.parametrize("mode", ["full", "removed"])
def test_an_os_error_in_rank_0s_watch_fails_every_rank(tmp_path, mode):
    """Rank 0 caught only LabError: watch.json that cannot be written (disk full) or a baseline removed
    between read_run's check and its read raised an OSError on rank 0 alone, and rank 1 waited in the
    sum (a gloo traceback once rank 0 exited; NCCL: a hang)."""
    import json

    base, out = tmp_path / "base", tmp_path / "out"  # the verdict is "stop": behind at 10 / 20 / 30
    for d, points in ((base, {0: 0.1, 10: 0.5, 20: 0.6, 30: 0.7}), (out, {10: 0.1, 20: 0.1, 30: 0.1})):
        d.mkdir()
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in curve(points)))
    (code0, out0, err0), (code1, out1, err1) = run_two_ranks(tmp_path, RACE, "check_watch", base, out, 30, mode)
    assert (code0, code1) == (2, 2), (err0[-2000:], err1[-2000:])
    assert out0 == {"full": f"error: {out / 'watch.json'}: the watch's verdict cannot be written "
                                  "(No space left on device)\n",
                          "removed": f"error: {base / 'metrics.jsonl'}: cannot be read (No such file or directory)\n"
                          }[mode]
    assert out1 == f"error: {out}: the watch failed on rank 0 at step 30 (its error is in rank 0's output)\n"


def test_a_metrics_file_that_is_not_utf8_is_one_line(tmp_path, capsys):
    """Bytes that are not UTF-8 (a disk error's garbage, another file copied over it) were a
    UnicodeDecodeError's traceback, and under train's watch rank 0's alone."""
    from drafter_lab.cli import main

    base = tmp_path / "base"
    base.mkdir()
    (base / "metrics.jsonl").write_bytes(b'{"step": 0}\n\xff\xfe\n')
    assert main(["watch", str(base), "--baseline", str(base)]) == 2
    assert capsys.readouterr().err == f"error: {base / 'metrics.jsonl'}: not UTF-8 text (byte 12)\n"
