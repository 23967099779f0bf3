"""Review s72 (h6): a measured table's keys are whole numbers, each named once ("8" beside "08" silently kept one
of the two values), and an error shows a long key cut to its ends (a 4301-digit batch was printed whole)."""

from __future__ import annotations

import json
import re

import pytest

from drafter_lab.errors import LabError
from drafter_lab.spec.costinputs import apply_inputs
from drafter_lab.spec.costmodel import PRESETS

SEEDS = PRESETS["seeds-kimi-k2.5-8x-pcie"]


def _inputs(tmp_path, data):
    f = tmp_path / "bench.json"
    f.write_text(json.dumps(data))
    return f


@pytest.mark.parametrize("data, name", [
    ({"draft_step_us_by_batch": {"8": 100.0, "08": 200.0}}, "draft_step_us_by_batch"),
    ({"draft_extend_us_by_batch": {"8": 100.0, "08": 200.0}}, "draft_extend_us_by_batch"),
    ({"allreduce_us": {"8": 20.0, "08": 30.0}}, "allreduce_us table"),
    ({"verify_ms_by_tokens": {"8": {"1": 2.0}, "08": {"1": 3.0}}}, "verify_ms_by_tokens"),
    ({"verify_ms_by_tokens": {"1": {"8": 2.0, "08": 3.0}}}, r"verify_ms_by_tokens\[1\]"),
    ({"accept_histogram": {"1": 5, "8": 2, "08": 3}}, "accept_histogram"),
], ids=["draft-step", "draft-extend", "allreduce", "pass-batch", "pass-tokens", "histogram"])
def test_a_table_naming_one_number_twice_is_refused(tmp_path, data, name):
    f = _inputs(tmp_path, data)
    with pytest.raises(LabError, match=rf"^{re.escape(str(f))}: {name} has keys '8' and '08', both 8: one would "
                                       "silently replace the other$"):
        apply_inputs(SEEDS, f)


def test_tables_whose_keys_are_each_one_number_still_read(tmp_path):
    f = _inputs(tmp_path, {"draft_step_us_by_batch": {"1": 100.0, "08": 200.0}, "allreduce_us": {"08": 20.0},
                           "verify_ms_by_tokens": {"1": {"08": 2.0}, "08": {"1": 3.0}}})
    cfg, allreduce = apply_inputs(SEEDS, f)
    assert cfg.draft_step_us_by_batch == {1: 100.0, 8: 200.0}
    assert cfg.pass_ms_by_tokens == {1: {8: 2.0}, 8: {1: 3.0}}
    assert allreduce == {8: 20.0}
    f = _inputs(tmp_path, {"accept_histogram": {"1": 1, "03": 1}})
    assert apply_inputs(SEEDS, f)[0].accept_by_steps == [1.5, 2.0]


def test_a_batch_past_ints_digits_is_named_by_its_ends(tmp_path):
    """int() refuses 4301 digits: the batch is no whole number it can read, and the message was 4400 characters."""
    key = "1" + "0" * 4299 + "7"
    f = _inputs(tmp_path, {"draft_step_us_by_batch": {key: 100.0}})
    with pytest.raises(LabError) as e:
        apply_inputs(SEEDS, f)
    assert str(e.value) == (f"{f}: draft_step_us_by_batch must map batch sizes to microseconds: batch '100000000...00007' "
                            "(4301 characters) is no whole number of sequences")


@pytest.mark.parametrize("data, label", [
    ({"draft_step_us_by_batch": {"1" + "0" * 399: -1.0}}, "draft_step_us_by_batch[1000000000...000000 (400 characters)]"),
    ({"allreduce_us": {"1" + "0" * 399: -1.0}}, "allreduce_us[1000000000...000000 (400 characters)]"),
    ({"verify_ms_by_tokens": {"1" * 30: {"2" * 30: -1.0}}},
     "verify_ms_by_tokens[1111111111...111111 (30 characters)][2222222222...222222 (30 characters)]"),
    ({"draft_step_us_by_batch": {"1" * 24: -1.0}}, f"draft_step_us_by_batch[{'1' * 24}]"),  # 24 digits: shown whole
    ({"draft_step_us_by_batch": {"1" * 25: -1.0}}, "draft_step_us_by_batch[1111111111...111111 (25 characters)]"),
], ids=["draft-step", "allreduce", "pass", "short", "just-long"])
def test_a_long_keys_bad_value_names_the_key_by_its_ends(tmp_path, data, label):
    f = _inputs(tmp_path, data)
    with pytest.raises(LabError) as e:
        apply_inputs(SEEDS, f)
    assert str(e.value) == f"{f}: {label} must be a positive number, got -1.0"
