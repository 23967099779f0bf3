"""Review s71 (h6): a `bench verify` pass table prices the verify, so the per-layer compute it replaces is not
refused; a draft table's batch sizes are whole numbers of sequences, from a file or from Python, as `batches`'
entries are (1.5 was a point of its own, or read as 1)."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from drafter_lab.errors import LabError
from drafter_lab.spec.costinputs import apply_inputs, drafting, fold
from drafter_lab.spec.costmodel import PRESETS, CostModel
from drafter_lab.spec.costreport import steps_table

SEEDS = PRESETS["seeds-kimi-k2.5-8x-pcie"]
PASSES = {1: {1: 10.0, 4: 12.0}}
TABLES = ["draft_step_us_by_batch", "draft_extend_us_by_batch"]


def test_a_pass_table_prices_a_verify_whose_per_layer_fields_come_to_no_compute():
    """82 us a layer less 50 us for each of 2 tokens below 4 is -18 us: refused, though the table priced the
    verify and the field was read nowhere."""
    cfg = dataclasses.replace(SEEDS, pass_ms_by_tokens=PASSES, verify_token_compute_us=50.0, verify_tokens=2,
                              steps=1, accept_by_steps=[1.8, 2.4])
    assert CostModel(cfg).verify_compute_ms == pytest.approx(10 + 2 / 3)
    assert [r["steps"] for r in steps_table(cfg)] == [1, 2]
    with pytest.raises(LabError, match="^verify compute per layer at 2 tokens comes to -18 us"):  # no table: kept
        CostModel(dataclasses.replace(cfg, pass_ms_by_tokens={}))


@pytest.mark.parametrize("name", TABLES)
@pytest.mark.parametrize("table", [{1: 100.0, 1.5: 150.0}, {2.0: 100.0}, {True: 100.0}, {0: 100.0},
                                   {1: float("nan")}, {10 ** 400: 100.0}],
                         ids=["half", "float-two", "bool", "zero", "nan", "huge"])
def test_a_draft_table_from_python_maps_whole_batches_to_times(name, table):
    with pytest.raises(LabError, match=rf"^{name} must map whole batch sizes \(>= 1\) to finite microseconds > 0, "
                                       rf"got {re.escape(repr(table))}$"):
        CostModel(dataclasses.replace(SEEDS, **{name: table}))


@pytest.mark.parametrize("name", TABLES)
def test_whole_draft_tables_from_python_still_price(name):
    m = CostModel(dataclasses.replace(SEEDS, batch=2, **{name: {1: 100.0, 4: 400.0}}))
    assert m.first_draft_us == pytest.approx(200.0)


@pytest.mark.parametrize("key", TABLES)
@pytest.mark.parametrize("batch", ["1.5", "2.0", "1_6", "x", " 2"])
def test_a_files_draft_table_batch_that_is_no_whole_number_is_named(tmp_path, cli_error, key, batch):
    """int() read "1_6" as 16 and " 2" as 2; "1.5" was refused without saying which batch."""
    f = tmp_path / "bench.json"
    f.write_text(json.dumps({key: {"1": 100.0, batch: 200.0}}))
    assert cli_error(["costmodel", "--inputs", str(f)]) == (
        f"error: {f}: {key} must map batch sizes to microseconds: batch {batch!r} is no whole number of sequences")


@pytest.mark.parametrize("key", TABLES)
@pytest.mark.parametrize("batch", [1.5, 2.0, True])
def test_a_python_callers_draft_table_batch_is_not_cut_to_an_int(tmp_path, key, batch):
    """int() read 1.5 (and True) as batch 1."""
    message = f"{tmp_path}: {key} must map batch sizes to microseconds: batch {batch!r} is no whole number of sequences"
    with pytest.raises(LabError, match=f"^{re.escape(message)}$"):
        drafting(SEEDS, {key: {batch: 200.0}}, tmp_path)


def test_a_files_whole_and_negative_batches_read_as_before(tmp_path):
    f = tmp_path / "bench.json"
    f.write_text(json.dumps({"draft_step_us_by_batch": {"1": 100.0, "08": 200.0}}))
    assert apply_inputs(SEEDS, f)[0].draft_step_us_by_batch == {1: 100.0, 8: 200.0}
    assert drafting(SEEDS, {"draft_step_us_by_batch": {1: 100.0}}, f).draft_step_us_by_batch == {1: 100.0}
    f.write_text(json.dumps({"draft_step_us_by_batch": {"-1": 100.0}}))
    with pytest.raises(LabError, match=r"draft_step_us_by_batch must map batch sizes \(>= 1\) to microseconds$"):
        apply_inputs(SEEDS, f)


@pytest.mark.parametrize("table", [{1.5: {1: 2.0}}, {1: {2.0: 2.0}}, {"1_6": {"1": 2.0}}, {"1": {"1_6": 2.0}}],
                         ids=["batch-float", "tokens-float", "batch-underscore", "tokens-underscore"])
def test_a_pass_table_key_that_is_no_whole_number_is_refused(tmp_path, table):
    with pytest.raises(LabError, match=r"^.*: verify_ms_by_tokens must map batch sizes to \{tokens per row: ms\}$"):
        fold(SEEDS, {"verify_ms_by_tokens": table}, tmp_path)


@pytest.mark.parametrize("key", ["1_6", " 16", 16.5, True], ids=["underscore", "space", "float", "bool"])
def test_an_allreduce_table_size_that_is_no_whole_number_of_bytes_is_refused(tmp_path, key):
    """int() read "1_6" as 16 bytes, 16.5 as 16 and True as 1."""
    with pytest.raises(LabError, match=r"allreduce_us table keys must be message sizes in bytes \(>= 1\)$"):
        fold(SEEDS, {"allreduce_us": {key: 30.0, "1048576": 90.0}}, tmp_path)
    assert fold(SEEDS, {"allreduce_us": {16: 30.0, "1048576": 90.0}}, tmp_path)[1] == {16: 30.0, 1048576: 90.0}


@pytest.mark.parametrize("length", ["1_2", " 3", 2.5, True], ids=["underscore", "space", "float", "bool"])
def test_an_accept_histogram_length_that_is_no_whole_number_is_refused(tmp_path, length):
    """int() read "1_2" as a served length of 12 and 2.5 as 2."""
    with pytest.raises(LabError, match="accept_histogram must map served accept lengths to counts$"):
        fold(SEEDS, {"accept_histogram": {"1": 3, length: 1}}, tmp_path)
