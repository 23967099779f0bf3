"""Review s75 (h12) of report.md: the parts of a rendered report no other test reads (wall time, the
speed section's place and all-reduce column, the probe's served, CKA and pilot lines, stage times, the
sweep's match column and plot, the config), a lead that reversed to (b)'s favour, the trailing margin's
far side, and results.json's level keys."""

from __future__ import annotations

import dataclasses
import math

from drafter_lab.experiments import report
from drafter_lab.experiments.config import get_config
from drafter_lab.experiments.probe import ProbeThresholds
from drafter_lab.experiments.study import Arm
from drafter_lab.spec.costinputs import accept_by_steps
from drafter_lab.spec.costmodel import PRESETS
from drafter_lab.spec.costreport import steps_table

ALWAYS = {"1": 0, "2": 0, "3": 0, "4": 0, "5": 9}  # every draft accepted


def _arm(key, curve, final_acc=0.5, steps=None, served=None):
    steps = steps or [10 * (i + 1) for i in range(len(curve))]
    history = [{"split": "val", "step": s, "cond_acc_0": c, "loss_0": 1.0} for s, c in zip(steps, curve)]
    final = {"cond_acc_0": final_acc, "cond_acc_1": 0.25, "loss_0": 1.0, "loss_1": 2.0, "simulated_accept_len": 1.0}
    return Arm(key, f"({key})", history=history, final=final, served=served)


def _level(a_acc=0.5, b_acc=0.5, verdict="train from scratch", drift=1.0):
    probe = {"zero_shot": {"simulated_accept_len": 0.5, "cond_acc_0": 0.2, "cond_acc_1": 0.1},
             "vocab": {"same_positions": 1, "size_a": 2, "shared_tokens": 2, "by": "id"},
             "thresholds": dataclasses.asdict(ProbeThresholds()), "verdict": verdict, "reason": "why",
             "aux_cka": [0.9, 0.8]}
    arms = [_arm("a", [a_acc] * 3, a_acc, steps=[0, 10, 20]), _arm("b", [b_acc] * 3, b_acc, steps=[0, 10, 20])]
    return {"drift_knob": drift, "pair": {}, "timings": {"pair": 3.4, "arms": 120.0}, "arms": arms, "probe": probe}


def _cfg():
    return dataclasses.replace(get_config("smoke"), ttt_steps=2, served_eval=False)


def _after(lines, heading):
    return lines[lines.index(heading) + 1:]


def test_a_single_level_report_has_every_section_in_its_place():
    level = _level(0.4, 0.7)
    level["arms"][0].served = {"served_accept_len": 5.0, "accept_histogram": ALWAYS}
    level["source_served_zero_shot"] = {"served_accept_len": 1.234}
    level["probe"]["pilot"] = {"steps": 8, "seconds": 2.0, "gain": 0.25,
                               "curve": [{"step": 8, "scratch_cond_acc_0": 0.5, "transfer_cond_acc_0": 0.75}]}
    text = report.render(_cfg(), [level], None, 600.0)
    lines = text.split("\n")
    assert "Wall time of this invocation 10.0 min (cached stages" in text
    # the speed section sits between the decisions and the probe, a blank line before the probe's heading
    arms = _after(lines, "### Arms (final validation)")
    assert arms[1].startswith("| arm | cond_acc_0 | cond_acc_1 |") and arms[3].startswith("| (a) | 0.400 |")
    speed = lines.index("### What the served accept lengths buy on the seeds' box (cost model)")
    probe = lines.index("### Phase-0 probe")
    assert lines.index("### Decisions, taken from the numbers") < speed < probe
    assert lines[probe - 2:probe] == ["![tok/s by draft depth](speed.png)", ""]
    assert [line for line in lines[speed:probe] if line.startswith("| (a)")]
    section = _after(lines, "### Phase-0 probe")
    assert "- zero-shot served accept length (decoded, bonus included): 1.23" in section
    assert "- aux-layer CKA (source vs new target): 0.900, 0.800" in section
    assert "- pilot (8 steps per arm, 2 s): transfer - scratch in val cond_acc_0 = +25.0 points at steps 8" in section
    assert "Stage times: pair 3s, arms 120s" in lines
    assert "## Drift sweep" not in text and "drift_sweep.png" not in text
    config = _after(lines, "## Config")
    assert config[:2] == ["", "```"] and "name = 'smoke'" in config and "ttt_steps = 2" in config
    assert config[-2:] == ["```", ""]


