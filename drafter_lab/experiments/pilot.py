"""The probe's pilot: scratch and transfer-with-remap trained side by side for a few steps.

Similarity signals (aux CKA, zero-shot acceptance) only hint at whether a transfer will pay: CKA
ignores rotations of the feature basis that the source fc cannot, and the midlayer and lm_head carry
priors that no feature statistic sees. The pilot measures the question itself at a small budget:
both arms get the same recipe, data order and steps on the new target's train split and are
validated on its held-out split, from step 0 on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import tempfile
import time
from pathlib import Path

from drafter_lab.drafter.config import DrafterConfig
from drafter_lab.drafter.formats import rope_scaling_text
from drafter_lab.train.config import TrainConfig
from drafter_lab.train.loop import train
from drafter_lab.train.metrics_log import read_metrics

ARMS = {"scratch": False, "transfer": True}
"""Pilot arm -> whether it starts from the source drafter (with the row-by-row lm_head remap)."""


def pilot_config(recipe: TrainConfig, steps: int, source: DrafterConfig) -> TrainConfig:
    """`recipe` cut to `steps`, validated at 0 and every quarter, in the source drafter's shape,
    residual variant, RoPE and draft-vocab size so that every transferred tensor fits and works as it did.
    Warmup takes at most a fifth of the pilot, so that, like the full run, it spends most of its steps
    near the peak learning rate. No scan of the whole feature set: the pilot reads a few batches, each
    checked as it is read."""
    return dataclasses.replace(
        recipe, max_steps=steps, epochs=10_000, eval_every=max(1, steps // 4), eval_at_start=True,
        scan_features=False,
        warmup_steps=min(recipe.warmup_steps, steps // 5),
        draft_vocab_size=source.draft_vocab_size, drafter_hidden_size=source.hidden_size,
        drafter_intermediate_size=source.intermediate_size, drafter_heads=source.num_attention_heads,
        drafter_kv_heads=source.num_key_value_heads, drafter_head_dim=source.head_dim,
        drafter_norm_before_residual=source.norm_before_residual,
        drafter_rope_scaling=rope_scaling_text(source.rope_scaling),
    )


def _curve(arm_dir: Path) -> dict[int, dict]:
    return {r["step"]: r for r in read_metrics(arm_dir) if r.get("split") == "val"}


def run_pilot(drafter_dir, target_dir, data_dir, cfg: TrainConfig, out_dir=None,
              transfer_lr_scale: float = 1.0, target=None, val_data=None, source_target=None) -> dict:
    """Train both arms with `cfg` (see `pilot_config`) and return their validation curves.

    `out_dir` keeps the arms (and resumes them when re-run); without it they go to a temporary
    directory that is removed afterwards. `target`: the target's head, if loaded already.
    `val_data`: the arms validate on it (train's `val_data`); `source_target`: the transfer's (train's)."""
    t0 = time.time()
    place = (contextlib.nullcontext(out_dir) if out_dir is not None
             else tempfile.TemporaryDirectory(prefix="drafter-lab-pilot-"))
    with place as where:
        root = Path(where)
        curves = {}
        for name, transfer in ARMS.items():
            train(cfg, target_dir, data_dir, root / name, resume=True,
                  init_from=drafter_dir if transfer else None, transfer_lr_scale=transfer_lr_scale if transfer else 1.0,
                  target=target, val_data=val_data, source_target=source_target if transfer else None)
            curves[name] = _curve(root / name)
    steps = sorted(set(curves["scratch"]) & set(curves["transfer"]))
    curve = [{"step": s, **{f"{name}_{key}": curves[name][s][key] for name in ARMS
                            for key in ("cond_acc_0", "simulated_accept_len")}} for s in steps]
    last = curve[-1]
    return {
        "steps": cfg.max_steps,
        "batch_size": cfg.batch_size,
        "curve": curve,
        "gain": last["transfer_cond_acc_0"] - last["scratch_cond_acc_0"],
        "transfer_lr_scale": transfer_lr_scale,
        "seconds": round(time.time() - t0, 1),
    }


def points_text(x: float, *lines: float) -> str:
    """`x` (a fraction) in signed points to one decimal, or to as many as keep it on its side of each
    of `lines` (fractions, each read as `x >= line`): a lead of 0.996 points under a 1-point line
    reads "+0.996", not "+1.0"."""
    p = 100 * x
    for digits in range(1, 16):
        text = f"{p:+.{digits}f}"
        if all((float(text) >= 100 * line) == (x >= line) for line in lines):
            return text
    return f"{p:+.17g}"  # nearer a line than 15 decimals show: the float itself


def lead_text(pilot: dict, line: float) -> str:
    """The transfer's lead in points of val cond_acc_0 along the pilot, each on its side of `line`
    (the gain the verdict asks for), e.g. "+36.1 / +12.0 / +7.4 at steps 12 / 24 / 48"."""
    rows = [r for r in pilot["curve"] if r["step"] > 0]
    leads = [r["transfer_cond_acc_0"] - r["scratch_cond_acc_0"] for r in rows]
    return (" / ".join(points_text(x, line) for x in leads) + " points at steps "
            + " / ".join(str(r["step"]) for r in rows))


def lead_closing(first: float, last: float) -> bool:
    """A lead that kept its sign but fell under half its first value: a longer budget may erase it."""
    return first * last >= 0 and abs(last) < 0.5 * abs(first)


def closing(pilot: dict) -> bool:
    """`lead_closing` from the pilot's first validation after step 0 to its last."""
    rows = [r for r in pilot["curve"] if r["step"] > 0]
    return lead_closing(*(r["transfer_cond_acc_0"] - r["scratch_cond_acc_0"] for r in (rows[0], rows[-1])))
