"""README "The pieces" checked against the code (review s60, part a)."""

from __future__ import annotations

import json

import pytest

from drafter_lab.spec.costinputs import run_inputs
from drafter_lab.train.metrics_log import BEST_DIR, BEST_FILE


def test_costmodel_names_the_step_of_a_kept_best_drafter(tmp_path, capsys):
    """`costmodel --inputs RUN_DIR/best` said "the validation at step ?": train --keep-best writes the step
    beside the validation, whose metrics carry none (best.json as `train` writes it)."""
    best = tmp_path / BEST_DIR
    best.mkdir()
    (best / BEST_FILE).write_text(json.dumps({
        "metric": "simulated_accept_len", "value": 0.4, "step": 480, "epoch": 3,
        "validation": {"cond_acc_0": 0.8, "cond_acc_1": 0.5, "simulated_accept_len": 0.4, "positions": 57},
    }))
    assert run_inputs(best)["accept_by_steps"] == pytest.approx([1.8, 2.2])
    err = " ".join(capsys.readouterr().err.split())
    assert "predicted from the validation at step 480 " in err, err
