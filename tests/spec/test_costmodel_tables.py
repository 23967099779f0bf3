"""Cost tables by batch and the draft-depth table: what they price beyond their points and at each depth."""

from __future__ import annotations

import dataclasses

import pytest

from drafter_lab.spec.costmodel import PRESETS, CostModel, interpolate_linear
from drafter_lab.spec.costreport import steps_table

SEEDS = "seeds-kimi-k2.5-8x-pcie"


def test_a_cost_table_is_never_extended_downward():
    """A flat but noisy table (300 then 280 us) priced batch 64 at -120 us a draft step: beyond the last
    point a falling segment holds its last value; a rising one still extends."""
    falling = {1: 300.0, 4: 280.0}
    assert interpolate_linear(falling, 2.5) == pytest.approx(290.0)  # between points, as measured
    assert interpolate_linear(falling, 64) == 280.0
    assert interpolate_linear({1: 300.0, 4: 330.0}, 64) == pytest.approx(930.0)
    cfg = dataclasses.replace(PRESETS[SEEDS], batch=64, draft_step_us_by_batch=falling,
                              draft_extend_us_by_batch={1: 300.0, 4: 290.0})
    assert CostModel(cfg).draft_ms > 0


def test_the_depth_table_prices_chains_at_one_drafter_row_per_sequence():
    """accept_by_steps is a chain's: its rows draft one row per sequence even where the config came from a
    tree's eval (topk 2), not topk rows (300 us here instead of 100)."""
    cfg = dataclasses.replace(PRESETS[SEEDS], topk=2, draft_step_us_by_batch={1: 100.0, 2: 300.0},
                              accept_by_steps=[1.7, 2.2])
    rows = steps_table(cfg)
    chain = dataclasses.replace(cfg, topk=1)
    for row, steps in zip(rows, (1, 2)):
        want = CostModel(dataclasses.replace(chain, steps=steps, verify_tokens=steps + 1))
        assert row["cycle_ms"] == pytest.approx(want.cycle_ms())
    assert CostModel(dataclasses.replace(chain, steps=1, verify_tokens=2)).draft_step_us == 100.0


def test_the_order_of_inputs_keeps_the_draft_extend_table(tmp_path):
    """bench verify writes the extend table, the draft-forward bench a step with its table: folded in either
    order, the extend cost stays (it was dropped when the step file came second)."""
    import json

    from drafter_lab.spec.costinputs import apply_inputs

    verify, forward = tmp_path / "verify.json", tmp_path / "forward.json"
    verify.write_text(json.dumps({"draft_step_us": 150.0, "draft_step_us_by_batch": {"1": 150.0},
                                  "draft_extend_us_by_batch": {"1": 400.0}}))
    forward.write_text(json.dumps({"draft_step_us": 300.0, "draft_step_us_by_batch": {"1": 300.0}}))
    for files in ((verify, forward), (forward, verify)):
        cfg = PRESETS[SEEDS]
        for f in files:
            cfg = apply_inputs(cfg, f)[0]
        assert cfg.draft_extend_us_by_batch == {1: 400.0}
    lone = tmp_path / "ngram.json"  # a lone measured step (an n-gram lookup) still replaces every table
    lone.write_text(json.dumps({"draft_step_us": 12.0}))
    cfg = apply_inputs(apply_inputs(PRESETS[SEEDS], verify)[0], lone)[0]
    assert (cfg.draft_step_us, cfg.draft_step_us_by_batch, cfg.draft_extend_us_by_batch) == (12.0, {}, {})
