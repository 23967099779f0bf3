"""report.md's pieces no other test pins: the plateau rule and its edges, the reuse and trailing
margins at their lines, the L2-SP, lead-trend and watch lines, the arm table, which served results the
speed section prices and how, the probe section's match and home lines, the sweep's count, the
single-level and sweep layouts, and results.json's measured outcome."""

from __future__ import annotations

import dataclasses

import pytest

from drafter_lab.experiments import report
from drafter_lab.experiments.config import get_config
from drafter_lab.experiments.probe import ProbeThresholds
from drafter_lab.experiments.study import Arm
from drafter_lab.spec.costinputs import accept_by_steps
from drafter_lab.spec.costmodel import PRESETS
from drafter_lab.spec.costreport import steps_table


def _arm(key, curve, final_acc=0.5, accept=1.0, steps=None, **kw):
    """An arm whose val cond_acc_0 follows `curve` at `steps` (10, 20, ... unless given)."""
    steps = steps or [10 * (i + 1) for i in range(len(curve))]
    history = [{"split": "val", "step": s, "cond_acc_0": c, "loss_0": 1.0} for s, c in zip(steps, curve)]
    final = {"cond_acc_0": final_acc, "cond_acc_1": 0.25, "loss_0": 1.0, "loss_1": 2.0, "simulated_accept_len": accept}
    return Arm(key, f"({key})", history=history, final=final, **kw)


def _level(a_acc=0.5, b_acc=0.5, zero_accept=0.5, verdict="train from scratch", drift=1.0, arms=None):
    probe = {"zero_shot": {"simulated_accept_len": zero_accept, "cond_acc_0": 0.2},
             "vocab": {"same_positions": 1, "size_a": 2, "shared_tokens": 2, "by": "id"},
             "thresholds": dataclasses.asdict(ProbeThresholds()), "verdict": verdict, "reason": "why"}
    arms = arms or [_arm("a", [a_acc] * 3, a_acc, 2.0, steps=[0, 10, 20]),
                    _arm("b", [b_acc] * 3, b_acc, 1.0, steps=[0, 10, 20])]
    return {"drift_knob": drift, "pair": {}, "timings": {}, "arms": arms, "probe": probe}


def test_the_early_loss_is_the_step0_validation_wherever_it_lies():
    arm = Arm("c", "(c)", history=[{"split": "train", "step": 1, "loss_0": 5.0},
                                   {"split": "val", "step": 0, "loss_0": 6.5, "cond_acc_0": 0.0}])
    assert report._early_loss(arm) == 6.5
    assert report._early_loss(Arm("c", "(c)", history=[{"split": "train", "step": 1, "loss_0": 5.0}])) == 5.0


def test_a_plateau_needs_four_validations_and_a_flat_last_half():
    assert report._plateau_step(_arm("b", [0.3, 0.38, 0.383])) is None  # three: too few to call
    assert report._plateau_step(_arm("b", [0.3, 0.38, 0.38, 0.383])) == 20
    assert report._plateau_step(_arm("b", [0.3, 0.35, 0.36, 0.40])) is None  # still rising over its last half


def test_the_plateau_margin_at_its_line(monkeypatch):
    """Binary fractions, so each rise is exactly the margin: a rise of the margin is no plateau, and a
    value the margin under the best has reached it."""
    monkeypatch.setattr(report, "PLATEAU_POINTS", 0.125)
    assert report._plateau_step(_arm("b", [0.25, 0.25, 0.25, 0.375])) is None
    assert report._plateau_step(_arm("b", [0.125, 0.25, 0.375, 0.375])) == 20


def test_a_transfer_flat_from_its_first_validation_has_plateaued_since_step_0():
    level = _level(arms=[_arm("a", [0.3, 0.5, 0.6, 0.7], 0.7, steps=[0, 10, 20, 30]),
                         _arm("b", [0.3, 0.3, 0.3, 0.3], 0.3, steps=[0, 10, 20, 30])])
    assert report._plateau_step(level["arms"][1]) == 0
    assert "(b) trails (a) by 40.0 points of cond_acc_0 at equal steps, plateau since step 0" in \
        report.decisions(level, get_config("drift-sweep"))[0]


