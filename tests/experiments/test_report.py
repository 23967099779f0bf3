"""Decisions and verdicts are computed from the numbers: check them on constructed results."""

import dataclasses
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
        "probe": {"zero_shot": {"simulated_accept_len": zero_accept}, "verdict": verdict,
                  "thresholds": dataclasses.asdict(ProbeThresholds())},
    }


def test_negative_transfer_is_called_out_with_its_plateau():
    cfg = get_config("tiny-cpu")
    lines = report.decisions(_level(0.747, 0.383, 0.5), cfg)
    assert "(c) starts at loss_0 9.50" in lines[0] and "vocab remap matters" in lines[0]
    assert f"ln {cfg.draft_vocab_size} = {math.log(cfg.draft_vocab_size):.2f}" in lines[0]
    assert "(b) trails (a) by 36.4 points" in lines[1] and "plateau since step 20" in lines[1]
    assert "stop the transfer" in lines[1]
    # (b) trails by 12 / 22 / 31.7 points at steps 20 / 30 / 40, but train judges no validation at its last step
    assert lines[3] == "The watch (`train --stop-if-behind` (a), default settings) would not have stopped (b)."


def test_measured_outcome_categories():
    assert report.measured_outcome(_level(0.6, 0.7, 0.5))[0] == "transfer with remap"
    assert report.measured_outcome(_level(0.7, 0.6, 0.5))[0] == "train from scratch"
    assert report.measured_outcome(_level(0.7, 0.6, 2.45))[0] == "reuse as is"
    outcome, gain = report.measured_outcome(_level(0.7, 0.705, 0.5))
    assert outcome == "train from scratch" and abs(gain - 0.005) < 1e-12


def test_a_lead_of_exactly_the_margin_pays_as_the_probe_reads_it(monkeypatch):
    """The pilot's verdict is "transfer" at a lead of at least pilot_min_gain: the measured outcome and the
    decisions read GAIN_MARGIN the same way (binary fractions, so the lead is exactly the margin)."""
    monkeypatch.setattr(report, "GAIN_MARGIN", 0.125)
    level = _level(0.5, 0.625, 0.5)
    th = ProbeThresholds(pilot_min_gain=0.125)
    pilot = {"gain": 0.125, "steps": 8,
             "curve": [{"step": 8, "scratch_cond_acc_0": 0.5, "transfer_cond_acc_0": 0.625}]}
    assert decide(0.5, None, [0.5] * 3, th, pilot)[0] == "transfer with remap" == report.measured_outcome(level)[0]
    assert "the transfer pays" in report.decisions(level, get_config("tiny-cpu"))[1]


def test_sweep_points_report_matches():
    levels = [dict(_level(0.6, 0.7, 0.5, "transfer with remap"), drift_knob=0.1),
              dict(_level(0.7, 0.4, 0.5, "transfer with remap"), drift_knob=2.0)]
    for lv, ckas in zip(levels, ([0.99, 0.98, 0.97], [0.8, 0.7, 0.6])):
        lv["probe"]["aux_cka"] = ckas
    pts = report.sweep_points(levels)
    assert [p["verdict_matches"] for p in pts] == [True, False]
    assert abs(pts[1]["drift"] - 0.3) < 1e-9 and pts[1]["min_cka"] == 0.6
    assert "matched the measured outcome at 1 of 2" in "\n".join(report.sweep_table(pts))
    levels[0]["probe"]["pilot"] = {"gain": 0.123}
    rows = report.sweep_table(report.sweep_points(levels))
    assert "| 0.9700 | 0.50 | +12.3 | +10.0 | transfer with remap |" in rows[2] and "| 0.50 | - | -30.0 |" in rows[3]


