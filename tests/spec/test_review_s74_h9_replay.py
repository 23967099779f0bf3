"""Review s74 (h9): mutation audit of costinputs' training-run predictions: a sampled replay's depth
that ran no verify step (train writes 0 there) has no accept length to price."""

from __future__ import annotations

import json

import pytest

from drafter_lab.errors import LabError
from drafter_lab.spec.costinputs import read_inputs
from drafter_lab.train.metrics_log import METRICS


def _run(tmp_path, **val):
    metrics = tmp_path / METRICS
    row = {"split": "val", "step": 9, "positions": 40, "cond_acc_0": 0.5, "cond_acc_1": 0.5, **val}
    metrics.write_text(json.dumps({"split": "train", "step": 9, "loss": 1.0}) + "\n" + json.dumps(row) + "\n")
    return metrics


def test_a_replay_depth_below_one_is_refused_naming_the_first(tmp_path):
    """Depth 1 ran no verify step and 2 is short too: the first is named, in the metrics file; a served
    accept length below 1 would price a drafter slower than none."""
    metrics = _run(tmp_path, replay_accept_len_0=1.8, replay_accept_len_1=0.0, replay_accept_len_2=0.5)
    with pytest.raises(LabError) as e:
        read_inputs(tmp_path, sampled=True)
    assert str(e.value) == (f"{metrics}: its validation at step 9 has replay_accept_len_1 0, below 1 (train writes 0 "
                            "where the replay ran no verify step at that depth): no accept length to price")


def test_a_greedy_read_of_a_run_with_a_short_replay_prices_its_chain(tmp_path):
    """The replay prices only the sampled chain: a greedy read is the cond_acc product, replay unread."""
    _run(tmp_path, replay_accept_len_0=0.0)
    assert read_inputs(tmp_path) == {"accept_by_steps": [1.5, 1.75]}
