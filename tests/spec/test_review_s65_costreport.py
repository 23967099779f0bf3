"""Mutation audit (review s65) of the cost report: the settings table's all-reduce column, the batch
table's speedup at a measured all-reduce, the best depth, and the config a report records."""

from __future__ import annotations

import dataclasses

import pytest

from drafter_lab.spec.costmodel import PRESETS, CostModel
from drafter_lab.spec.costreport import (
    batch_table,
    best_row,
    format_report,
    report,
    settings_table,
    steps_table,
)

SEEDS = "seeds-kimi-k2.5-8x-pcie"
SWEEP = [{"served_accept_len": 2.5, "config": {"steps": 3, "topk": 1, "draft_tokens": 3, "batch": 1}}]


def test_a_settings_row_on_one_device_has_no_all_reduce_latency():
    """The column shows '-' where the verify has no all-reduce, not a latency that prices nothing."""
    one = dataclasses.replace(PRESETS[SEEDS], allreduces_per_layer=0)
    row = settings_table(one, SWEEP)[0]
    assert row["allreduce_us"] is None
    lines = format_report({**report(one), "settings": [row]}, "one device").splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("settings ("))
    assert lines[head + 2].split()[5] == "-"  # steps, topk, draft tokens, batch, accept, all-reduce us
    # with all-reduces, the config's own latency at no measured one
    tp = PRESETS[SEEDS]
    assert settings_table(tp, SWEEP)[0]["allreduce_us"] == tp.verify_allreduce_us


def test_the_batch_tables_speedup_is_against_plain_decoding_at_the_same_all_reduce():
    cfg = dataclasses.replace(PRESETS[SEEDS], batches=[1, 4])
    for row in batch_table(cfg, 20.0):  # faster than the preset's decode all-reduce: plain decoding gains too
        for a, tok_s in row["spec_tok_s"].items():
            assert row["speedup"][a] == pytest.approx(tok_s / row["baseline_tok_s"])
        assert row["baseline_tok_s"] == pytest.approx(CostModel(dataclasses.replace(cfg, batch=row["batch"]))
                                                      .baseline_tok_s(20.0))
        assert row["baseline_tok_s"] > CostModel(dataclasses.replace(cfg, batch=row["batch"])).baseline_tok_s()


def test_the_best_depth_is_the_fastest_not_the_deepest():
    rows = [{"steps": 1, "spec_tok_s": 3.0}, {"steps": 2, "spec_tok_s": 5.0}, {"steps": 3, "spec_tok_s": 4.0}]
    assert best_row(rows)["steps"] == 2 and best_row([]) is None
    # accept lengths that grow less than a step costs: a middle depth wins, and the report says so
    cfg = dataclasses.replace(PRESETS[SEEDS], accept_by_steps=[1.8, 2.6, 2.65, 2.66])
    table = steps_table(cfg)
    fastest = max(table, key=lambda r: r["spec_tok_s"])["steps"]
    assert fastest < len(table)
    r = report(cfg)
    assert r["best_steps"]["steps"] == fastest
    assert f"best: {fastest} steps," in format_report(r, SEEDS)


def test_a_report_records_the_config_as_given_not_as_split_at_the_measured_all_reduce():
    """A measured verify is split at the measured all-reduce for pricing; the config written beside the
    figures is the one the inputs gave, so it can be priced again."""
    cfg = dataclasses.replace(PRESETS[SEEDS], measured_verify_ms=40.0)
    r = report(cfg, 30.0)
    assert r["config"]["measured_verify_ms"] == 40.0
    assert r["config"]["verify_layer_compute_us"] == cfg.verify_layer_compute_us


def test_the_best_setting_of_a_sweep_is_its_fastest_at_each_batch():
    sweep = [{"served_accept_len": a, "config": {"steps": s, "topk": 1, "draft_tokens": s, "batch": b}}
             for s, a, b in ((2, 2.2, 1), (4, 3.4, 1), (6, 3.5, 1), (2, 2.2, 4), (4, 3.4, 4))]
    cfg = PRESETS[SEEDS]
    rows = settings_table(cfg, sweep)
    text = format_report({**report(cfg), "settings": rows}, SEEDS)
    for b in (1, 4):
        best = max((r for r in rows if r["batch"] == b), key=lambda r: r["spec_tok_s"])
        worst = min((r for r in rows if r["batch"] == b), key=lambda r: r["spec_tok_s"])
        assert best is not worst
        assert f"best at batch {b}: steps {best['steps']}, topk 1, draft tokens {best['draft_tokens']}, " \
               f"{best['spec_tok_s']:.1f} tok/s" in text


def test_the_draft_line_counts_the_extend_as_the_first_of_the_steps():
    """With a measured draft extend a cycle runs the extend, then steps - 1 draft steps."""
    cfg = dataclasses.replace(PRESETS[SEEDS], steps=3, verify_tokens=4, draft_step_us_by_batch={1: 100.0},
                              draft_extend_us_by_batch={1: 400.0})
    m = CostModel(cfg)
    assert m.draft_ms == pytest.approx((400.0 + 2 * 100.0) / 1000)
    assert "  draft    = extend 400 us + 2 steps x 100 us = 0.60 ms;" in format_report(report(cfg), SEEDS)


def test_serving_flags_name_vllm_only_for_a_chain():
    """vLLM drafts chains alone: a tree's best setting gets SGLang's flags, without a vLLM line."""
    sweep = [{"served_accept_len": 3.0, "config": {"steps": 3, "topk": t, "draft_tokens": d, "batch": 1}}
             for t, d in ((1, 3), (4, 8))]
    cfg = PRESETS[SEEDS]
    for best in settings_table(cfg, sweep):
        text = format_report({**report(cfg), "settings": [best]}, SEEDS)
        best_line = next(line for line in text.splitlines() if line.startswith("best: steps"))
        sglang = (f"in SGLang --speculative-num-steps 3 --speculative-eagle-topk {best['topk']} "
                  f"--speculative-num-draft-tokens {best['draft_tokens'] + 1}")
        assert best_line.endswith(sglang if best["topk"] > 1 else sglang + ", in vLLM num_speculative_tokens 3")


def test_a_batched_verify_line_counts_the_other_sequences():
    cfg = dataclasses.replace(PRESETS[SEEDS], batch=4, verify_tokens=4)
    assert "for the batch's other 3 x 4 tokens)" in format_report(report(cfg), SEEDS)


def test_the_draft_line_gives_the_share_of_cycles_without_a_draft_in_percent():
    cfg = dataclasses.replace(PRESETS[SEEDS], no_draft_share=0.25)
    assert "; 25 % of cycles draft nothing and decode plainly" in format_report(report(cfg), SEEDS)


@pytest.mark.parametrize("share, shown", [(0.004, "0.4 %"), (0.00012, "0.01 %"), (0.0049, "0.5 %"), (0.0051, "1 %")])
def test_a_share_of_cycles_without_a_draft_too_small_for_whole_percent_keeps_a_figure(share, shown):
    """Some cycles without a draft is not none: under 0.5 % the share keeps one significant figure."""
    cfg = dataclasses.replace(PRESETS[SEEDS], no_draft_share=share)
    assert f"; {shown} of cycles draft nothing and decode plainly" in format_report(report(cfg), SEEDS)
