"""Review s64 suspects: a chain eval that never accepted a draft still gets its draft-steps table."""

from __future__ import annotations

import json

import pytest

from drafter_lab.spec.costinputs import accept_by_steps, apply_inputs
from drafter_lab.spec.costmodel import PRESETS
from drafter_lab.spec.costreport import format_report, report

SEEDS = "seeds-kimi-k2.5-8x-pcie"


@pytest.mark.parametrize("steps", [None, 4])
def test_a_histogram_without_an_accepted_draft_is_accept_one_at_depth_one(steps):
    """Every verify step emitted the bonus token alone: one step deep it still would have. Before, the
    depths ran to the longest length seen minus one, none here: an empty list, which the table dropped
    (an explicit empty accept_by_steps is refused)."""
    assert accept_by_steps({"1": 7}, None, steps) == [1.0]
    assert accept_by_steps({"1": 5, "3": 3}, None, steps) == pytest.approx([1.375, 1.75])  # as before


def test_the_cost_report_prices_a_drafter_that_never_hits_as_a_loss(tmp_path):
    """The report says speculation loses at every depth, where it showed no draft-steps section at all."""
    f = tmp_path / "eval.json"
    f.write_text(json.dumps({"served_accept_len": 1.0, "accept_histogram": {"1": 12},
                             "config": {"steps": 3, "topk": 1}}))
    cfg, _ = apply_inputs(PRESETS[SEEDS], f)
    assert cfg.accept_by_steps == [1.0]
    r = report(cfg)
    assert [row["steps"] for row in r["steps_table"]] == [1] and r["best_steps"]["speedup"] < 1
    text = format_report(r, "eval.json")
    assert "draft steps (chain" in text and "still slower than plain decoding" in text