def test_probe_decide_thresholds():
    th = ProbeThresholds(reuse_fraction=0.9, transfer_min_cka=0.9)
    assert decide(2.0, 2.1, [0.5, 0.5, 0.5], th)[0] == "reuse as is"
    assert decide(1.0, 2.1, [0.95, 0.92, 0.91], th)[0] == "transfer with remap"
    assert decide(1.0, 2.1, [0.95, 0.92, 0.85], th)[0] == "train from scratch"
    assert decide(1.0, None, None, th)[0] == "train from scratch"


def test_remap_verdict_follows_distance_to_random():
    cfg = get_config("tiny-cpu")
    rnd = math.log(cfg.draft_vocab_size)
    near_b = _level(0.7, 0.6, 0.5)
    near_b["arms"][2].history[0]["loss_0"] = 3.0 + 0.4 * (rnd - 3.0)  # (b) starts at 3.0
    assert "the remap changes little here" in report.decisions(near_b, cfg)[0]
    near_random = _level(0.7, 0.6, 0.5)
    near_random["arms"][2].history[0]["loss_0"] = 3.0 + 0.6 * (rnd - 3.0)
    assert "the vocab remap matters" in report.decisions(near_random, cfg)[0]


def test_decisions_without_arm_c():
    level = _level(0.6, 0.7, 0.5)
    level["arms"] = level["arms"][:2]
    for r, v in zip(report._val(level["arms"][1]), (0.4, 0.6, 0.7, 0.8)):  # (b) ahead all along
        r["cond_acc_0"] = v
    lines = report.decisions(level, get_config("drift-sweep"))
    assert "(b) leads (a) by 10.0 points" in lines[0] and lines[1].startswith("(b) - (a) at steps")
    assert lines[2] == "The watch (`train --stop-if-behind` (a), default settings) would not have stopped (b)."
    assert not any("(c)" in line for line in lines)


def test_arms_must_include_a_and_b():
    import dataclasses

    import pytest

    from drafter_lab.errors import LabError
    from drafter_lab.experiments.study import arms_for

    cfg = get_config("tiny-cpu")
    assert [a.key for a in arms_for(cfg)] == ["a", "b", "c"]
    assert [a.key for a in arms_for(dataclasses.replace(cfg, arms=["b", "a"], l2sp=0.1))] == ["a", "b", "d"]
    for bad in (["a", "c"], ["a", "b", "e"]):
        with pytest.raises(LabError):
            arms_for(dataclasses.replace(cfg, arms=bad))


def test_default_thresholds_reproduce_the_sweep_verdicts():
    """The README's drift-sweep probe figures (zero-shot, home, aux CKA) -> the measured outcomes."""
    th = ProbeThresholds()
    assert decide(2.608, 2.608, [1.0, 1.0, 1.0], th)[0] == "reuse as is"  # knob 0
    assert decide(1.137, 1.878, [0.9189, 0.9017, 0.8749], th)[0] == "transfer with remap"  # knob 0.5
    assert decide(1.460, 2.321, [0.8984, 0.8756, 0.8537], th)[0] == "transfer with remap"  # knob 1
    assert decide(1.055, 2.055, [0.8208, 0.8010, 0.8018], th)[0] == "transfer with remap"  # knob 4
    assert decide(1.460, 2.321, [0.8984, 0.8756, 0.79], th)[0] == "train from scratch"


def test_lead_trend_closing_and_holding():
    level = _level(0.6, 0.7, 0.5)
    a, b = level["arms"][0], level["arms"][1]  # val cond_acc_0 at steps 10..40: a 0.3 .. 0.7, b 0.3 .. 0.383
    assert report._lead_trend(a, b) == ("(b) - (a) at steps 10 / 30 / 40: +0.0 / -22.0 / -31.7 points; "
                                        "the gap holds.")
    for r, v in zip(report._val(b), (0.7, 0.75, 0.76, 0.78)):
        r["cond_acc_0"] = v
    assert report._lead_trend(a, b).endswith("+40.0 / +16.0 / +8.0 points; the gap is closing: a longer budget "
                                             "may erase it.")
    for r in report._val(b):  # ahead early, behind at the end: the seeds' negative transfer
        r["cond_acc_0"] = 0.6
    assert report._lead_trend(a, b).endswith("+30.0 / +0.0 / -10.0 points; the lead reversed: (b) now trails.")


