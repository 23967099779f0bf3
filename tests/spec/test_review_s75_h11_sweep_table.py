"""Mutation audit of spec/sweep.py (session 75, h11): a local sweep's table has no request-rate column (a
served sweep's arrivals), and its rows line up under the header."""

from __future__ import annotations

from drafter_lab.spec.sweep import format_sweep


def _row(steps: int, speedup: float) -> dict:
    return {"config": {"steps": steps, "topk": 1, "draft_tokens": steps, "batch": 1}, "served_accept_len": 2.0,
            "spec_tok_s": 10.0 * speedup, "baseline_tok_s": 10.0, "speedup": speedup}


def test_a_local_sweeps_table_has_no_request_rate_column():
    head, rule, *rows = format_sweep([_row(2, 1.5), _row(4, 1.2)]).splitlines()
    assert head.split("|")[0].split() == ["steps", "topk", "draft", "tokens", "batch"]
    assert rule == "-" * len(head)
    assert [r.index("|") for r in rows[:2]] == [head.index("|")] * 2
    assert rows[0].split("|")[0].split() == ["2", "1", "2", "1"]
