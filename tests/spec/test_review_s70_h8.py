"""Review s70 (h8): every count of a cost model config is a whole number from Python too (as the flags and an
input file take them), and a measured verify_ms beside a `bench verify` pass table is refused as ambiguous."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from drafter_lab.cli import main
from drafter_lab.errors import LabError
from drafter_lab.spec.costinputs import apply_inputs
from drafter_lab.spec.costmodel import COUNTS, PRESETS, CostModel, on_allreduce
from drafter_lab.spec.costreport import batch_table, format_report, report

SEEDS = PRESETS["seeds-kimi-k2.5-8x-pcie"]
PASSES = {1: {1: 10.0, 4: 12.0}}


@pytest.mark.parametrize("name", [n for n in COUNTS if n != "allreduces_per_layer"])  # s70 h2 pins that one
@pytest.mark.parametrize("value", [2.5, 2.0])
def test_a_count_that_is_no_int_is_refused_from_python(name, value):
    """steps 2.5 priced 2.5 draft steps, batch 2.5 two and a half sequences: a float is no count, 2.0 neither
    (a file's 2.0 is refused as the flag's is)."""
    match = rf"^{name} must be a whole number > 0 \({COUNTS[name]}\), got {value}$"
    with pytest.raises(LabError, match=match):
        CostModel(dataclasses.replace(SEEDS, **{name: value}))
    with pytest.raises(LabError, match=match):  # a measured verify is split at its all-reduces first
        on_allreduce(dataclasses.replace(SEEDS, **{name: value}, measured_verify_ms=30.0), 100.0)


def test_each_count_names_what_it_counts_and_whole_counts_price():
    assert COUNTS["allreduces_per_layer"] == "all-reduces per layer"  # h2's message, kept
    m = CostModel(dataclasses.replace(SEEDS, steps=2, verify_tokens=3, batch=2, topk=1))
    assert (m.draft_ms, m.message_bytes) == (pytest.approx(0.44), 2 * 3 * 7168 * 2)


def test_a_file_count_of_two_point_zero_is_refused_as_pythons_is(tmp_path):
    """One rule everywhere: the file's deployment already refused 2.0 layers."""
    f = tmp_path / "in.json"
    f.write_text(json.dumps({"deployment": {"num_layers": 2.0}}))
    with pytest.raises(LabError, match=r"deployment.num_layers must be a positive integer, got 2.0$"):
        apply_inputs(SEEDS, f)


@pytest.mark.parametrize("batches", [[1, 2.5], [1, 2.0]])
def test_a_batch_table_row_that_is_no_int_is_refused(batches):
    """The batch table replaces the config's batch with each entry: 2.5 priced a row of 2.5 sequences."""
    cfg = dataclasses.replace(SEEDS, batches=batches)
    with pytest.raises(LabError, match=rf"^batches must hold whole numbers > 0 \(sequences\), got {re.escape(repr(batches))}$"):
        CostModel(cfg)
    with pytest.raises(LabError, match="^batches must hold whole numbers"):
        batch_table(cfg)
    assert [r["batch"] for r in batch_table(dataclasses.replace(SEEDS, batches=[1, 2]))] == [1, 2]


AMBIGUOUS = (r"^a measured verify_ms \(measured_verify_ms {}\) and a `bench verify` pass table \(verify_ms_by_tokens\) "
             "both price the verify: give one of them$")


@pytest.mark.parametrize("verify_ms", [40.0, 10.0])
def test_a_verify_ms_beside_a_pass_table_is_refused_whatever_its_size(verify_ms):
    """The table priced the verify: a 40 ms verify_ms beside it was ignored, a 10 ms one refused as shorter than
    its 122 all-reduces of 205 us. Both measure the one verify, so the pair is refused, at any size."""
    cfg = dataclasses.replace(SEEDS, pass_ms_by_tokens=PASSES, measured_verify_ms=verify_ms)
    with pytest.raises(LabError, match=AMBIGUOUS.format(f"{verify_ms:g}")):
        CostModel(cfg)
    with pytest.raises(LabError, match=AMBIGUOUS.format(f"{verify_ms:g}")):  # not split at a measured all-reduce
        on_allreduce(cfg, 28.8)


def test_either_measurement_alone_still_prices_the_verify():
    assert CostModel(dataclasses.replace(SEEDS, pass_ms_by_tokens=PASSES)).verify_compute_ms == pytest.approx(12.0)
    m = CostModel(dataclasses.replace(SEEDS, measured_verify_ms=40.0))
    assert m.verify_ms() == pytest.approx(40.0)


def test_two_inputs_measuring_the_verify_are_refused_on_the_command_line(tmp_path, capsys):
    passes, whole = tmp_path / "verify.json", tmp_path / "whole.json"
    passes.write_text(json.dumps({"decode_ms": 10.0, "verify_ms_by_tokens": {"1": {"1": 10.0, "4": 12.0}}}))
    whole.write_text(json.dumps({"verify_ms": 10.0}))
    assert main(["costmodel", "--inputs", str(passes), "--inputs", str(whole)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: a measured verify_ms (measured_verify_ms 10) and a `bench verify` pass table")
    assert err.count("\n") == 1
    assert main(["costmodel", "--inputs", str(passes), "--measured-verify-ms", "40"]) == 2  # the flag's, named
    assert capsys.readouterr().err.startswith("error: a measured verify_ms (--measured-verify-ms 40) and")


def test_the_batch_table_beside_a_pass_table_does_not_claim_the_per_token_field():
    """The table prices every pass: the header said "0 us of compute per layer per further token", which
    priced nothing (and read as flat compute)."""
    cfg = dataclasses.replace(SEEDS, pass_ms_by_tokens=PASSES, batches=[1, 2], verify_token_compute_us=3.0)
    text = format_report(report(cfg), "passes")
    assert "B-fold, each pass read from the measured pass table)" in text and "per further token" not in text
    priced = format_report(report(dataclasses.replace(cfg, pass_ms_by_tokens={})), "fields")
    assert "B-fold, 3 us of compute per layer per further token)" in priced
