"""Mutation audit (review s76, h3) of the verify-step cost model: what surviving mutants showed no test pinned."""

from __future__ import annotations

import pytest

from drafter_lab.errors import LabError
from drafter_lab.spec.costmodel import (
    PRESETS,
    CostModel,
    CostModelConfig,
    check_fields,
    interpolate_linear,
    latency_at,
    on_allreduce,
)


def test_a_layer_compute_under_one_microsecond_is_priced_not_refused():
    """Only a layer compute at or below 0 is nonsense: a short one (a small target's layer, or a measured verify
    nearly all all-reduce) prices as it is."""
    measured = CostModel(CostModelConfig(num_layers=1, allreduces_per_layer=2, verify_allreduce_us=250.0,
                                         measured_verify_ms=0.5005))
    assert measured._layer_base_us == pytest.approx(0.5)
    assert measured.verify_ms() == pytest.approx(0.5005)
    # 82 us at 4 tokens, less 40.75 us for each of the 2 tokens this verify does not carry
    fewer = CostModel(CostModelConfig(verify_token_compute_us=40.75, verify_tokens=2, verify_compute_tokens=4))
    assert fewer.layer_compute_us == pytest.approx(0.5)
    assert fewer.verify_compute_ms == pytest.approx(61 * 0.5 / 1000)


def test_a_measured_verify_is_split_at_the_table_read_at_its_own_message():
    """One sequence's verify_compute_tokens x hidden x dtype bytes: 4 x 7168 x 2 = 57,344, between the table's
    16 KiB and 64 KiB points (not 14,336 bytes, nor below the table)."""
    table = {1024: 10.0, 16384: 20.0, 65536: 40.0, 262144: 80.0}
    at = latency_at(table, 57344)
    assert 20.0 < at < 40.0 and at != latency_at(table, 14336)
    cfg = on_allreduce(CostModelConfig(measured_verify_ms=30.0), table)
    assert cfg.measured_verify_ms == 0.0
    assert cfg.verify_layer_compute_us == pytest.approx((30_000 - 122 * at) / 61)
    # a split under one microsecond per layer is a short compute, not one shorter than its all-reduces
    short = on_allreduce(CostModelConfig(num_layers=1, measured_verify_ms=0.5005), 250.0)
    assert short.verify_layer_compute_us == pytest.approx(0.5)


def test_a_table_read_at_a_measured_point_is_that_measurement():
    """At a measured batch the table's own value, not one rebuilt from a segment (0.1 came back as
    0.09999999999999998)."""
    assert interpolate_linear({1: 0.1, 3: 0.7}, 1) == 0.1
    assert interpolate_linear({1: 0.7, 3: 0.1}, 3) == 0.1
    assert interpolate_linear({1: 0.7, 3: 0.1, 5: 0.9}, 3) == 0.1


def test_the_presets_accept_lengths_are_distinct_columns_in_order():
    """The report keys each column by its accept length: a repeated one collapsed two columns into one key."""
    accepts = PRESETS["seeds-kimi-k2.5-8x-pcie"].accept_lengths
    assert accepts == sorted(set(accepts)) == [1.5, 2.0, 2.5, 3.0, 3.5, 4.0]


@pytest.mark.parametrize("share", ["0.1", False, None])
def test_a_no_draft_share_that_is_no_number_is_one_line_from_python_too(share):
    """The CLI and --inputs check it as they read it; a CostModelConfig made in Python met `0 <= z < 1`
    alone: a str raised a TypeError traceback and False was taken as 0."""
    with pytest.raises(LabError, match=rf"^no_draft_share must be in \[0, 1\), got {share!r}$"):
        check_fields(CostModelConfig(no_draft_share=share))
