"""Mutation audit (review s66, h4) of the cost model and its measured inputs: refusals and numbers that
surviving mutants showed no test pinned."""

from __future__ import annotations

import json

import pytest

from drafter_lab.errors import LabError
from drafter_lab.spec.costinputs import apply_inputs, predicted_by_steps, read_inputs
from drafter_lab.spec.costmodel import (
    PRESETS,
    CostModel,
    CostModelConfig,
    check_fields,
    interpolate_linear,
    on_allreduce,
)
from drafter_lab.train.metrics_log import BEST_FILE, METRICS

SEEDS = "seeds-kimi-k2.5-8x-pcie"


def _fold(tmp_path, content):
    f = tmp_path / "in.json"
    f.write_text(json.dumps(content))
    return f, apply_inputs(PRESETS[SEEDS], f)


@pytest.mark.parametrize("content, match", [
    # a step that emitted nothing is no verify step: it would pull the accept length at every depth down
    ({"accept_histogram": {"0": 3, "2": 1}}, "served accept length of 0: each verify step emits at least 1"),
    # batch 0 as a table's first point priced every batch at or below it
    ({"draft_step_us_by_batch": {"0": 5, "4": 9}}, "draft_step_us_by_batch must map batch sizes \\(>= 1\\)"),
    ({"draft_extend_us_by_batch": {"0": 5}}, "draft_extend_us_by_batch must map batch sizes \\(>= 1\\)"),
    # a field the deployment does not set (the eval's settings do): taken silently, it replaced the eval's
    ({"deployment": {"verify_tokens": 8}}, "deployment must be an object with some of num_layers"),
    # a batch without a measured pass: an IndexError when the table was read
    ({"verify_ms_by_tokens": {"1": {"1": 2.0}, "2": {}}}, "verify_ms_by_tokens must map batch sizes"),
    # JSON true is no measurement: read as 1 ms
    ({"decode_ms": True}, "decode_ms must be a positive number, got True"),
    # "x" + 1 verify tokens was a TypeError; 0 read as no draft_tokens
    ({"served_accept_len": 2.0, "config": {"steps": 3, "draft_tokens": "x"}},
     "config.draft_tokens must be a positive integer, got 'x'"),
    # a batch's row that is no {tokens: ms}: an AttributeError
    ({"verify_ms_by_tokens": {"1": 5}}, "verify_ms_by_tokens must map batch sizes to \\{tokens per row: ms\\}"),
    ({"allreduce_us": {}}, "allreduce_us table is empty"),  # min() of nothing: a ValueError
    # no request in flight measured nothing: it was priced at batch 1
    ({"served_accept_len": 2.0, "config": {"steps": 3, "request_rate": 1.0}, "in_flight": {"spec": 0}},
     "a served eval at a request rate needs in_flight.spec, the requests it carried \\(a positive number\\), got 0"),
])
def test_an_input_that_cannot_be_priced_is_refused_naming_the_file(tmp_path, content, match):
    f = tmp_path / "in.json"
    f.write_text(json.dumps(content))
    with pytest.raises(LabError, match=match) as e:
        apply_inputs(PRESETS[SEEDS], f)
    assert e.value.path == str(f)


def test_a_served_eval_at_a_rate_is_priced_at_its_in_flight_requests_rounded(tmp_path):
    """3.6 requests in flight on average is a batch of 4, not 3 (rounded, not cut)."""
    _, (cfg, _) = _fold(tmp_path, {"served_accept_len": 2.0, "config": {"steps": 3, "request_rate": 1.0},
                                   "in_flight": {"spec": 3.6}})
    assert (cfg.batch, cfg.steps, cfg.verify_tokens) == (4, 3, 4)


@pytest.mark.parametrize("name", ["num_layers", "verify_layer_compute_us", "decode_ms", "draft_step_us", "steps",
                                  "hidden_size", "dtype_bytes", "verify_tokens", "verify_compute_tokens", "batch",
                                  "topk"])
def test_every_count_and_size_must_be_above_zero(name):
    """hidden_size 0 priced every message at 0 bytes, topk 0 read the draft step table at 0 rows: each
    is refused by name (a flag's name where the CLI set it)."""
    with pytest.raises(LabError, match=f"^{name} must be a finite number > 0, got 0$"):
        CostModel(CostModelConfig(**{name: 0}))


@pytest.mark.parametrize("name", ["allreduces_per_layer", "verify_allreduce_us", "decode_allreduce_us",
                                  "cycle_overhead_ms", "decode_overhead_ms", "verify_token_compute_us",
                                  "measured_verify_ms"])
def test_every_latency_and_overhead_must_not_be_negative(name):
    with pytest.raises(LabError, match=f"^{name} must be a finite number >= 0, got -1$"):
        check_fields(CostModelConfig(**{name: -1}))


