"""Mutation audit (review s64) of the cost model's measured inputs: a sweep row's settings are checked
before its batch is read; what else the surviving mutants showed no test pinned."""

from __future__ import annotations

import dataclasses
import json

import pytest

from drafter_lab.cli import main
from drafter_lab.errors import LabError
from drafter_lab.spec.costinputs import apply_inputs, predicted_by_steps
from drafter_lab.spec.costmodel import PRESETS, CostModel
from drafter_lab.train.metrics_log import BEST_FILE

SEEDS = "seeds-kimi-k2.5-8x-pcie"


@pytest.mark.parametrize("config, match", [
    ({"steps": 3, "batch": "x"}, "config.batch must be a positive integer, got 'x'"),  # was a ValueError
    ({"steps": 3, "concurrency": 0.5}, "config.concurrency must be a positive integer, got 0.5"),
    ([3], "sweep must be a list of `eval --json` results"),  # was an AttributeError
])
def test_a_sweep_rows_bad_settings_are_refused_in_one_line(tmp_path, capsys, config, match):
    f = tmp_path / "sweep.json"
    f.write_text(json.dumps({"sweep": [{"served_accept_len": 2.0, "config": config}]}))
    assert main(["costmodel", "--inputs", str(f)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {f}: {match}") and err.count("\n") == 1


def test_a_sweep_row_without_its_steps_is_refused_before_any_table(tmp_path, capsys):
    """Its steps price its accept length: unchecked, a row without them is a KeyError in the settings table."""
    f = tmp_path / "sweep.json"
    f.write_text(json.dumps({"sweep": [{"served_accept_len": 2.0, "config": {"topk": 2}}]}))
    assert main(["costmodel", "--inputs", str(f)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {f}: sweep must be a list of `eval --json` results") and err.count("\n") == 1


@pytest.mark.parametrize("content, match", [
    ({"verify_ms": 0}, "verify_ms must be a positive number, got 0"),  # 0 would read as no measured verify
    ({"allreduce_us": 0}, "allreduce_us must be a positive number, got 0"),
    ({"accept_histogram": {"1": 5, "2": -1}}, "counts must be whole numbers"),  # would lower the mean
])
def test_a_zero_measurement_or_a_negative_count_is_refused_naming_the_file(tmp_path, content, match):
    f = tmp_path / "in.json"
    f.write_text(json.dumps(content))
    with pytest.raises(LabError, match=match) as e:
        apply_inputs(PRESETS[SEEDS], f)
    assert e.value.path == str(f)


def test_an_accept_length_of_one_joins_the_columns(tmp_path):
    """1.0 is a drafter whose drafts were all rejected: a valid served accept length."""
    f = tmp_path / "in.json"
    f.write_text(json.dumps({"accept_length": 1, "accept_by_steps": [1.0, 1.5]}))
    cfg, _ = apply_inputs(PRESETS[SEEDS], f)
    assert 1.0 in cfg.accept_lengths and cfg.accept_by_steps == [1.0, 1.5]


def test_a_greedy_prediction_ignores_a_sampled_replay():
    val = {"cond_acc_0": 0.5, "sampled_acc_0": 0.25, "replay_accept_len_0": 1.9}
    assert predicted_by_steps(val) == [1.5]
    assert predicted_by_steps(val, sampled=True) == [1.9]
    del val["replay_accept_len_0"]
    assert predicted_by_steps(val, sampled=True) == [1.25]


@pytest.mark.parametrize("key, value", [("cond_acc_1", 1.5), ("sampled_acc_0", -0.1)])
def test_an_acceptance_outside_zero_to_one_is_refused(tmp_path, key, value):
    """An acceptance is a probability: 1.5 priced a drafter beyond any served one."""
    run = tmp_path / "run"
    run.mkdir()
    val = {"positions": 10, "cond_acc_0": 0.8, "cond_acc_1": 0.5, "sampled_acc_0": 0.5, key: value}
    (run / BEST_FILE).write_text(json.dumps({"step": 7, "validation": val}))
    with pytest.raises(LabError, match=f"its validation at step 7 has {key} {value}, not a finite number in \\[0, 1\\]"):
        apply_inputs(PRESETS[SEEDS], run)


def _folded(tmp_path, content):
    f = tmp_path / "eval.json"
    f.write_text(json.dumps(content))
    return apply_inputs(PRESETS[SEEDS], f)[0]


def test_an_evals_settings_price_its_accept_length(tmp_path):
    """A tree eval's topk, a served eval's concurrency as its batch, its accept length (to two places)
    beside the preset's columns."""
    cfg = _folded(tmp_path, {"served_accept_len": 2.3456, "config": {"steps": 3, "topk": 2, "concurrency": 4}})
    assert (cfg.steps, cfg.topk, cfg.batch, cfg.verify_tokens) == (3, 2, 4, 4)
    assert cfg.accept_lengths == sorted([*PRESETS[SEEDS].accept_lengths, 2.35])


def test_a_served_eval_that_carried_under_one_request_is_priced_at_batch_one(tmp_path):
    rated = {"served_accept_len": 2.0, "config": {"steps": 2, "request_rate": 0.5}, "in_flight": {"spec": 0.3}}
    assert _folded(tmp_path, rated).batch == 1


def test_an_evals_zero_steps_are_refused(tmp_path):
    with pytest.raises(LabError, match="config.steps must be a positive integer, got 0"):
        _folded(tmp_path, {"served_accept_len": 2.0, "config": {"steps": 0}})


def test_a_measured_verify_holds_at_the_evals_verified_tokens(tmp_path):
    """verify_ms beside a 7-step eval measured an 8-token verify: per-token compute moves it from there."""
    cfg = _folded(tmp_path, {"verify_ms": 30.0, "served_accept_len": 2.0, "config": {"steps": 7}})
    assert (cfg.verify_tokens, cfg.verify_compute_tokens) == (8, 8)
    grown = dataclasses.replace(cfg, verify_token_compute_us=5.0)
    assert CostModel(grown).verify_ms() == pytest.approx(30.0)
    assert CostModel(dataclasses.replace(grown, verify_tokens=10)).verify_ms() == pytest.approx(30.0 + 61 * 2 * 5 / 1000)


def test_a_pass_table_row_of_zero_tokens_is_refused(tmp_path):
    """A pass verifies at least one token per row: a 0 would anchor the interpolation below a decode step."""
    with pytest.raises(LabError, match=r"tokens per row \(>= 1\)"):
        _folded(tmp_path, {"verify_ms_by_tokens": {"1": {"0": 5.0, "4": 9.0}}})
