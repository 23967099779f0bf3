"""Decisions and verdicts are computed from the numbers: check them on constructed results."""

import math

from drafter_lab.experiments import report
from drafter_lab.experiments.config import get_config
from drafter_lab.experiments.probe import ProbeThresholds, decide
from drafter_lab.experiments.study import Arm


def _arm(key, curve, first_loss, final_acc, accept):
    history = [{"split": "train", "step": 1, "loss_0": first_loss}]
    history += [{"split": "val", "step": 10 * (i + 1), "cond_acc_0": c, "loss_0": 1.0} for i, c in enumerate(curve)]
    final = {"cond_acc_0": final_acc, "cond_acc_1": 0.5, "loss_0": 1.0, "simulated_accept_len": accept}
    return Arm(key, f"({key})", history=history, final=final)


def _level(a_acc, b_acc, zero_accept, verdict="train from scratch"):
    return {
        "arms": [
            _arm("a", [0.3, 0.5, 0.6, 0.7], 6.0, a_acc, 2.5),
            _arm("b", [0.3, 0.38, 0.38, 0.383], 3.0, b_acc, 1.6),
            _arm("c", [0.1, 0.2, 0.3, 0.3], 9.5, 0.3, 1.2),
        ],
        "probe": {"zero_shot": {"simulated_accept_len": zero_accept}, "verdict": verdict},
    }


def test_negative_transfer_is_called_out_with_its_plateau():
    cfg = get_config("tiny-cpu")
    lines = report.decisions(_level(0.747, 0.383, 0.5), cfg)
    assert "(c) starts at loss_0 9.50" in lines[0] and "vocab remap matters" in lines[0]
    assert f"ln {cfg.draft_vocab_size} = {math.log(cfg.draft_vocab_size):.2f}" in lines[0]
    assert "(b) trails (a) by 36.4 points" in lines[1] and "plateau since step 20" in lines[1]
    assert "stop the transfer" in lines[1]


def test_measured_outcome_categories():
    assert report.measured_outcome(_level(0.6, 0.7, 0.5))[0] == "transfer with remap"
    assert report.measured_outcome(_level(0.7, 0.6, 0.5))[0] == "train from scratch"
    assert report.measured_outcome(_level(0.7, 0.6, 2.45))[0] == "reuse as is"
    outcome, gain = report.measured_outcome(_level(0.7, 0.705, 0.5))
    assert outcome == "train from scratch" and abs(gain - 0.005) < 1e-12


def test_sweep_points_report_matches():
    levels = [dict(_level(0.6, 0.7, 0.5, "transfer with remap"), drift_knob=0.1),
              dict(_level(0.7, 0.4, 0.5, "transfer with remap"), drift_knob=2.0)]
    for lv, ckas in zip(levels, ([0.99, 0.98, 0.97], [0.8, 0.7, 0.6])):
        lv["probe"]["aux_cka"] = ckas
    pts = report.sweep_points(levels)
    assert [p["verdict_matches"] for p in pts] == [True, False]
    assert abs(pts[1]["drift"] - 0.3) < 1e-9 and pts[1]["min_cka"] == 0.6
    assert "matched the measured outcome at 1 of 2" in "\n".join(report.sweep_table(pts))


def test_probe_decide_thresholds():
    th = ProbeThresholds(reuse_fraction=0.9, transfer_min_cka=0.9)
    assert decide(2.0, 2.1, [0.5, 0.5, 0.5], th)[0] == "reuse as is"
    assert decide(1.0, 2.1, [0.95, 0.92, 0.91], th)[0] == "transfer with remap"
    assert decide(1.0, 2.1, [0.95, 0.92, 0.85], th)[0] == "train from scratch"
    assert decide(1.0, None, None, th)[0] == "train from scratch"
