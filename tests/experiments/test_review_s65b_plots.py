"""Pins from the s65 mutation audit of experiments/plots.py: what each study picture draws."""

from __future__ import annotations

import pytest

from drafter_lab.experiments import plots
from drafter_lab.experiments.study import Arm


@pytest.fixture
def figs(monkeypatch):
    out = []
    monkeypatch.setattr(plots, "save_png", lambda fig, path: out.append(fig))
    return out


def test_learning_curves_draw_validation_rows_only(figs):
    hist = [{"split": "val", "step": 0, "cond_acc_0": 0.1, "loss_0": 6.0},
            {"step": 5, "loss": 5.0, "cond_acc_0": 0.9, "loss_0": 1.0},  # a training row: no split key
            {"split": "val", "step": 10, "cond_acc_0": 0.4, "loss_0": 4.0}]
    plots.learning_curves([Arm("a", "(a)", history=hist)], "unused.png", 6.2)
    acc, loss = figs[0].axes
    assert list(acc.lines[0].get_xdata()) == [0, 10] and list(loss.lines[0].get_ydata()) == [6.0, 4.0]


def test_speed_by_depth_stars_the_fastest_depth(figs):
    rows = [{"steps": 1, "spec_tok_s": 90.0}, {"steps": 2, "spec_tok_s": 120.0}, {"steps": 3, "spec_tok_s": 100.0}]
    plots.speed_by_depth([{"label": "(a)", "served_accept_len": 2.5, "tables": {15.0: rows}}], {15.0: 80.0}, "unused.png")
    star = [ln for ln in figs[0].axes[0].lines if ln.get_marker() == "*"]
    assert list(star[0].get_xdata()) == [2] and list(star[0].get_ydata()) == [120.0]


def test_drift_sweep_colours_verdicts_and_counts_the_levels_left_out(figs):
    pts = [{"drift": 0.02, "gain": 0.1, "drift_knob": 0.0, "verdict": "transfer", "verdict_matches": True},
           {"drift": 0.2, "gain": -0.05, "drift_knob": 1.0, "verdict": "transfer", "verdict_matches": False},
           {"drift": None, "gain": 0.0, "drift_knob": 0.5, "verdict": "transfer", "verdict_matches": True}]
    plots.drift_sweep(pts, "unused.png")
    ax = figs[0].axes[0]
    assert "(1 level(s) without an aux CKA not shown)" in ax.get_title()
    from matplotlib.colors import to_rgba

    assert [tuple(c) for c in ax.collections[0].get_facecolors()] == [to_rgba("tab:green"), to_rgba("tab:red")]
