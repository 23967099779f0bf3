"""Review s71 (h6): a `bench verify` pass table given from Python is checked as a file's is: an empty row was an
IndexError, a NaN pass priced NaN tok/s, and batch 1.5 or 0 a point of its own."""

from __future__ import annotations

import dataclasses
import re

import pytest

from drafter_lab.errors import LabError
from drafter_lab.spec.costmodel import PRESETS, CostModel

SEEDS = PRESETS["seeds-kimi-k2.5-8x-pcie"]


@pytest.mark.parametrize("table", [{1: {}}, {1.5: {4: 3.0}}, {0: {4: 3.0}}, {True: {4: 3.0}}, {1: {4.0: 3.0}},
                                   {1: {0: 3.0}}, {1: {4: float("nan")}}, {1: {4: -3.0}}, {1: {4: True}}],
                         ids=["empty-row", "batch-half", "batch-zero", "batch-bool", "tokens-float", "tokens-zero",
                              "nan", "negative", "bool-ms"])
def test_a_pass_table_from_python_maps_whole_batches_and_tokens_to_times(table):
    message = ("pass_ms_by_tokens must map whole batch sizes (>= 1) to {whole tokens per row (>= 1): finite ms > 0}, "
               f"got {table!r}")
    with pytest.raises(LabError, match=f"^{re.escape(message)}$"):
        CostModel(dataclasses.replace(SEEDS, pass_ms_by_tokens=table))


def test_a_whole_pass_table_from_python_still_prices():
    m = CostModel(dataclasses.replace(SEEDS, pass_ms_by_tokens={1: {1: 10.0, 4: 12.0}, 2: {1: 11.0}}))
    assert (m.verify_compute_ms, m.decode_compute_ms) == (pytest.approx(12.0), pytest.approx(10.0))


@pytest.mark.parametrize("name", ["draft_step_us_by_batch", "draft_extend_us_by_batch"])
def test_a_draft_table_time_of_zero_is_refused_and_one_below_a_microsecond_prices(name):
    with pytest.raises(LabError, match=f"^{name} must map whole batch sizes"):
        CostModel(dataclasses.replace(SEEDS, **{name: {1: 0.0}}))
    assert CostModel(dataclasses.replace(SEEDS, **{name: {1: 0.5}})).first_draft_us == 0.5


def test_a_pass_of_zero_ms_is_refused_and_one_below_a_millisecond_prices():
    with pytest.raises(LabError, match="^pass_ms_by_tokens must map whole batch sizes"):
        CostModel(dataclasses.replace(SEEDS, pass_ms_by_tokens={1: {1: 0.0}}))
    assert CostModel(dataclasses.replace(SEEDS, pass_ms_by_tokens={1: {1: 0.5}})).decode_compute_ms == 0.5


def test_accept_by_steps_as_deep_as_any_engine_drafts_prices_from_python():
    from drafter_lab.spec.costmodel import MAX_DRAFT_STEPS

    deep = [1.5] * MAX_DRAFT_STEPS
    assert CostModel(dataclasses.replace(SEEDS, accept_by_steps=deep)).cfg.accept_by_steps == deep
    with pytest.raises(LabError, match=f"^accept_by_steps lists {MAX_DRAFT_STEPS + 1} depths"):
        CostModel(dataclasses.replace(SEEDS, accept_by_steps=[*deep, 1.5]))


def test_a_measured_verify_leaving_under_a_microsecond_of_compute_a_layer_prices():
    """Only no compute at all is refused: half a microsecond a layer is a (tiny) measurement."""
    m = CostModel(dataclasses.replace(SEEDS, num_layers=1, allreduces_per_layer=2, verify_allreduce_us=500.0,
                                      measured_verify_ms=1.0005))
    assert m.layer_compute_us == pytest.approx(0.5)