@pytest.mark.parametrize("name", ["accept_lengths", "whatif_allreduce_us", "batches", "accept_by_steps"])
def test_every_list_holds_numbers_above_zero(name):
    with pytest.raises(LabError, match=f"^{name} must hold finite numbers > 0, got \\[2.0, 0\\]$"):
        check_fields(CostModelConfig(**{name: [2.0, 0]}))


def test_splitting_a_measured_verify_checks_the_fields_it_divides_by():
    with pytest.raises(LabError, match="^num_layers must be a finite number > 0, got 0$"):
        on_allreduce(CostModelConfig(num_layers=0, measured_verify_ms=30.0), 100.0)


def test_a_deployments_overheads_take_fractions_of_a_millisecond(tmp_path):
    """Host overheads are times, not counts: 0.25 ms is taken where a layer count would be refused."""
    _, (cfg, _) = _fold(tmp_path, {"deployment": {"cycle_overhead_ms": 0.25, "decode_overhead_ms": 0.5}})
    assert (cfg.cycle_overhead_ms, cfg.decode_overhead_ms) == (0.25, 0.5)
    with pytest.raises(LabError, match="deployment.cycle_overhead_ms must be a positive number, got -1"):
        _fold(tmp_path, {"deployment": {"cycle_overhead_ms": -1}})


def test_a_list_of_accept_lengths_joins_the_columns_each(tmp_path):
    _, (cfg, _) = _fold(tmp_path, {"accept_length": [2.5, 1.25]})
    assert cfg.accept_lengths == [1.25, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0]


def test_an_empty_sweep_is_refused(tmp_path):
    """No row to price: the settings table came out empty without a word."""
    f = tmp_path / "sweep.json"
    f.write_text(json.dumps({"sweep": []}))
    with pytest.raises(LabError, match="sweep must be a list of `eval --json` results") as e:
        read_inputs(f)
    assert e.value.path == str(f)


def test_a_kept_best_whose_validation_is_no_object_is_refused(tmp_path):
    (tmp_path / BEST_FILE).write_text(json.dumps({"step": 3, "validation": [0.5]}))
    with pytest.raises(LabError, match=f"^{tmp_path}: {BEST_FILE} holds no validation"):
        read_inputs(tmp_path)


def test_a_null_predictor_is_named_as_such(tmp_path):
    """A NaN metric is written as null (strict JSON) and read back as NaN: the message says both."""
    (tmp_path / METRICS).write_text(json.dumps({"split": "val", "step": 5, "cond_acc_0": None}) + "\n")
    with pytest.raises(LabError, match=r"at step 5 has cond_acc_0 NaN \(or null\), not a finite number in \[0, 1\]"):
        read_inputs(tmp_path)


def test_a_served_eval_without_a_histogram_is_priced_at_its_settings(tmp_path):
    """SGLang may report no accept histogram (null): the eval is still priced, with no draft-steps table."""
    _, (cfg, _) = _fold(tmp_path, {"served_accept_len": 2.0, "accept_histogram": None,
                                   "config": {"steps": 3, "concurrency": 4}})
    assert (cfg.steps, cfg.batch, cfg.verify_tokens, cfg.accept_by_steps) == (3, 4, 4, [])
    assert 2.0 in cfg.accept_lengths


def test_a_sweep_row_at_a_rate_without_its_requests_in_flight_is_refused_on_reading(tmp_path):
    f = tmp_path / "sweep.json"
    f.write_text(json.dumps({"sweep": [{"served_accept_len": 2.0, "config": {"steps": 3, "request_rate": 1.0}}]}))
    with pytest.raises(LabError, match="needs in_flight.spec, the requests it carried") as e:
        read_inputs(f)
    assert e.value.path == str(f)


def test_a_kept_bests_bad_predictor_names_its_file(tmp_path):
    (tmp_path / BEST_FILE).write_text(json.dumps({"step": 3, "validation": {"cond_acc_0": 2}}))
    with pytest.raises(LabError, match="at step 3 has cond_acc_0 2, not a finite number in") as e:
        read_inputs(tmp_path)
    assert e.value.path == str(tmp_path / BEST_FILE)


def test_a_one_point_table_holds_its_value_at_every_batch():
    """A draft step measured at batch 4 alone, read at batch 8: its value (the last segment of one point)."""
    assert interpolate_linear({4: 10.0}, 8) == interpolate_linear({4: 10.0}, 1) == 10.0


def test_a_sampled_prediction_reads_every_replayed_depth():
    val = {"replay_accept_len_0": 1.3, "replay_accept_len_1": 1.5, "replay_accept_len_2": 1.6, "sampled_acc_0": 0.4}
    assert predicted_by_steps(val, sampled=True) == [1.3, 1.5, 1.6]
