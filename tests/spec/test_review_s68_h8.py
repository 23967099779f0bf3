"""Review s68 (h8): pins from the second mutation audit of spec/costinputs.py (a run's predicted accept
lengths, an input's drafting settings, a deployment and a pass table)."""

from __future__ import annotations

import json

import pytest

from drafter_lab.errors import LabError
from drafter_lab.spec.costinputs import apply_inputs, predicted_by_steps, read_inputs
from drafter_lab.spec.costmodel import PRESETS
from drafter_lab.train.metrics_log import BEST_FILE

SEEDS = "seeds-kimi-k2.5-8x-pcie"


def _best_run(tmp_path, val: dict, step: int = 7):
    run = tmp_path / "run"
    run.mkdir()
    (run / BEST_FILE).write_text(json.dumps({"step": step, "validation": {"positions": 10, **val}}))
    return run


def test_a_replay_is_the_prediction_whatever_sampled_acc_follows():
    """A replay's accept lengths are the prediction as written: a sampled_acc_k beyond them adds no depth."""
    val = {"replay_accept_len_0": 1.5, "sampled_acc_0": 0.5, "sampled_acc_1": 0.5}
    assert predicted_by_steps(val, sampled=True) == [1.5]


def test_an_acceptance_of_one_is_in_range(tmp_path):
    """cond_acc 1.0 (every validation draft right) is a probability like any other, not out of [0, 1]."""
    cfg = apply_inputs(PRESETS[SEEDS], _best_run(tmp_path, {"cond_acc_0": 1.0, "cond_acc_1": 0.5}))[0]
    assert cfg.accept_by_steps == [2.0, 2.5]


@pytest.mark.parametrize("sampled, missing", [
    (False, "cond_acc_k: nothing to predict accept lengths from"),
    (True, "sampled_acc_k: train with --val-temperature T to predict a sampled chain"),
])
def test_a_validation_without_the_chains_accuracies_is_refused_saying_which(tmp_path, sampled, missing):
    """A greedy-only validation read with --sampled (or one with neither) has nothing to price: an empty
    prediction dropped the draft-steps table without a word."""
    run = _best_run(tmp_path, {"acc_0": 0.5} if not sampled else {"cond_acc_0": 0.5})
    with pytest.raises(LabError, match=f"its validation has no {missing}") as e:
        read_inputs(run, sampled)
    assert str(run) in str(e.value)


@pytest.mark.parametrize("sampled, val, chain", [
    (False, {"cond_acc_0": 0.5, "sampled_acc_0": 0.5, "replay_accept_len_0": 1.25}, "greedy chain"),
    (True, {"cond_acc_0": 0.5, "sampled_acc_0": 0.5}, "sampled chain"),
    (True, {"sampled_acc_0": 0.5, "replay_accept_len_0": 1.5}, "sampled chain, replayed over the target's own tokens"),
])
def test_the_prediction_says_which_chain_it_priced(tmp_path, capsys, sampled, val, chain):
    """A greedy prediction beside a replay, or a sampled one without it, is no replay: the line said so."""
    read_inputs(_best_run(tmp_path, val), sampled)
    assert f"(teacher-forced, {chain}): 1.50 at 1..1 steps" in capsys.readouterr().err


def _deployed(tmp_path, deployment: dict):
    f = tmp_path / "verify.json"
    f.write_text(json.dumps({"deployment": deployment}))
    return apply_inputs(PRESETS[SEEDS], f)[0]


def test_a_deployment_naming_every_field_is_taken_whole(tmp_path):
    """`bench verify` names all six (its target on one device, fp8, no host work): each one replaces the
    preset's, a 1 included (a one-layer target, one-byte weights)."""
    given = {"num_layers": 1, "hidden_size": 64, "dtype_bytes": 1, "allreduces_per_layer": 0,
             "cycle_overhead_ms": 0, "decode_overhead_ms": 0.25}
    cfg = _deployed(tmp_path, given)
    assert {k: getattr(cfg, k) for k in given} == given


@pytest.mark.parametrize("key", ["num_layers", "hidden_size", "dtype_bytes"])
def test_a_deployment_of_zero_layers_or_bytes_is_refused(tmp_path, key):
    """Only an all-reduce count or an overhead may be 0: a 0-layer target priced every verify at its
    all-reduces alone."""
    with pytest.raises(LabError, match=f"deployment.{key} must be a positive integer, got 0"):
        _deployed(tmp_path, {key: 0})
