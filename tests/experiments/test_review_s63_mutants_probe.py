"""Mutation audit (review s63): the probe's lines are inclusive, as ProbeThresholds documents them
("transfer only when every aux layer's CKA is >= this"; a pilot lead of "at least" pilot_min_gain)."""

from __future__ import annotations

from drafter_lab.experiments.config import ProbeThresholds
from drafter_lab.experiments.probe import decide


def test_a_cka_exactly_on_the_line_transfers():
    th = ProbeThresholds()
    verdict, reason = decide(1.0, 2.0, [0.9, th.transfer_min_cka, 0.95], th)
    assert verdict == "transfer with remap" and "min CKA 0.800 >= 0.8" in reason


def test_a_pilot_lead_exactly_on_the_line_transfers():
    th = ProbeThresholds()
    curve = [{"step": s, "scratch_cond_acc_0": 0.5, "transfer_cond_acc_0": 0.5 + th.pilot_min_gain} for s in (0, 10, 20)]
    pilot = {"steps": 20, "curve": curve, "gain": th.pilot_min_gain}
    verdict, reason = decide(1.0, 2.0, [0.1, 0.1, 0.1], th, pilot)  # CKA far under its line: the pilot decides
    assert verdict == "transfer with remap" and "(>= 1 at the end)" in reason
