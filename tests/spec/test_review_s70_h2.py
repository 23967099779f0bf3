"""Review s70 (h2): the all-reduce count is a whole number wherever a cost model config is checked, and the
mutation audit of costinputs' run predictions and its folding of an inputs file."""

from __future__ import annotations

import dataclasses
import json

import pytest

from drafter_lab.errors import LabError
from drafter_lab.spec.costinputs import apply_inputs, run_inputs
from drafter_lab.spec.costmodel import PRESETS, CostModel, check_fields, on_allreduce
from drafter_lab.train.metrics_log import METRICS

SEEDS = PRESETS["seeds-kimi-k2.5-8x-pcie"]


@pytest.mark.parametrize("count", [2.5, 2.0])
def test_an_allreduce_count_that_is_no_int_is_refused_from_python(count):
    """2.5 all-reduces per layer priced 152.5 of them on 61 layers; a float is no count (the file and the flag
    refused both already)."""
    cfg = dataclasses.replace(SEEDS, allreduces_per_layer=count)
    match = f"^allreduces_per_layer must be a whole number >= 0 \\(all-reduces per layer\\), got {count}$"
    with pytest.raises(LabError, match=match):
        CostModel(cfg)
    with pytest.raises(LabError, match=match):  # a measured verify is split at its all-reduces first
        on_allreduce(dataclasses.replace(cfg, measured_verify_ms=30.0), 100.0)


def test_a_bool_is_no_allreduce_count_and_whole_counts_price():
    with pytest.raises(LabError, match="^allreduces_per_layer must be a finite number >= 0, got True$"):
        check_fields(dataclasses.replace(SEEDS, allreduces_per_layer=True))
    assert CostModel(dataclasses.replace(SEEDS, allreduces_per_layer=0)).n_allreduce == 0  # one device
    assert CostModel(dataclasses.replace(SEEDS, allreduces_per_layer=2 * 2 // 2)).n_allreduce == 122


def test_a_run_is_priced_greedy_unless_sampled_is_asked(tmp_path):
    """run_inputs' default is the greedy chain (`costmodel --inputs RUN` without --sampled), whatever
    else the validation measured."""
    val = {"split": "val", "step": 4, "positions": 10, "cond_acc_0": 0.5, "sampled_acc_0": 0.25,
           "replay_accept_len_0": 1.9}
    (tmp_path / METRICS).write_text(json.dumps(val) + "\n")
    assert run_inputs(tmp_path) == {"accept_by_steps": [1.5]}
    assert run_inputs(tmp_path, sampled=True) == {"accept_by_steps": [1.9]}


def test_an_empty_list_of_accept_lengths_is_refused_naming_the_file(tmp_path):
    """It measured nothing: the preset's columns were priced as if the file had added some."""
    f = tmp_path / "in.json"
    f.write_text(json.dumps({"accept_length": []}))
    with pytest.raises(LabError, match=r"accept_length must be a served accept length or a list of them, got \[\]$") as e:
        apply_inputs(SEEDS, f)
    assert e.value.path == str(f)
