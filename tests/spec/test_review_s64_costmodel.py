"""Mutation audit (review s64) of the verify-step cost model: the refusals' boundaries, a measured
pass table's lookups, the per-token compute's reference, the decode step's host work."""

from __future__ import annotations

import dataclasses

import pytest

from drafter_lab.errors import LabError
from drafter_lab.spec.costmodel import (
    PRESETS,
    CostModel,
    CostModelConfig,
    check_fields,
    on_allreduce,
    us_text,
)

SEEDS = PRESETS["seeds-kimi-k2.5-8x-pcie"]


def test_a_served_accept_length_of_one_is_allowed_and_a_bool_is_no_count():
    """1 is a drafter that never hit (the bonus token alone): a valid column. True is no layer count."""
    check_fields(dataclasses.replace(SEEDS, accept_lengths=[1.0], accept_by_steps=[1.0, 1.0]))
    with pytest.raises(LabError, match="num_layers must be a finite number > 0, got True"):
        check_fields(dataclasses.replace(SEEDS, num_layers=True))


def test_every_cycle_without_a_draft_is_refused():
    """no_draft_share 1 would price a drafter that never drafts as speculation."""
    with pytest.raises(LabError, match=r"no_draft_share must be in \[0, 1\), got 1.0"):
        check_fields(dataclasses.replace(SEEDS, no_draft_share=1.0))


# one layer, two all-reduces of 500 us: a 1 ms verify is all-reduce and nothing else
ZERO = dict(num_layers=1, allreduces_per_layer=2, verify_allreduce_us=500.0)


@pytest.mark.parametrize("fields, match", [
    (dict(ZERO, measured_verify_ms=1.0), "the measured verify_ms 1 is shorter than its 2 all-reduces"),
    (dict(verify_layer_compute_us=30.0, verify_token_compute_us=10.0, verify_tokens=1),
     "verify compute per layer at 1 tokens comes to 0 us"),
    (dict(ZERO, decode_ms=1.0, decode_allreduce_us=500.0), "take longer than the whole decode step"),
])
def test_a_pass_with_no_compute_left_is_refused(fields, match):
    """Exactly zero compute is refused as a negative one is: the measurement is all-reduce alone."""
    with pytest.raises(LabError, match=match):
        CostModel(dataclasses.replace(SEEDS, **fields))


def test_a_measured_verify_split_at_a_measured_allreduce_leaving_no_compute_is_refused():
    cfg = dataclasses.replace(SEEDS, **ZERO, measured_verify_ms=1.0, verify_compute_tokens=4)
    with pytest.raises(LabError, match="shorter than its 2 all-reduces of 500 us"):
        on_allreduce(cfg, 500.0)


def test_a_measured_pass_table_is_read_at_the_verify_tokens_and_at_one_for_a_decode():
    """Linear in tokens per row, then in batch; no per-layer field enters."""
    table = {1: {1: 10.0, 4: 16.0}, 2: {1: 12.0, 4: 24.0}}
    m = CostModel(dataclasses.replace(SEEDS, pass_ms_by_tokens=table, verify_tokens=3))
    assert (m.verify_compute_ms, m.decode_compute_ms) == (pytest.approx(14.0), pytest.approx(10.0))
    m2 = CostModel(dataclasses.replace(m.cfg, batch=2, verify_tokens=4))
    assert (m2.verify_compute_ms, m2.decode_compute_ms) == (pytest.approx(24.0), pytest.approx(12.0))
    assert CostModel(dataclasses.replace(m.cfg, batch=3)).verify_compute_ms == pytest.approx(20.0 + 6.0)  # 14, 20, extended


def test_per_token_compute_counts_from_the_measured_verify_tokens():
    """verify_layer_compute_us holds at verify_compute_tokens (8 here), not at the preset's 4."""
    cfg = CostModelConfig(verify_layer_compute_us=100.0, verify_token_compute_us=5.0, verify_compute_tokens=8,
                          verify_tokens=6)
    assert CostModel(cfg).layer_compute_us == pytest.approx(90.0)


def test_a_plain_decode_step_adds_its_host_work():
    base = CostModel(SEEDS)
    m = CostModel(dataclasses.replace(SEEDS, decode_overhead_ms=2.0))
    assert m.decode_ms() == pytest.approx(base.decode_ms() + 2.0)
    assert m.baseline_tok_s() == pytest.approx(1000 / (base.decode_ms() + 2.0))
    assert m.break_even() < base.break_even()  # a slower baseline is easier to beat


def test_a_latency_rounding_up_to_a_thousand_is_shown_whole():
    """.3g wrote 999.7 us as 1e+03."""
    assert (us_text(999.7), us_text(205.0), us_text(99.96), us_text(28.84)) == ("1000", "205", "100", "28.8")
