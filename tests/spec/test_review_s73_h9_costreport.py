"""Mutation audit (review s73 h9) of the cost report: a sweep priced at a measured all-reduce splits a
measured verify at it, as the headline does."""

from __future__ import annotations

import dataclasses

import pytest

from drafter_lab.spec.costmodel import PRESETS
from drafter_lab.spec.costreport import format_report, report, settings_table

SEEDS = "seeds-kimi-k2.5-8x-pcie"
SWEEP = [{"served_accept_len": 2.5, "config": {"steps": 3, "topk": 1, "draft_tokens": 3, "batch": 1}}]


def test_a_sweep_row_at_the_measured_pass_reproduces_it():
    """A measured 30 ms verify of 4 tokens, beside a measured 28.8 us all-reduce: the row verifying those
    4 tokens takes the 30 ms, as the headline does (split at the config's 205 us, then priced at 28.8 us,
    it came to less)."""
    cfg = dataclasses.replace(PRESETS[SEEDS], measured_verify_ms=30.0)
    assert cfg.verify_compute_tokens == 4 and cfg.verify_allreduce_us == 205.0
    (row,) = settings_table(cfg, SWEEP, 28.8)
    assert row["verify_ms"] == pytest.approx(30.0) == report(cfg, 28.8)["verify_ms"]
    assert row["allreduce_us"] == 28.8


def test_the_what_if_gives_the_verify_message_in_kib():
    """16 sequences x 4 tokens x hidden 7168 x 2 bytes = 917504 bytes, 896 KiB."""
    cfg = dataclasses.replace(PRESETS[SEEDS], batch=16)
    assert (cfg.verify_tokens, cfg.hidden_size, cfg.dtype_bytes) == (4, 7168, 2)
    assert "; verify message 896 KiB" in format_report(report(cfg), SEEDS)


def test_each_what_if_row_gives_its_own_best_depth():
    """A slow all-reduce makes a deeper draft pay (3 steps at 200 us), a fast one a shallower (2 at 8 us);
    without accept_by_steps the column is left out."""
    cfg = dataclasses.replace(PRESETS[SEEDS], accept_by_steps=[1.8, 2.6, 2.65], accept_lengths=[2.0],
                              whatif_allreduce_us=[200.0, 8.0])
    lines = format_report(report(cfg), SEEDS).splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("what-if:")) + 1
    assert lines[head:head + 4] == [
        "        all-reduce verify ms base tok/s break-even |             A=2 |          best steps",
        "-" * 90,
        "            200 us     29.40       82.0       2.50 |    65.6 (0.80x) |  3:   86.9 (1.06x)",
        "              8 us      5.98      167.4       1.18 |   283.0 (1.69x) |  2:  379.7 (2.27x)",
    ]
    lines = format_report(report(dataclasses.replace(cfg, accept_by_steps=[])), SEEDS).splitlines()
    assert lines[head:head + 3] == [
        "        all-reduce verify ms base tok/s break-even |             A=2",
        "-" * 68,
        "            200 us     29.40       82.0       2.50 |    65.6 (0.80x)",
    ]


def test_a_batch_of_two_is_priced_and_told_as_a_batch():
    """The other sequence's 4 tokens at 1.3 us each add 5.2 us to each of the 61 layers: (82 + 5.2) x 61 us
    of compute and 122 all-reduces of 205 us, 30.33 ms; one sequence is no batch."""
    cfg = dataclasses.replace(PRESETS[SEEDS], verify_token_compute_us=1.3)
    lines = format_report(report(dataclasses.replace(cfg, batch=2)), SEEDS).splitlines()
    assert lines[:2] == [
        f"cost model: {SEEDS} (batch 2: tok/s counts all 2 sequences)",
        "  verify   = 61 layers x 82 us compute (+ 5.2 us for the batch's other 1 x 4 tokens) + 122 all-reduces x 205 us"
        " = 30.33 ms",
    ]
    lines = format_report(report(cfg), SEEDS).splitlines()
    assert lines[:2] == [f"cost model: {SEEDS}", "  verify   = 61 layers x 82 us compute + 122 all-reduces x 205 us = 30.01 ms"]


