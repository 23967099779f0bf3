"""Every plot of a study is a real PNG written atomically, from constructed arms and sweep points."""

import math

from PIL import Image

from drafter_lab.experiments import plots
from drafter_lab.experiments.study import Arm


def _arm(key, start):
    hist = [{"split": "val", "step": s, "cond_acc_0": min(0.9, start + s / 400), "loss_0": 6.0 - s / 100}
            for s in range(0, 201, 25)]
    return Arm(key, f"({key})", history=hist, final={f"cond_acc_{k}": 0.7 - 0.05 * k for k in range(5)})


def test_study_plots_are_pngs(tmp_path):
    arms = [_arm("a", 0.0), _arm("b", 0.5), _arm("c", 0.1)]
    plots.learning_curves(arms, tmp_path / "curves.png", math.log(512), watch_stop=100)
    plots.cond_acc_bars(arms, tmp_path / "bars.png", 5)
    pts = [{"drift": d, "gain": g, "drift_knob": k, "verdict": "transfer with remap", "verdict_matches": m}
           for d, g, k, m in ((0.0, 0.2, 0.0, True), (0.07, 0.1, 0.5, True), (0.12, 0.07, 1.0, False))]
    plots.drift_sweep(pts, tmp_path / "sweep.png")
    rows = [{"steps": s, "spec_tok_s": 50.0 + 10 * s} for s in (1, 2, 3)]
    plots.speed_by_depth([{"label": "(a)", "served_accept_len": 2.5, "tables": {205.0: rows, 15.0: rows}}],
                         {205.0: 82.0, 15.0: 146.0}, tmp_path / "speed.png")
    for name in ("curves.png", "bars.png", "sweep.png", "speed.png"):
        with Image.open(tmp_path / name) as im:
            assert im.format == "PNG" and im.size[0] > 300 and im.size[1] > 200
    assert not list(tmp_path.glob("*.tmp*"))