def test_the_speed_section_is_left_out_with_its_blank_line_where_nothing_was_served():
    lines = report.render(_cfg(), [_level()], None, 60.0).split("\n")
    assert not any(line.startswith("### What the served") for line in lines)
    probe = lines.index("### Phase-0 probe")
    assert lines[probe - 2].startswith("- The watch") and lines[probe - 1] == ""


def test_the_speed_section_prices_the_fast_all_reduce_of_design_section_5():
    """15 us: the realistic 8-GPU P2P all-reduce the what-if column prices (DESIGN section 5: 10-25 us)."""
    level = _level()
    level["arms"][0].served = {"served_accept_len": 5.0, "accept_histogram": ALWAYS}
    preset = PRESETS[report.SPEED_PRESET]
    (d,) = report.speed_tables(level)
    assert list(d["tables"]) == [preset.verify_allreduce_us, 15.0]
    priced = dataclasses.replace(preset, accept_by_steps=accept_by_steps(ALWAYS, None))
    assert d["tables"][15.0] == steps_table(priced, 15.0)
    lines = report._speed_section(level, _cfg(), None)
    assert f"| drafter | served accept | {preset.verify_allreduce_us:g} us all-reduces: depth, tok/s (vs plain) | 15 us: depth, tok/s " \
           "(vs plain) |" in lines
    assert "with 15 us ones." in lines[2]


def test_a_sweep_report_has_its_table_match_column_and_plot():
    levels = [_level(0.7, 0.4, drift=0.5), _level(0.7, 0.4, "transfer with remap", drift=1.0)]
    text = report.render(_cfg(), levels, report.sweep_points(levels), 60.0)
    lines = text.split("\n")
    sweep = _after(lines, "## Drift sweep: when does transferring a drafter pay?")
    rows = [line for line in sweep if line.startswith("| 0.5 |") or line.startswith("| 1 |")]
    assert rows[0].endswith("| train from scratch | train from scratch | yes |")
    assert rows[1].endswith("| transfer with remap | train from scratch | no |")
    assert "![drift sweep](drift_sweep.png)" in sweep
    assert sweep.index("![drift sweep](drift_sweep.png)") < sweep.index("## Config")


def test_a_lead_that_reversed_to_bs_favour_says_b_now_leads():
    """Behind at the first shared step, ahead at the last, even by half a point: "now leads"."""
    a = _arm("a", [0.5, 0.5, 0.5], steps=[10, 20, 30])
    b = _arm("b", [0.4, 0.3, 0.505], steps=[10, 20, 30])
    assert report._lead_trend(a, b) == ("(b) - (a) at steps 10 / 20 / 30: -10.0 / -20.0 / +0.5 points; the lead "
                                        "reversed: (b) now leads.")


def test_the_lead_trend_reads_the_last_shared_step_not_the_middle_one():
    """A middle lead under half the first and a last one back over it: the gap held at the end."""
    a = _arm("a", [0.5] * 3, steps=[10, 20, 30])
    b = _arm("b", [0.6, 0.52, 0.6], steps=[10, 20, 30])
    assert report._lead_trend(a, b).endswith("+10.0 / +2.0 / +10.0 points; the gap holds.")
    b = _arm("b", [0.6, 0.6, 0.52], steps=[10, 20, 30])
    assert report._lead_trend(a, b).endswith("+10.0 / +10.0 / +2.0 points; the gap is closing: a longer budget "
                                             "may erase it.")


