"""Mutation audit (review s76, h3) of the cost report: what surviving mutants showed no test pinned."""

from __future__ import annotations

from drafter_lab.spec.costmodel import CostModelConfig
from drafter_lab.spec.costreport import format_report, report


def _batch_heading(cfg: CostModelConfig) -> str:
    lines = format_report(report(cfg), "x").splitlines()
    return next(line for line in lines if line.startswith("batch: "))


def test_the_batch_table_says_what_grows_the_verify():
    """Per-token compute prices a larger batch's verify, unless a measured pass table does (the field unused)."""
    flat = _batch_heading(CostModelConfig(batches=[1, 2], verify_token_compute_us=1.5))
    assert flat.endswith("grow B-fold, 1.5 us of compute per layer per further token)")
    passes = {1: {1: 5.0, 4: 6.0}, 2: {1: 5.5, 4: 7.0}}
    measured = _batch_heading(CostModelConfig(batches=[1, 2], verify_token_compute_us=1.5, pass_ms_by_tokens=passes))
    assert measured.endswith("grow B-fold, each pass read from the measured pass table)")