def test_a_source_keeping_exactly_the_reuse_margin_is_reused(monkeypatch):
    monkeypatch.setattr(report, "REUSE_MARGIN", 0.5)
    assert report.measured_outcome(_level(zero_accept=1.0))[0] == "reuse as is"  # scratch accepts 2.0
    assert report.measured_outcome(_level(zero_accept=0.875))[0] == "train from scratch"


def test_trailing_by_exactly_the_margin_is_within_it(monkeypatch):
    """A lead of exactly the margin pays (test_report); a deficit of exactly it is inside the band."""
    monkeypatch.setattr(report, "GAIN_MARGIN", 0.125)
    lines = report.decisions(_level(0.625, 0.5), get_config("drift-sweep"))
    assert lines[0].startswith("(b) and (a) are within 12 point") and "the transfer buys nothing" in lines[0]


def test_no_remap_line_without_a_start_for_b():
    """A (b) with no metrics (its metrics.jsonl missing) has no start to set (c)'s against."""
    level = _level()
    level["arms"][1].history = []
    level["arms"].append(_arm("c", [0.2] * 3, 0.2, steps=[0, 10, 20]))
    lines = report.decisions(level, get_config("tiny-cpu"))
    assert not any(line.startswith("(c) starts") for line in lines)


def test_the_l2sp_line_compares_d_with_plain_transfer():
    level = _level(0.7, 0.4)
    level["arms"].append(_arm("d", [0.45] * 3, 0.45, steps=[0, 10, 20]))
    assert report.decisions(level, get_config("drift-sweep"))[-1] == \
        "L2-SP (d) vs plain transfer (b): +5.0 points of cond_acc_0."


def test_the_lead_trend_leaves_out_step_0_and_needs_three_shared_steps():
    a = _arm("a", [0.1, 0.3, 0.4, 0.5], steps=[0, 10, 20, 30])
    b = _arm("b", [0.5, 0.4, 0.5, 0.6], steps=[0, 10, 20, 30])
    assert report._lead_trend(a, b).startswith("(b) - (a) at steps 10 / 20 / 30: +10.0 / +10.0 / +10.0 points")
    two = [_arm(k, [0.3, 0.4, 0.5], steps=[0, 10, 20]) for k in "ab"]
    assert report._lead_trend(*two) is None


def test_the_watch_line_says_where_it_would_have_stopped_b_and_what_was_left():
    steps = list(range(0, 101, 10))
    a, b = _arm("a", [0.5] * len(steps), steps=steps), _arm("b", [0.3] * len(steps), steps=steps)
    assert report.watch_stop(a, b)[:2] == (30, 100)
    line = report._watch_line(a, b)
    assert line.startswith("The watch (`train --stop-if-behind` (a), default settings) would have stopped (b) at "
                           "step 30 of 100 (70 % of its steps unspent): cond_acc_0 -20.0 points against")


def test_the_arm_table_has_every_depth_and_the_served_accept_where_measured():
    a = _arm("a", [0.5], accept=2.0, served={"served_accept_len": 2.5})
    b = _arm("b", [0.5], accept=1.5)
    head, rule, row_a, row_b = report._arm_table({"arms": [a, b]}, 2)
    assert head == "| arm | cond_acc_0 | cond_acc_1 | loss_0 | loss_1 | sim. accept | served accept |"
    assert rule == "|" + "---|" * 7
    assert row_a == "| (a) | 0.500 | 0.250 | 1.000 | 2.000 | 2.00 | 2.50 |"
    assert row_b == "| (b) | 0.500 | 0.250 | 1.000 | 2.000 | 1.50 | - |"