def test_a_validation_at_step_1_counts_in_the_lead_trend():
    """Only step 0 (the initial weights) is left out: a run validating every step starts its trend at 1."""
    a = _arm("a", [0.5] * 4, steps=[0, 1, 2, 3])
    b = _arm("b", [0.5, 0.6, 0.6, 0.6], steps=[0, 1, 2, 3])
    assert report._lead_trend(a, b).startswith("(b) - (a) at steps 1 / 2 / 3: ")


def test_trailing_by_just_over_the_margin_is_trailing(monkeypatch):
    """The other side of test_review_s64_report's deficit of exactly the margin (binary fractions)."""
    monkeypatch.setattr(report, "GAIN_MARGIN", 0.125)
    lines = report.decisions(_level(0.5, 0.5 - 0.125 - 2**-10), get_config("drift-sweep"))
    assert lines[0].startswith("(b) trails (a) by 12.6 points of cond_acc_0 at equal steps")


def test_results_json_keeps_every_recorded_field_of_a_level():
    level = _level(0.4, 0.7)
    out = report.results_json([level], None, 12.5)
    (lv,) = out["levels"]
    assert set(lv) == {"drift_knob", "pair", "timings", "probe", "arms", "measured_outcome"}
    assert lv["drift_knob"] == 1.0 and lv["probe"] is level["probe"] and lv["timings"] == level["timings"]
    assert out["elapsed_s"] == 12.5 and out["sweep"] is None


def test_c_starting_as_near_b_as_the_random_level_is_no_sign_the_remap_matters():
    """(c)'s start halfway between (b)'s and the random level (each 0.5 away, exactly): "changes little"."""
    cfg = get_config("tiny-cpu")
    rnd = math.log(cfg.draft_vocab_size)
    level = _level()
    level["arms"][1].history.insert(0, {"split": "train", "step": 1, "loss_0": rnd - 1.0})
    level["arms"][1].history = [r for r in level["arms"][1].history if r["step"] != 0]
    level["arms"].append(Arm("c", "(c)", history=[{"split": "train", "step": 1, "loss_0": rnd - 0.5}],
                             final=dict(level["arms"][0].final)))
    assert abs(rnd - (rnd - 0.5)) == abs((rnd - 0.5) - (rnd - 1.0)) == 0.5
    assert "the remap changes little here" in report.decisions(level, cfg)[0]


def test_a_trailing_transfer_without_a_plateau_names_none():
    """Three validations are too few to call a plateau: the line says nothing of one."""
    lines = report.decisions(_level(0.7, 0.4), get_config("drift-sweep"))
    assert lines[0] == "(b) trails (a) by 30.0 points of cond_acc_0 at equal steps: stop the transfer, train from scratch."


def test_a_lead_that_closed_to_nothing_is_closing():
    a = _arm("a", [0.5] * 3, steps=[10, 20, 30])
    b = _arm("b", [0.6, 0.55, 0.5], steps=[10, 20, 30])
    assert report._lead_trend(a, b).endswith("+10.0 / +5.0 / +0.0 points; the gap is closing: a longer budget "
                                             "may erase it.")


def test_the_l2sp_line_gives_d_minus_b_in_points():
    level = _level(0.7, 0.4)
    level["arms"].append(_arm("d", [0.7] * 3, 0.7, steps=[0, 10, 20]))
    assert report.decisions(level, get_config("drift-sweep"))[-1] == \
        "L2-SP (d) vs plain transfer (b): +30.0 points of cond_acc_0."


def test_the_source_drafters_zero_shot_serving_is_priced_too():
    level = _level()
    level["source_served_zero_shot"] = {"served_accept_len": 5.0, "accept_histogram": ALWAYS}
    assert [d["label"] for d in report.speed_tables(level)] == ["source drafter, zero-shot"]


def test_the_speed_section_without_a_plot_links_none():
    level = _level()
    level["arms"][0].served = {"served_accept_len": 5.0, "accept_histogram": ALWAYS}
    lines = report._speed_section(level, _cfg(), None)
    assert lines[-1].startswith("| (a) |") and not any("![" in line for line in lines)
