"""Pins from the s65 mutation audit of spec/phaseplot.py and spec/costplot.py: what the pictures say."""

from __future__ import annotations

import dataclasses

import pytest

from drafter_lab.spec import costplot, phaseplot
from drafter_lab.spec.costmodel import PRESETS, CostModel

SEEDS = "seeds-kimi-k2.5-8x-pcie"


def _capture(monkeypatch, module):
    figs = []
    monkeypatch.setattr(module, "save_png", lambda fig, path: figs.append(fig))
    return figs


def _result(batch, speedup, schedule="static"):
    return {"config": {"steps": 3, "topk": 1, "draft_tokens": 3, "batch": batch, "schedule": schedule},
            "speedup": speedup, "verify_passes": 2, "decode_passes": 5,
            "phase_seconds": {"spec": {"prefill": 0.002, "draft": 0.001, "verify": 0.004, "accept": 0.001},
                              "baseline": {"prefill": 0.002, "verify": 0.008}}}


def test_phase_bars_stack_each_decode_and_note_the_speedup_on_the_speculative_one(monkeypatch):
    figs = _capture(monkeypatch, phaseplot)
    results = [_result(1, 1.5), _result(4, 0.8, "continuous")]
    rows = phaseplot.bars(results)
    assert [r["side"] for r in rows] == ["spec", "baseline", "spec", "baseline"]
    assert [r["speedup"] for r in rows] == [1.5, 1.5, 0.8, 0.8]
    assert rows[1]["ms"] == pytest.approx({"prefill": 0.4, "verify": 1.6})  # baseline: over its 5 passes
    phaseplot.plot(results, "unused.png")
    ax = figs[0].axes[0]
    notes = [t.get_text() for t in ax.texts]
    # spec: (2 + 1 + 4 + 1) ms over 2 passes; target only: 10 ms over 5 passes
    assert notes == [" 4.00 ms, 1.50x tok/s", " 2.00 ms", " 4.00 ms, 0.80x tok/s", " 2.00 ms"]
    assert [t.get_position()[0] for t in ax.texts] == pytest.approx([4.0, 2.0, 4.0, 2.0])
    assert ax.get_xlim() == pytest.approx((0.0, 5.0))


def test_cost_plot_x_axis_reaches_past_the_largest_depth_accept_and_both_panels_are_drawn(monkeypatch):
    cfg = dataclasses.replace(PRESETS[SEEDS], accept_lengths=[2.0], accept_by_steps=[1.8, 2.4, 5.5])
    lines = costplot.series(cfg)
    assert lines[0]["accept"][-1] == pytest.approx(6.5)
    xs = lines[0]["accept"]
    assert len(xs) == costplot.ACCEPT_POINTS and xs[1] - xs[0] == pytest.approx(5.5 / (costplot.ACCEPT_POINTS - 1))
    figs = _capture(monkeypatch, costplot)
    costplot.plot(cfg, "unused.png")
    left, right = figs[0].axes
    best = max(lines[0]["steps"], key=lambda r: r["spec_tok_s"])
    stars = [ln for ln in right.lines if ln.get_marker() == "*"]
    assert list(stars[0].get_xdata()) == [best["steps"]]
    assert list(right.get_xticks()) == [1, 2, 3]
    m = CostModel(cfg)
    assert lines[0]["steps"] and right.lines[0].get_ydata()[0] == pytest.approx(lines[0]["steps"][0]["spec_tok_s"])
    assert left.lines[0].get_ydata()[0] == pytest.approx(m.spec_tok_s(1.0))


def test_cost_plot_lines_price_their_own_allreduce():
    cfg = dataclasses.replace(PRESETS[SEEDS], accept_by_steps=[1.8, 2.4], measured_verify_ms=30.0)
    table = {8192: 10.0, 65536: 14.0}
    m = CostModel(cfg)  # a flag set the all-reduce (priced=False): the measured verify is split at the preset's
    flagged = costplot.series(cfg, measured=table, priced=False)
    assert flagged[0]["spec_tok_s"][0] == pytest.approx(m.spec_tok_s(1.0, cfg.verify_allreduce_us))
    lines = costplot.series(cfg, measured=table)
    assert lines[0]["allreduce_us"] == pytest.approx(13.7, abs=0.05)  # the table read at the verify's message
    m = CostModel(costplot.on_allreduce(cfg, table))
    for s, latency in zip(lines, [table, 205.0, 200.0, 40.0]):
        assert [r["spec_tok_s"] for r in s["steps"]] == pytest.approx(
            [r["spec_tok_s"] for r in costplot.steps_table(m.cfg, latency)])


def test_phase_bars_of_a_null_ratio_or_no_time_draw_without_a_ratio_or_a_warning(monkeypatch, recwarn):
    """A journal keeps a NaN ratio as null (it raised formatting None); all-zero phases gave a zero-width axis
    (matplotlib warns, and draws nothing readable)."""
    figs = _capture(monkeypatch, phaseplot)
    zero = _result(1, None)
    zero["phase_seconds"] = {"spec": {}, "baseline": {}}
    phaseplot.plot([zero], "unused.png")
    ax = figs[0].axes[0]
    assert [t.get_text() for t in ax.texts] == [" 0.00 ms", " 0.00 ms"]
    assert ax.get_xlim() == pytest.approx((0.0, 1.0))
    assert not [w for w in recwarn if "xlim" in str(w.message) or "singular" in str(w.message).lower()]
