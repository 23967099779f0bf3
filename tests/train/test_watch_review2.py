"""Review of the watch: hand-edited baseline rows (no step, a string step or value) are one line naming
the file, and no exception of rank 0's watch leaves rank 1 waiting in its sum."""

from __future__ import annotations

import json

import pytest

from drafter_lab.cli import main

from .two_ranks import run_two_ranks

RUN = [{"split": "val", "step": s, "train_tokens": 10 * s, "cond_acc_0": 0.5} for s in (100, 200, 300)]
BAD_ROWS = [  # (the baseline's second line, the error after its path, a watch axis it broke)
    ({"split": "val", "train_tokens": 2000, "cond_acc_0": 0.5},
     'base/metrics.jsonl: line 2 is not a metrics record: no "step"', "train_tokens"),  # KeyError
    ({"split": "val", "step": "200", "train_tokens": 2000, "cond_acc_0": 0.5},
     'base/metrics.jsonl: line 2 is not a metrics record: "step" "200" is not an integer', "step"),  # TypeError
    ({"split": "val", "step": 200, "train_tokens": "2000", "cond_acc_0": 0.5},
     'base: its validation at step 200 has train_tokens "2000", not a number', "train_tokens"),
    ({"split": "val", "step": 200, "train_tokens": 2000, "cond_acc_0": "0.5"},  # null is a NaN metric: skipped
     'base: its validation at step 200 has cond_acc_0 "0.5", not a number', "step"),
]


def _runs(tmp_path, second: dict):
    base, out = tmp_path / "base", tmp_path / "out"
    base.mkdir()
    out.mkdir()
    rows = [{**RUN[0], "step": 50, "train_tokens": 500}, second, RUN[2]]
    (base / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in RUN))
    return base, out


@pytest.mark.parametrize("second, problem, axis", BAD_ROWS)
def test_a_hand_edited_baseline_row_is_one_line(tmp_path, capsys, second, problem, axis):
    """Each was a KeyError or a TypeError's traceback from `watch`."""
    base, out = _runs(tmp_path, second)
    assert main(["watch", str(out), "--baseline", str(base), "--watch-axis", axis]) == 2
    assert capsys.readouterr().err == f"error: {tmp_path / problem}\n"


WATCH = """
import drafter_lab.train.loop
from drafter_lab.train.watch import WatchConfig

base, out = map(Path, args[:2])
fields = dict(watch=(base, WatchConfig(watch_axis=args[3])), total=40, total_tokens=4000, out_dir=out,
              step=int(args[2]), stop_reason=None)
if args[4] == "boom" and rank == 0:
    def boom(*_):
        raise RuntimeError("boom")
    drafter_lab.train.loop.judge = boom
"""


@pytest.mark.parametrize("case", ["no step", "boom"])
def test_any_failure_of_rank_0s_watch_fails_every_rank(tmp_path, case):
    """Rank 0 shared only a LabError: a bad baseline row's KeyError (or any other exception) left rank 1
    in the sum, a gloo traceback once rank 0 exited (NCCL: a hang)."""
    base, out = _runs(tmp_path, BAD_ROWS[0][0] if case == "no step" else RUN[1])
    (code0, out0, err0), (code1, out1, err1) = run_two_ranks(tmp_path, WATCH, "check_watch", base, out, 10,
                                                             "train_tokens", case)
    assert code1 == 2, err1[-2000:]
    assert out1 == f"error: {out}: the watch failed on rank 0 at step 10 (its error is in rank 0's output)\n"
    if case == "boom":  # a bug's traceback, on rank 0 (gloo's threads may abort it at exit: not 1)
        assert code0 not in (0, 2) and "RuntimeError: boom" in err0, (code0, err0[-2000:])
    else:
        assert (code0, out0) == (2, f"error: {tmp_path / BAD_ROWS[0][1]}\n")


@pytest.mark.parametrize("record, problem", [
    ({"total_steps": "300"}, 'its total_steps "300" is not a number'),  # TypeError comparing steps with it
    ({"total_steps": None}, "its total_steps null is not a number"),
    ({"config": []}, "its config is not a JSON object"),  # AttributeError comparing the runs' settings
    ({"features": "x"}, "its features is not a JSON object"),
])
def test_a_hand_edited_run_record_is_one_line(tmp_path, capsys, record, problem):
    base, out = _runs(tmp_path, RUN[1])
    (base / "run.json").write_text(json.dumps({"config": {"batch_size": 4}, "features": {"sha256": "a"}}))
    (out / "run.json").write_text(json.dumps(record))
    assert main(["watch", str(out), "--baseline", str(base)]) == 2
    assert capsys.readouterr().err == f"error: {out / 'run.json'}: not a run record: {problem}\n"
