"""report.md for a study: per-arm tables, the seeds' decisions taken from the numbers, the probe's
verdict next to the measured outcome, and the drift sweep."""

from __future__ import annotations

import dataclasses
import math

from drafter_lab.config import to_dict
from drafter_lab.experiments.config import ExperimentConfig, level_name
from drafter_lab.experiments.pilot import lead_closing, lead_text, points_text
from drafter_lab.spec.costinputs import accept_by_steps
from drafter_lab.spec.costmodel import PRESETS, CostModel
from drafter_lab.spec.costreport import best_row, steps_table
from drafter_lab.train.watch import WatchConfig, replay

REUSE_MARGIN = 0.95
"""Measured "reuse": the untouched source drafter keeps >= 95 % of scratch's simulated accept length."""
GAIN_MARGIN = 0.01
"""Measured "transfer pays": (b) beats (a) by at least 1 point of val cond_acc_0 at equal steps (as the
probe's pilot_min_gain is read, so that a lead of exactly the margin gets the same verdict from both)."""
PLATEAU_POINTS = 0.01
"""An arm has plateaued when its val cond_acc_0 rose by less than 1 point over its last half."""
SPEED_PRESET = "seeds-kimi-k2.5-8x-pcie"
"""The deployment the speed section prices each arm's acceptance on."""
FAST_ALLREDUCE_US = 15.0
"""The speed section's fast all-reduce: DESIGN section 5's realistic 8-GPU P2P range is 10-25 us."""


def _val(arm) -> list[dict]:
    return [r for r in arm.history if r.get("split") == "val"]


def _early_loss(arm) -> float | None:
    """loss_0 of the initial weights (validation before step 1), else the first logged train loss."""
    start = [r for r in _val(arm) if r["step"] == 0]
    rows = start or [r for r in arm.history if "loss_0" in r]
    return rows[0]["loss_0"] if rows else None


