"""The watch's rules no other test pins: every loss (weighted_loss too) is lower-better, a validation
that scored NaN is matched with nothing, a baseline with one validation so far is read there, a window
of none is refused while a margin of zero is taken, a closing gap keeps a run of unknown length
training, batches of other token budgets are flagged, a verdict without its step is refused, and a metric
some validations lack is judged where it was logged."""

from __future__ import annotations

import dataclasses

import pytest

from drafter_lab.errors import LabError
from drafter_lab.train.watch import WATCH_FILE, WatchConfig, judge, stopped_at, unequal_batches, value_at


def curve(points: dict[int, float], metric: str = "cond_acc_0") -> list[dict]:
    return [{"event": "val", "split": "val", "step": s, metric: v} for s, v in points.items()]


def test_the_weighted_loss_counts_lower_as_better():
    cfg = dataclasses.replace(WatchConfig(), watch_metric="weighted_loss", watch_margin=0.05)
    base = curve({100: 3.0, 200: 2.5, 300: 2.2}, "weighted_loss")
    v = judge(curve({100: 3.5, 200: 3.4, 300: 3.4}, "weighted_loss"), base, cfg, 1000)
    assert v.stop and [r["gap"] for r in v.rows] == pytest.approx([-0.5, -0.9, -1.2])
    assert not judge(curve({100: 2.0, 200: 1.9, 300: 1.8}, "weighted_loss"), base, cfg, 1000).stop


def test_a_validation_that_scored_nan_is_matched_with_nothing():
    """A NaN (null in metrics.jsonl) compares as neither behind nor ahead: it is left out, so it cannot
    make up a window of "behind" validations."""
    base = curve({100: 0.5, 200: 0.5, 300: 0.5, 400: 0.5})
    nan = float("nan")
    v = judge(curve({100: 0.2, 200: nan, 300: nan, 400: 0.2}), base, WatchConfig(), 1000)
    assert not v.stop and [r["step"] for r in v.rows] == [100, 400]
    assert v.reason.startswith("too early: 2 of 3")
    v = judge(curve({100: 0.5, 200: 0.5, 300: 0.5}), curve({100: 0.5, 200: nan, 300: 0.5}), WatchConfig(), 1000)
    assert [r["baseline"] for r in v.rows] == [0.5, 0.5, 0.5]  # the baseline's NaN: read between its neighbours


def test_a_baseline_with_one_validation_is_read_at_it():
    assert value_at([(100, 0.5, 100)], 100) == 0.5
    assert value_at([(100, 0.5, 100)], 50) is None and value_at([], 100) is None
    v = judge(curve({100: 0.2}), curve({0: 0.0, 100: 0.5}), dataclasses.replace(WatchConfig(), watch_window=1), 1000)
    assert v.stop and v.rows[0]["baseline"] == 0.5
    v = judge(curve({100: 0.2}), curve({100: 0.5}), dataclasses.replace(WatchConfig(), watch_window=1), 1000)
    assert v.stop and v.rows[0]["baseline"] == 0.5


def test_a_window_of_no_validations_is_refused():
    """`watch_window` 0 would judge every matched validation, and none at all before the first."""
    for rows in ([], curve({100: 0.2})):
        with pytest.raises(LabError, match="watch_window must be >= 1, got 0"):
            judge(rows, curve({100: 0.5}), dataclasses.replace(WatchConfig(), watch_window=0), 1000)


def test_a_margin_of_zero_is_taken_and_calls_any_deficit_behind():
    cfg = dataclasses.replace(WatchConfig(), watch_margin=0.0)
    base = curve({100: 0.5, 200: 0.5, 300: 0.5})
    assert judge(curve({100: 0.49, 200: 0.49, 300: 0.49}), base, cfg, 1000).stop
    assert not judge(curve({100: 0.49, 200: 0.5, 300: 0.49}), base, cfg, 1000).stop  # a tie is not behind


def test_a_closing_gap_keeps_a_run_of_unknown_length_training():
    """`total` None (a run without its run.json yet): a gap closing at all keeps it training."""
    run = curve({200: 0.50, 300: 0.60, 400: 0.68})  # gaps -10 / -6 / -2 points: parity near step 450
    v = judge(run, curve({0: 0.0, 100: 0.50, 200: 0.60, 300: 0.66, 400: 0.70}), WatchConfig(), None)
    assert not v.stop and "but closing, parity near step 450" in v.reason


def test_runs_whose_token_budgets_per_batch_differ_are_flagged():
    a, b = {"config": {"batch_size": 8, "batch_tokens": 0}}, {"config": {"batch_size": 8, "batch_tokens": 4096}}
    assert unequal_batches(a, b).startswith("the runs' batches differ (batch_tokens 0 vs 4096): equal steps are not")


@pytest.mark.parametrize("text", ['{"stop": true}', '{"step": "30"}', '{"step": null}', '{"step": true}'])
def test_a_verdict_without_a_whole_step_is_one_line(tmp_path, text):
    (tmp_path / WATCH_FILE).write_text(text)
    with pytest.raises(LabError, match="not the watch's verdict"):
        stopped_at(tmp_path)


def test_a_metric_some_validations_lack_is_judged_where_it_was_logged():
    """A metric logged only from some validation on (a run resumed with it, say) is compared where it is."""
    base = [{"split": "val", "step": 100}] + curve({200: 0.5, 300: 0.5, 400: 0.5})
    v = judge(curve({200: 0.2, 300: 0.2, 400: 0.2}), base, WatchConfig(), 1000)
    assert v.stop and [r["step"] for r in v.rows] == [200, 300, 400]
