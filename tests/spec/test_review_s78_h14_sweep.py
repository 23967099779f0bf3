"""Mutation audit of spec/sweep.py (session 78, h14): format_sweep prints a table for any number of rows, one
included (it read a second row to learn whether the sweep was served)."""

from __future__ import annotations

from drafter_lab.spec.sweep import format_sweep


def test_a_one_row_table_prints_and_names_the_machine_as_its_speed():
    row = {"config": {"steps": 2, "topk": 1, "draft_tokens": 2, "batch": 1}, "served_accept_len": 2.0,
           "spec_tok_s": 15.0, "baseline_tok_s": 10.0, "speedup": 1.5}
    lines = format_sweep([row]).splitlines()
    assert len(lines) == 4  # head, rule, the row, the speed note: one drafting setting has no "fastest"
    assert lines[2].split("|")[1].split() == ["2.000", "15.0", "10.0", "1.50x", "-"]
    assert lines[-1] == "(this machine's speed; `costmodel --inputs` prices the settings on a deployment)"