def _plateau_step(arm) -> int | None:
    """First validation step after which cond_acc_0 never rose by PLATEAU_POINTS again."""
    rows = _val(arm)
    if len(rows) < 4:
        return None
    tail = rows[len(rows) // 2:]
    if tail[-1]["cond_acc_0"] - tail[0]["cond_acc_0"] >= PLATEAU_POINTS:
        return None
    best = max(r["cond_acc_0"] for r in rows)
    return next(r["step"] for r in rows if r["cond_acc_0"] >= best - PLATEAU_POINTS)


def measured_outcome(level: dict) -> tuple[str, float]:
    """What the training runs say one should have done, and the transfer gain (b) - (a)."""
    arms = {a.key: a for a in level["arms"]}
    a, b = arms["a"].final, arms["b"].final
    gain = b["cond_acc_0"] - a["cond_acc_0"]
    zero = level["probe"]["zero_shot"]["simulated_accept_len"]
    # a source that gets nothing accepted is no reuse, even beside a scratch arm that gets nothing either
    if zero > 0 and zero >= REUSE_MARGIN * a["simulated_accept_len"]:
        return "reuse as is", gain
    return ("transfer with remap" if gain >= GAIN_MARGIN else "train from scratch"), gain


def decisions(level: dict, cfg: ExperimentConfig) -> list[str]:
    arms = {a.key: a for a in level["arms"]}
    out = []
    random_level = math.log(cfg.draft_vocab_size)
    lb, lc = _early_loss(arms["b"]), _early_loss(arms["c"]) if "c" in arms else None
    if lb is not None and lc is not None:
        # The remap matters when (c) starts nearer the random level than (b)'s start.
        remap_matters = abs(lc - random_level) < abs(lc - lb)
        verb = "the vocab remap matters" if remap_matters else "the remap changes little here"
        out.append(
            f"(c) starts at loss_0 {lc:.2f} (random level ln {cfg.draft_vocab_size} = {random_level:.2f}) "
            f"vs (b) {lb:.2f}: {verb}."
        )
    fa, fb = arms["a"].final["cond_acc_0"], arms["b"].final["cond_acc_0"]
    diff = 100 * (fb - fa)
    plateau = _plateau_step(arms["b"])
    if diff < -100 * GAIN_MARGIN:
        tail = f", plateau since step {plateau}" if plateau is not None else ""
        out.append(f"(b) trails (a) by {-diff:.1f} points of cond_acc_0 at equal steps{tail}: stop the transfer, "
                   "train from scratch.")
    elif diff >= 100 * GAIN_MARGIN:
        out.append(f"(b) leads (a) by {diff:.1f} points of cond_acc_0 at equal steps: the transfer pays.")
    else:
        out.append(f"(b) and (a) are within {100 * GAIN_MARGIN:.0f} point "
                   f"({points_text(fb - fa, -GAIN_MARGIN, GAIN_MARGIN)}): the transfer buys nothing.")
    trend = _lead_trend(arms["a"], arms["b"])
    if trend:
        out.append(trend)
    out.append(_watch_line(arms["a"], arms["b"]))
    if "d" in arms:
        dd = 100 * (arms["d"].final["cond_acc_0"] - fb)
        out.append(f"L2-SP (d) vs plain transfer (b): {dd:+.1f} points of cond_acc_0.")
    return out


def _lead_trend(a, b) -> str | None:
    """(b) - (a) in val cond_acc_0 at the first, middle and last shared validation steps after 0:
    a lead that shrinks says a longer budget would let scratch catch up."""
    va = {r["step"]: r["cond_acc_0"] for r in _val(a) if r["step"] > 0}
    vb = {r["step"]: r["cond_acc_0"] for r in _val(b) if r["step"] > 0}
    steps = sorted(set(va) & set(vb))
    if len(steps) < 3:
        return None
    picks = [steps[0], steps[len(steps) // 2], steps[-1]]
    leads = [100 * (vb[s] - va[s]) for s in picks]
    if leads[0] * leads[-1] < 0:
        tail = f"the lead reversed: (b) now {'trails' if leads[-1] < 0 else 'leads'}"
    elif lead_closing(leads[0], leads[-1]):
        tail = "the gap is closing: a longer budget may erase it"
    else:
        tail = "the gap holds"
    return (f"(b) - (a) at steps {' / '.join(map(str, picks))}: "
            f"{' / '.join(f'{x:+.1f}' for x in leads)} points; {tail}.")


def watch_stop(a, b) -> tuple[int | None, int, str]:
    """What the watch (`train --stop-if-behind`, default settings) would have done to (b) with (a) as
    its baseline: the arms train to equal budgets, so this replays (b)'s validations. Returns the
    step it would have stopped (b) at (None: never), (b)'s steps, and the watch's reason."""
    steps = max((r["step"] for r in _val(b)), default=0)
    v = replay(b.history, a.history, WatchConfig(), steps)
    return (None, steps, "") if v is None else (v.rows[-1]["step"], steps, v.reason)


def _watch_line(a, b) -> str:
    at, steps, reason = watch_stop(a, b)
    if at is None:
        return "The watch (`train --stop-if-behind` (a), default settings) would not have stopped (b)."
    return (f"The watch (`train --stop-if-behind` (a), default settings) would have stopped (b) at step {at} of "
            f"{steps} ({100 * (1 - at / steps):.0f} % of its steps unspent): {reason}.")


def _arm_table(level: dict, k: int) -> list[str]:
    head = ["arm"] + [f"cond_acc_{i}" for i in range(k)] + [f"loss_{i}" for i in range(k)]
    head += ["sim. accept", "served accept"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for arm in level["arms"]:
        f = arm.final
        served = f"{arm.served['served_accept_len']:.2f}" if arm.served else "-"
        cells = [arm.label] + [f"{f.get(f'cond_acc_{i}', float('nan')):.3f}" for i in range(k)]
        cells += [f"{f.get(f'loss_{i}', float('nan')):.3f}" for i in range(k)]
        cells += [f"{f.get('simulated_accept_len', float('nan')):.2f}", served]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _ngram_line(level: dict) -> list[str]:
    lookups = [s for s in (level.get("ngram_served"), level.get("ngram_across_served")) if s]
    if not lookups:
        return []
    served = "; ".join(f"{s['config']['drafter']} {s['served_accept_len']:.2f}" for s in lookups)
    line = f"The bar without any drafter, n-gram lookup on the same prompts (tokens per verify step): {served}."
    arms = [a.served["served_accept_len"] for a in level["arms"] if a.served]
    if arms:  # a level may have lookups but no arm served (built by hand, or an arm's served eval failed)
        best, bar = max(arms), max(s["served_accept_len"] for s in lookups)
        line += f" The best arm serves {best:.2f} ({best / bar:.2f}x the better lookup)."
    return [line, ""]


def speed_tables(level: dict) -> list[dict]:
    """Each drafter with a served accept histogram, priced on SPEED_PRESET: its label, served accept
    length and draft-steps table (cost model) with the preset's all-reduces and with
    FAST_ALLREDUCE_US ones, keyed by that latency."""
    drafters = [(arm.label, arm.served) for arm in level["arms"]]
    drafters.append(("source drafter, zero-shot", level.get("source_served_zero_shot")))
    drafters.append(("n-gram lookup, no drafter", level.get("ngram_served")))
    drafters.append(("n-gram lookup across prompts", level.get("ngram_across_served")))
    preset = PRESETS[SPEED_PRESET]
    out = []
    for label, served in drafters:
        if not (served and served.get("accept_histogram")):
            continue
        # n-gram lookup is host work, measured by the eval with its no-match share: they replace the
        # preset's drafter forward and its "always drafts"
        host = {k: served[k] for k in ("draft_step_us", "no_draft_share") if k in served}
        priced = dataclasses.replace(preset, accept_by_steps=accept_by_steps(served["accept_histogram"], None), **host)
        out.append({"label": label, "served_accept_len": served["served_accept_len"],
                    "tables": {x: steps_table(priced, x) for x in (preset.verify_allreduce_us, FAST_ALLREDUCE_US)}})
    return out


def _speed_section(level: dict, cfg: ExperimentConfig, plot: str | None) -> list[str]:
    """Each drafter's served accept histogram priced by the cost model at its best chain depth."""
    drafters = speed_tables(level)
    if not drafters:
        return []
    preset = PRESETS[SPEED_PRESET]
    lines = [
        "### What the served accept lengths buy on the seeds' box (cost model)",
        "",
        f"A chain's served accept histogram at {cfg.served_steps} steps gives its accept length at every depth up "
        f"to {cfg.served_steps}; the cost model (`{SPEED_PRESET}`: plain decoding "
        f"{CostModel(preset).baseline_tok_s():.0f} tok/s, verify all-reduces {preset.verify_allreduce_us:g} us) "
        f"picks the depth with the most tok/s, with those all-reduces and with {FAST_ALLREDUCE_US:g} us ones. "
        "These are the tiny drafters' acceptance on the big box's timings: a what-if, not a measurement.",
        "",
        f"| drafter | served accept | {preset.verify_allreduce_us:g} us all-reduces: depth, tok/s (vs plain) "
        f"| {FAST_ALLREDUCE_US:g} us: depth, tok/s (vs plain) |",
        "|---|---|---|---|",
    ]
    for d in drafters:
        cells = [best_row(rows) for rows in d["tables"].values()]
        lines.append(f"| {d['label']} | {d['served_accept_len']:.2f} | "
                     + " | ".join(f"{b['steps']}: {b['spec_tok_s']:.0f} ({b['speedup']:.2f}x)" for b in cells) + " |")
    return lines + (["", f"![tok/s by draft depth]({plot})"] if plot else [])


def _probe_section(level: dict) -> list[str]:
    p = level["probe"]
    z = p["zero_shot"]
    outcome, gain = measured_outcome(level)
    match = "matches" if outcome == p["verdict"] else "does NOT match"
    accs = [f"{k} {z[k]:.3f}" for k in ("cond_acc_0", "cond_acc_1") if k in z]  # K = 1 has no cond_acc_1
    lines = [f"- zero-shot on the new target: simulated accept {z['simulated_accept_len']:.2f}, " + ", ".join(accs)]
    if p.get("home"):
        lines.append(f"- home (source target, same tokens): simulated accept {p['home']['simulated_accept_len']:.2f}")
    if level.get("source_served_zero_shot"):
        lines.append(f"- zero-shot served accept length (decoded, bonus included): "
                     f"{level['source_served_zero_shot']['served_accept_len']:.2f}")
    v = p["vocab"]
    by = " (compared by token string: the targets' tokenizers differ)" if v["by"] == "token" else ""
    lines.append(f"- vocab: {v['same_positions']} of {v['size_a']} draft positions mean the same target token; "
                 f"{v['shared_tokens']} tokens shared{by}")
    if p.get("aux_cka"):
        lines.append("- aux-layer CKA (source vs new target): " + ", ".join(f"{c:.3f}" for c in p["aux_cka"]))
    if p.get("pilot"):
        lines.append(f"- pilot ({p['pilot']['steps']} steps per arm, {p['pilot']['seconds']:.0f} s): "
                     f"transfer - scratch in val cond_acc_0 = "
                     f"{lead_text(p['pilot'], p['thresholds']['pilot_min_gain'])}")
    lines += [
        "",
        f"**Probe verdict: {p['verdict']}** ({p['reason']}).",
        f"**Measured outcome: {outcome}** (transfer gain (b) - (a) = {points_text(gain, GAIN_MARGIN)} points of "
        "cond_acc_0). "
        f"The verdict {match} the measurement.",
    ]
    return lines


def sweep_points(levels: list[dict]) -> list[dict]:
    points = []
    for lv in levels:
        outcome, gain = measured_outcome(lv)
        ckas = lv["probe"].get("aux_cka")  # None without a home signal: unknown, not zero drift
        points.append({
            "drift_knob": lv["drift_knob"],
            "drift": 1.0 - sum(ckas) / len(ckas) if ckas else None,
            "min_cka": min(ckas) if ckas else None,
            "zero_shot_accept": lv["probe"]["zero_shot"]["simulated_accept_len"],
            "gain": gain,
            "pilot_gain": (lv["probe"].get("pilot") or {}).get("gain"),
            "pilot_min_gain": lv["probe"]["thresholds"]["pilot_min_gain"],
            "verdict": lv["probe"]["verdict"],
            "outcome": outcome,
            "verdict_matches": outcome == lv["probe"]["verdict"],
        })
    return points


def _measured(x: float | None) -> str:
    """A CKA figure of the sweep table; n/a where the probe measured none."""
    return "n/a" if x is None else f"{x:.4f}"


def sweep_table(points: list[dict]) -> list[str]:
    lines = [
        "| drift knob | 1 - mean aux CKA | min aux CKA | zero-shot sim. accept | pilot gain, points "
        "| gain (b)-(a), points | probe verdict | measured | match |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for p in points:
        pilot = "-" if p.get("pilot_gain") is None else points_text(p["pilot_gain"], p["pilot_min_gain"])
        lines.append(
            f"| {level_name(p['drift_knob'])} | {_measured(p['drift'])} | {_measured(p['min_cka'])} | "
            f"{p['zero_shot_accept']:.2f} | "
            f"{pilot} | {points_text(p['gain'], GAIN_MARGIN)} | {p['verdict']} | {p['outcome']} | "
            f"{'yes' if p['verdict_matches'] else 'no'} |"
        )
    hits = sum(p["verdict_matches"] for p in points)
    lines += ["", f"The probe's verdict matched the measured outcome at {hits} of {len(points)} drift levels."]
    return lines


def render(cfg: ExperimentConfig, levels: list[dict], sweep: list[dict] | None, elapsed: float) -> str:
    k = cfg.ttt_steps
    lines = [
        f"# drafter_lab study: {cfg.name}",
        "",
        f"Target pair preset `{cfg.target_preset}`; every arm trains {cfg.arm_steps} steps of batch "
        f"{cfg.batch_size} on the tuned target's own regenerated data, seed {cfg.seed}. "
        f"Wall time of this invocation {elapsed / 60:.1f} min (cached stages and finished arms count as their "
        f"lookup). Accept lengths: *simulated* = sum_k prod_j<=k cond_acc_j "
        f"(offline, no bonus token); *served* = tokens per verify step when decoding, bonus included "
        f"(chain, {cfg.served_steps} steps).",
        "",
    ]
    for lv in levels:
        if len(levels) > 1:
            lines += [f"## Drift knob {level_name(lv['drift_knob'])}", ""]
        drift = lv["pair"].get("drift_figures", {}).get("all")
        if drift:
            lines += [f"Target drift (tuned vs base): KL {drift.get('kl', float('nan')):.4f}; "
                      f"per-layer CKA {', '.join(f'{c:.3f}' for c in drift.get('cka', []))}", ""]
        lines += ["### Arms (final validation)", ""] + _arm_table(lv, k) + [""] + _ngram_line(lv)
        lines += ["### Decisions, taken from the numbers", ""] + [f"- {d}" for d in decisions(lv, cfg)] + [""]
        prefix = "" if len(levels) == 1 else f"drift-{level_name(lv['drift_knob'])}/"
        speed = _speed_section(lv, cfg, f"{prefix}speed.png")
        lines += speed + ([""] if speed else [])
        lines += ["### Phase-0 probe", ""] + _probe_section(lv) + [""]
        lines += [f"![learning curves]({prefix}curves.png)", "", f"![cond_acc_k]({prefix}cond_acc_k.png)", ""]
        lines += ["Stage times: " + ", ".join(f"{n} {v:.0f}s" for n, v in lv["timings"].items()), ""]
    if sweep:
        lines += ["## Drift sweep: when does transferring a drafter pay?", ""] + sweep_table(sweep)
        lines += ["", "![drift sweep](drift_sweep.png)", ""]
    lines += ["## Config", "", "```", *(f"{k_} = {v!r}" for k_, v in to_dict(cfg).items()), "```", ""]
    return "\n".join(lines)


def results_json(levels: list[dict], sweep: list[dict] | None, elapsed: float) -> dict:
    def arm(a):
        return {"key": a.key, "label": a.label, "final": a.final, "served": a.served, "transfer": a.transfer}

    return {
        "elapsed_s": elapsed,
        "levels": [
            {**{k: v for k, v in lv.items() if k != "arms"}, "arms": [arm(a) for a in lv["arms"]],
             "measured_outcome": measured_outcome(lv)[0]}
            for lv in levels
        ],
        "sweep": sweep,
    }
