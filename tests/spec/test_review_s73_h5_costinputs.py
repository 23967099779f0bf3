"""Review s73 (h5): mutation audit of costinputs' accept lengths, eval settings and batches."""

from __future__ import annotations

import json

import pytest

from drafter_lab.errors import LabError
from drafter_lab.spec.costinputs import apply_inputs
from drafter_lab.spec.costmodel import PRESETS
from drafter_lab.train.metrics_log import BEST_FILE, METRICS

SEEDS = PRESETS["seeds-kimi-k2.5-8x-pcie"]


def _inputs(tmp_path, data):
    f = tmp_path / "eval.json"
    f.write_text(json.dumps(data))
    return f


def test_a_histogram_of_huge_whole_counts_prices_a_finite_accept_length(tmp_path):
    """Counts are summed as whole numbers: as floats, two of 1e308 summed to inf and the accept length read NaN."""
    f = _inputs(tmp_path, {"accept_histogram": {"1": 1e308, "3": 1e308}})
    assert apply_inputs(SEEDS, f)[0].accept_by_steps == [1.5, 2.0]


@pytest.mark.parametrize("text", ["[]", "3", '"best"'])
def test_a_best_record_that_is_no_object_is_one_line(tmp_path, text):
    """best.json holding no JSON object has no validation: `best.get` on it was an AttributeError."""
    (tmp_path / BEST_FILE).write_text(text)
    with pytest.raises(LabError) as e:
        apply_inputs(SEEDS, tmp_path)
    assert str(e.value) == f"{tmp_path}: best.json holds no validation: nothing to predict accept lengths from"


@pytest.mark.parametrize("key, value, span", [
    ("replay_accept_len_0", -0.5, ">= 0"), ("replay_accept_len_0", "x", ">= 0"), ("cond_acc_0", 1.5, "in [0, 1]"),
])
def test_a_predictor_out_of_range_names_its_range(tmp_path, key, value, span):
    """An accept length has no upper bound, an acceptance rate lies in [0, 1]: each message gives its own."""
    metrics = tmp_path / METRICS
    metrics.write_text(json.dumps({"split": "val", "step": 5, "positions": 40, "cond_acc_0": 0.5, key: value}) + "\n")
    with pytest.raises(LabError) as e:
        apply_inputs(SEEDS, tmp_path)
    assert str(e.value) == (f"{metrics}: its validation at step 5 has {key} {json.dumps(value)}, "
                            f"not a finite number {span}")


@pytest.mark.parametrize("in_flight", [[3.0], 3.0, "3"])
def test_a_served_eval_whose_in_flight_is_no_object_is_one_line(tmp_path, in_flight):
    """A hand-edited in_flight that is no object carries no requests: `.get` on it was an AttributeError."""
    f = _inputs(tmp_path, {"served_accept_len": 2.0, "in_flight": in_flight,
                           "config": {"steps": 3, "topk": 1, "request_rate": 2.0}})
    with pytest.raises(LabError) as e:
        apply_inputs(SEEDS, f)
    assert str(e.value) == (f"{f}: a served eval at a request rate needs in_flight.spec, the requests it carried "
                            "(a positive number), got None")