def test_only_served_results_with_a_histogram_are_priced():
    level = _level()
    level["arms"][0].served = {"served_accept_len": 2.0, "accept_histogram": {"1": 1, "3": 1}}
    level["arms"][1].served = {"served_accept_len": 1.0}  # an eval without its histogram
    level["source_served_zero_shot"] = {"served_accept_len": 1.0, "accept_histogram": {}}
    assert [d["label"] for d in report.speed_tables(level)] == ["(a)"]


def test_the_lookups_no_draft_share_is_priced():
    """n-gram lookup drafts nothing at some cycles (no match): those decode plainly, at the preset's
    decode step, not at a drafting cycle's cost."""
    hist = {"1": 2, "2": 1, "3": 1}
    level = _level()
    level["ngram_served"] = {"served_accept_len": 1.75, "accept_histogram": hist, "draft_step_us": 2.0,
                             "no_draft_share": 0.5}
    (d,) = report.speed_tables(level)
    preset = PRESETS[report.SPEED_PRESET]
    priced = dataclasses.replace(preset, accept_by_steps=accept_by_steps(hist, None), draft_step_us=2.0,
                                 no_draft_share=0.5)
    for x, rows in d["tables"].items():
        assert rows == steps_table(priced, x)
        assert rows != steps_table(dataclasses.replace(priced, no_draft_share=0.0), x)


def test_the_probe_section_says_whether_the_verdict_matches_and_the_home_figure():
    level = _level(0.7, 0.4, verdict="train from scratch")
    lines = report._probe_section(level)
    assert lines[-1].endswith("The verdict matches the measurement.")
    assert not any(line.startswith("- home") for line in lines)
    level["probe"]["verdict"] = "transfer with remap"
    level["probe"]["home"] = {"simulated_accept_len": 2.345}
    lines = report._probe_section(level)
    assert lines[-1].endswith("The verdict does NOT match the measurement.")
    assert "- home (source target, same tokens): simulated accept 2.35" in lines


def test_the_sweep_counts_the_levels_whose_verdict_matched():
    levels = [_level(0.7, 0.4, drift=d) for d in (0.0, 0.5, 1.0)]
    levels[2]["probe"]["verdict"] = "transfer with remap"
    for lv in levels:
        lv["probe"]["aux_cka"] = [0.9]
    assert report.sweep_table(report.sweep_points(levels))[-1] == \
        "The probe's verdict matched the measured outcome at 2 of 3 drift levels."


def test_one_level_has_no_drift_headings_and_a_sweep_has_a_directory_per_level():
    cfg = dataclasses.replace(get_config("smoke"), ttt_steps=2, served_eval=False)
    one = _level()
    one["pair"] = {"drift_figures": {"all": {"kl": 0.12345, "cka": [0.9, 0.8]}}}
    text = report.render(cfg, [one], None, 60.0)
    assert "## Drift knob" not in text and "![learning curves](curves.png)" in text
    assert "Target drift (tuned vs base): KL 0.1235; per-layer CKA 0.900, 0.800\n" in text
    levels = [_level(drift=0.5), _level(drift=1.0)]
    for lv in levels:
        lv["probe"]["aux_cka"] = [0.9]
    text = report.render(cfg, levels, report.sweep_points(levels), 60.0)
    assert "## Drift knob 0.5\n" in text and "## Drift knob 1\n" in text
    assert "![learning curves](drift-0.5/curves.png)" in text and "![cond_acc_k](drift-1/cond_acc_k.png)" in text
    assert "Target drift" not in text


@pytest.mark.parametrize("a_acc, b_acc, outcome", [(0.4, 0.7, "transfer with remap"), (0.7, 0.4, "train from scratch")])
def test_results_json_records_each_levels_measured_outcome(a_acc, b_acc, outcome):
    out = report.results_json([_level(a_acc, b_acc)], None, 1.0)
    (lv,) = out["levels"]
    assert lv["measured_outcome"] == outcome
    assert [a["key"] for a in lv["arms"]] == ["a", "b"] and lv["arms"][1]["final"]["cond_acc_0"] == b_acc