def test_speed_section_prices_each_served_histogram_at_its_best_depth():
    """A drafter that always accepts every draft is worth most at full depth; one that never accepts
    gains nothing from depth, so its best is one step, and on the seeds' box it loses to plain decoding."""
    level = _level(0.7, 0.6, 0.5)
    level["arms"][0].served = {"served_accept_len": 5.0, "accept_histogram": {"1": 0, "2": 0, "3": 0, "4": 0, "5": 9}}
    level["arms"][1].served = {"served_accept_len": 1.0, "accept_histogram": {"1": 9, "2": 0, "3": 0, "4": 0, "5": 0}}
    lines = report._speed_section(level, get_config("tiny-cpu"), "speed.png")
    assert lines[-1] == "![tok/s by draft depth](speed.png)"
    rows = {line.split(" | ")[0]: line for line in lines if line.startswith("| (")}
    assert set(rows) == {"| (a)", "| (b)"}
    assert "| 5.00 | 4: " in rows["| (a)"] and "| 1.00 | 1: " in rows["| (b)"]
    assert "(0." in rows["| (b)"].split(" | ")[2]  # slower than plain decoding with the seeds' all-reduces
    assert report._speed_section(_level(0.7, 0.6, 0.5), get_config("tiny-cpu"), "speed.png") == []


def test_ngram_baseline_is_priced_with_its_own_draft_time():
    """The same histogram from n-gram lookup (host work, 2 us a token) and from a drafter (the preset's
    220 us forward): the n-gram row keeps the depth's accept length and pays less per cycle."""
    level = _level(0.7, 0.6, 0.5)
    hist = {"1": 3, "2": 3, "3": 3, "4": 0, "5": 9}
    level["arms"][0].served = {"served_accept_len": 3.33, "accept_histogram": hist}
    level["ngram_served"] = {"served_accept_len": 3.33, "accept_histogram": hist, "draft_step_us": 2.0,
                             "config": {"drafter": "n-gram lookup (2..4)"}}
    tables = {d["label"]: d["tables"] for d in report.speed_tables(level)}
    assert set(tables) == {"(a)", "n-gram lookup, no drafter"}
    for x, rows in tables["(a)"].items():
        for drafter_row, ngram_row in zip(rows, tables["n-gram lookup, no drafter"][x]):
            assert ngram_row["accept"] == drafter_row["accept"]
            assert ngram_row["spec_tok_s"] > drafter_row["spec_tok_s"]
    level["ngram_across_served"] = {"served_accept_len": 1.665, "accept_histogram": {"1": 1, "2": 1},
                                    "config": {"drafter": "n-gram lookup (2..4, across prompts)"}}
    assert len(report.speed_tables(level)) == 3
    line = report._ngram_line(level)[0]
    assert "(tokens per verify step): n-gram lookup (2..4) 3.33; n-gram lookup (2..4, across prompts) 1.67." in line
    assert line.endswith("The best arm serves 3.33 (1.00x the better lookup).")
    assert report._ngram_line(_level(0.7, 0.6, 0.5)) == []
    level["arms"][0].served = None  # no arm served: the bar alone (max() of no arms was a ValueError)
    assert report._ngram_line(level) == [line.split(" The best arm")[0], ""]


