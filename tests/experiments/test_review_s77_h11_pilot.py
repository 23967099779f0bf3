"""Pilot behaviours a mutation audit (s77, h11) found unpinned: the seconds and default rate it reports,
a lead nearer a line than 15 decimals show, the lead text the probe and the report print, and when a
lead is closing (a pilot under 4 steps validates at step 1), with `train` faked."""

from __future__ import annotations

import math

from drafter_lab.experiments import pilot as pilot_mod
from drafter_lab.experiments.pilot import closing, lead_closing, lead_text, points_text
from drafter_lab.train.config import TrainConfig


def test_a_lead_a_hair_under_a_line_is_written_as_the_float_itself():
    x = math.nextafter(0.01, 0.0)  # 15 decimals round it up onto the 1-point line
    text = points_text(x, 0.01)
    assert text == f"{100 * x:+.17g}" == "+0.99999999999999989"
    assert float(text) < 1.0


def _pilot(*leads):
    return {"curve": [{"step": i, "scratch_cond_acc_0": 0.3, "transfer_cond_acc_0": 0.3 + x}
                      for i, x in enumerate(leads)]}


def test_lead_text_skips_step_0_and_keeps_each_lead_on_its_side():
    assert lead_text(_pilot(0.2, 0.00996, -0.1), 0.01) == "+0.996 / -10.0 points at steps 1 / 2"


def test_closing_measures_from_step_1_where_the_pilot_validates_there():
    assert closing(_pilot(0.0, 0.2, 0.1, 0.09))  # 0.09 of the 0.2 at step 1, not of the 0.1 at step 2
    assert not closing(_pilot(0.5, 0.2, 0.1, 0.15))  # step 0's lead is no starting point


def test_a_lead_fallen_to_nothing_is_closing():
    assert lead_closing(0.2, 0.0)


class _Clock:
    """time.time for the pilot: 100.0 when it starts, 112.34 when it ends."""

    def __init__(self):
        self.now = iter([100.0, 112.34])

    def time(self):
        return next(self.now)


def test_run_pilot_reports_its_seconds_to_one_decimal(tmp_path, monkeypatch):
    def train(cfg, target_dir, data_dir, out, **kw):
        out.mkdir(parents=True, exist_ok=True)

    def read_metrics(arm_dir):
        return [{"split": "val", "step": 4, "cond_acc_0": 0.5, "simulated_accept_len": 1.5}]

    monkeypatch.setattr(pilot_mod, "train", train)
    monkeypatch.setattr(pilot_mod, "read_metrics", read_metrics)
    monkeypatch.setattr(pilot_mod, "time", _Clock())
    out = pilot_mod.run_pilot("src", "tgt", "data", TrainConfig(max_steps=4), out_dir=tmp_path)
    assert out["seconds"] == 12.3
    assert out["transfer_lr_scale"] == 1.0  # the transfer arm trains at the full rate unless told
