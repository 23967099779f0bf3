"""Review s64 suspects in the study report: a served histogram without an accepted draft, and a level
whose probe measured no aux CKA."""

from __future__ import annotations

from PIL import Image
from test_report import _level  # this directory is on sys.path (pytest prepends it)

from drafter_lab.experiments import plots, report
from drafter_lab.experiments.config import get_config


def test_a_drafter_that_never_had_a_draft_accepted_is_priced_at_one_step():
    """{"1": n} (a served histogram trimmed to what occurred) gave no depth: best_row None, and the speed
    section raised a TypeError on it."""
    level = _level(0.7, 0.6, 0.5)
    level["arms"][0].served = {"served_accept_len": 1.0, "accept_histogram": {"1": 9}}
    lines = report._speed_section(level, get_config("tiny-cpu"), None)
    (row,) = [line for line in lines if line.startswith("| (a)")]
    assert "| 1.00 | 1: " in row and "(0." in row.split(" | ")[2]  # slower than plain decoding


def _levels():
    levels = [dict(_level(0.6, 0.7, 0.5, "transfer with remap"), drift_knob=0.1),
              dict(_level(0.7, 0.4, 0.5, "transfer with remap"), drift_knob=2.0)]
    levels[0]["probe"]["aux_cka"] = None  # no home signal: the probe had no source target to compare
    levels[1]["probe"]["aux_cka"] = [0.8, 0.7, 0.6]
    return levels


def test_a_level_without_an_aux_cka_shows_its_drift_as_unknown():
    """Before, a missing CKA read as [1.0]: zero drift and a min CKA of 1.0, figures nobody measured."""
    pts = report.sweep_points(_levels())
    assert pts[0]["drift"] is None and pts[0]["min_cka"] is None
    assert abs(pts[1]["drift"] - 0.3) < 1e-9 and pts[1]["min_cka"] == 0.6
    rows = report.sweep_table(pts)
    assert rows[2].startswith("| 0.1 | n/a | n/a | 0.50 |") and "| 0.3000 | 0.6000 |" in rows[3]


def test_the_sweep_plot_leaves_out_a_level_without_an_aux_cka(tmp_path):
    plots.drift_sweep(report.sweep_points(_levels()), tmp_path / "sweep.png")
    with Image.open(tmp_path / "sweep.png") as im:
        assert im.format == "PNG"