def _study_level(a_acc, b_acc, zero_shot, pilot_gain=None):
    """A level as run_level returns it, the probe measured at the arms' K (the keys of `zero_shot`)."""
    def arm(key, acc):
        history = [{"split": "val", "step": s, "cond_acc_0": acc, "loss_0": 1.0} for s in (0, 10, 20)]
        return Arm(key, f"({key})", history=history,
                   final={"cond_acc_0": acc, "loss_0": 1.0, "simulated_accept_len": acc})

    probe = {"zero_shot": zero_shot, "vocab": {"same_positions": 1, "size_a": 2, "shared_tokens": 2, "by": "id"},
             "thresholds": dataclasses.asdict(ProbeThresholds()), "verdict": "train from scratch", "reason": "x"}
    if pilot_gain is not None:
        probe["pilot"] = {"steps": 8, "seconds": 1.0, "gain": pilot_gain,
                          "curve": [{"step": 8, "scratch_cond_acc_0": 0.5, "transfer_cond_acc_0": 0.5 + pilot_gain}]}
    return {"drift_knob": 1.0, "pair": {}, "timings": {}, "arms": [arm("a", a_acc), arm("b", b_acc)], "probe": probe}


def test_a_study_at_k_1_reports_the_probes_one_cond_acc():
    """With ttt_steps 1 the probe measures cond_acc_0 alone: the report prints what it has (it read
    cond_acc_1 and failed after every arm had trained)."""
    cfg = dataclasses.replace(get_config("smoke"), ttt_steps=1, served_eval=False)
    level = _study_level(0.3, 0.5, {"cond_acc_0": 0.2, "loss_0": 2.0, "simulated_accept_len": 0.2})
    text = report.render(cfg, [level], None, 1.0)
    assert "- zero-shot on the new target: simulated accept 0.20, cond_acc_0 0.200\n" in text


def test_the_report_says_when_the_vocabs_were_compared_by_token():
    level = _study_level(0.3, 0.5, {"cond_acc_0": 0.2, "cond_acc_1": 0.1, "simulated_accept_len": 0.2})
    lines = report._probe_section(level)
    assert "- vocab: 1 of 2 draft positions mean the same target token; 2 tokens shared" in lines
    level["probe"]["vocab"]["by"] = "token"
    assert ("- vocab: 1 of 2 draft positions mean the same target token; 2 tokens shared (compared by token "
            "string: the targets' tokenizers differ)") in report._probe_section(level)


def test_a_source_that_gets_nothing_accepted_is_no_reuse():
    """Scratch at 0 accept length: 0 >= 0.95 * 0 made the untouched source "reuse as is"; a source that
    gets something accepted where scratch gets nothing still is."""
    level = _study_level(0.0, 0.2, {"simulated_accept_len": 0.0})
    assert report.measured_outcome(level)[0] == "transfer with remap"
    level["probe"]["zero_shot"]["simulated_accept_len"] = 0.1
    assert report.measured_outcome(level)[0] == "reuse as is"


def test_a_lead_just_under_the_margin_is_printed_under_it():
    """0.996 points is under the 1-point line: printed "+1.0" it read as at the line, next to "< 1" and
    "within 1 point". Each figure keeps the digits that show its side; others keep one decimal."""
    level = _study_level(0.5, 0.50996, {"cond_acc_0": 0.2, "cond_acc_1": 0.1, "simulated_accept_len": 0.2},
                         pilot_gain=0.00996)
    assert "(b) and (a) are within 1 point (+0.996): the transfer buys nothing." in \
        report.decisions(level, get_config("drift-sweep"))
    verdict, reason = decide(0.2, None, None, ProbeThresholds(), level["probe"]["pilot"])
    assert verdict == "train from scratch" and "= +0.996 points at steps 8 (< 1 at the end)" in reason
    text = report.render(get_config("drift-sweep"), [level], None, 1.0)
    assert "transfer - scratch in val cond_acc_0 = +0.996 points at steps 8" in text
    assert "**Measured outcome: train from scratch** (transfer gain (b) - (a) = +0.996 points" in text
    rows = report.sweep_table(report.sweep_points([level]))
    assert "| +0.996 | +0.996 | train from scratch | train from scratch |" in rows[2]
    assert "within 1 point (-0.5)" in report.decisions(_study_level(0.5, 0.495, {"simulated_accept_len": 0.0}),
                                                       get_config("drift-sweep"))[0]