def test_the_best_depth_line():
    """The chain's serving flags (top-1, draft tokens counting the root in SGLang); 'still slower' only
    below plain decoding, and a depth exactly as fast is not slower. The table's head names the
    all-reduce it priced: the config's, the measured one, or none on one device."""
    cfg = dataclasses.replace(PRESETS[SEEDS], accept_by_steps=[1.8, 2.6, 2.65], accept_lengths=[2.0])
    r = report(cfg)
    assert 1 < r["best_steps"]["speedup"] < 2
    lines = format_report(r, SEEDS).splitlines()
    assert lines[-1] == ("best: 3 steps, 85.2 tok/s; in SGLang --speculative-num-steps 3 --speculative-eagle-topk 1 "
                         "--speculative-num-draft-tokens 4, in vLLM num_speculative_tokens 3")
    r["best_steps"]["speedup"] = 1.0
    assert format_report(r, SEEDS).splitlines()[-1] == lines[-1]
    r["best_steps"]["speedup"] = 0.99
    assert format_report(r, SEEDS).splitlines()[-1].endswith(
        f"; still slower than plain decoding ({r['baseline_tok_s']:.1f} tok/s) at every depth")
    head = "draft steps (chain; served accept at each depth, accept_by_steps; verify = steps + 1 tokens"
    assert f"{head}, 205 us per all-reduce):" in lines
    assert f"{head}; the measured all-reduce at each depth's message):" in format_report(report(cfg, 28.8), SEEDS).splitlines()
    one = format_report(report(dataclasses.replace(cfg, allreduces_per_layer=0)), SEEDS).splitlines()
    assert f"{head}):" in one


@pytest.mark.parametrize("allreduces, overhead, tail", [
    (2, 0.0, "12.20 ms per decode step = 82.0 tok/s (its all-reduces: 59 us each)"),
    (2, 0.5, "12.70 ms per decode step = 78.8 tok/s (its all-reduces: 59 us each; overhead 0.50 ms)"),
    (0, 0.0, "12.20 ms per decode step = 82.0 tok/s"),
    (0, 0.5, "12.70 ms per decode step = 78.8 tok/s (overhead 0.50 ms)"),
])
def test_the_baseline_line_notes_only_what_it_has(allreduces, overhead, tail):
    cfg = dataclasses.replace(PRESETS[SEEDS], allreduces_per_layer=allreduces, decode_overhead_ms=overhead)
    assert f"  baseline = {tail}" in format_report(report(cfg), SEEDS).splitlines()


def test_the_batch_table_only_with_batches():
    cfg = PRESETS[SEEDS]
    assert cfg.batches == []
    has_table = ["batch: the same drafting" in format_report(report(dataclasses.replace(cfg, batches=b)), SEEDS)
                 for b in ([], [1, 4])]
    assert has_table == [False, True]


@pytest.mark.parametrize("share, tail", [(0.0, ""), (0.6, "; 60 % of cycles draft nothing and decode plainly")])
def test_the_draft_line(share, tail):
    """A chain drafts its steps alike (no first-draft cost of its own); the share of cycles that draft
    nothing shows only where there is one."""
    cfg = dataclasses.replace(PRESETS[SEEDS], no_draft_share=share)
    assert format_report(report(cfg), SEEDS).splitlines()[2] == (
        f"  draft    = 3 steps x 220 us = 0.66 ms; overhead 0.43 ms; cycle = 31.10 ms{tail}")


def test_one_device_has_no_what_if_table():
    lines = format_report(report(dataclasses.replace(PRESETS[SEEDS], allreduces_per_layer=0)), SEEDS).splitlines()
    assert "what-if: none (no all-reduce in the verify step: allreduces_per_layer 0)" in lines
    assert not any(line.startswith("what-if: spec tok/s") for line in lines)


def test_a_settings_row_shows_its_all_reduce():
    cfg = PRESETS[SEEDS]
    lines = format_report({**report(cfg), "settings": settings_table(cfg, SWEEP)}, SEEDS).splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("settings ("))
    assert lines[head + 2] == "    3    1            3     1   2.50           205     30.01    31.10       80.4   0.98x"
