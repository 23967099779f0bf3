"""The cost model's arithmetic against hand-computed numbers: a tree's draft time and a sweep row
whose eval did not say its topk."""

from __future__ import annotations

import dataclasses
import json

import pytest

from drafter_lab.cli import main
from drafter_lab.spec.costmodel import PRESETS, CostModel
from drafter_lab.spec.costreport import settings_table

SEEDS = "seeds-kimi-k2.5-8x-pcie"


def test_a_trees_first_draft_runs_one_row_per_sequence():
    """Batch 4, topk 2, 3 steps, a draft-step table {1: 700, 8: 980, 32: 1100} us and no extend table: the
    first draft (the extend) runs the 4 roots, 820 us; the 2 later steps 8 rows, 980 us each: 2.78 ms
    (3 x 980 = 2.94 ms charged the roots' step at 8 rows). A chain, or a flat step, is unchanged."""
    table = {1: 700.0, 8: 980.0, 32: 1100.0}
    tree = CostModel(dataclasses.replace(PRESETS[SEEDS], batch=4, topk=2, steps=3, draft_step_us_by_batch=table))
    assert tree.draft_step_us == pytest.approx(980.0)
    assert tree.draft_ms == pytest.approx((820.0 + 2 * 980.0) / 1000)
    chain = CostModel(dataclasses.replace(tree.cfg, topk=1))
    assert chain.draft_ms == pytest.approx(3 * 820.0 / 1000)
    flat = CostModel(dataclasses.replace(PRESETS[SEEDS], batch=4, topk=2))
    assert flat.draft_ms == pytest.approx(3 * 220.0 / 1000)
    # with an extend table the first draft is the extend at the batch (900 + 3 x 50 us), as before
    extended = CostModel(dataclasses.replace(tree.cfg, draft_extend_us_by_batch={1: 900.0, 8: 1250.0}))
    assert extended.draft_ms == pytest.approx((1050.0 + 2 * 980.0) / 1000)


def test_the_printed_draft_line_adds_up_for_a_tree(tmp_path, capsys):
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"draft_step_us": 700.0, "draft_step_us_by_batch": {"1": 700.0, "8": 980.0}}))
    assert main(["costmodel", "--inputs", str(bench), "--batch", "4", "--topk", "2"]) == 0
    assert "draft    = 820 us + 2 steps x 980 us = 2.78 ms" in capsys.readouterr().out


def test_a_sweep_row_without_a_topk_is_priced_as_a_chain(tmp_path, capsys):
    """A served eval whose server did not report its topk (config.topk null) is drafted as a chain; its
    row printed that null and the report died in a TypeError."""
    row = {"served_accept_len": 2.5, "config": {"steps": 3, "topk": None, "draft_tokens": None}}
    (priced,) = settings_table(PRESETS[SEEDS], [row])
    assert priced["topk"] == 1 and priced["draft_tokens"] == 3
    sweep = tmp_path / "sweep.json"
    sweep.write_text(json.dumps({"sweep": [row]}))
    assert main(["costmodel", "--inputs", str(sweep)]) == 0
    assert "--speculative-eagle-topk 1" in capsys.readouterr().out
