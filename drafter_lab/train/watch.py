"""The watch: compare a training run with a baseline run at equal steps and say when to stop it.

The seeds let a transfer fine-tune train for an epoch after it fell behind a from-scratch run at the
same progress, then killed it by hand (38 % val cond_acc_0 against 74.7 %, flat across epochs).
The probe's pilot cannot make that call: it sees the first ~50 steps, where a transfer's head start
hides the deficit that comes later (README, "The seeds' negative transfer, reproduced"). The watch
makes it while the run trains, by rule:

- each validation of the run after step 0 is matched with the baseline's value at the same step
  (linear between the baseline's validations; steps the baseline has not reached yet are skipped,
  so the baseline may still be training);
- the run is *behind* at a step when it trails the baseline there by more than `watch_margin`;
- it is told to stop when its last `watch_window` matched validations are all behind and the gap,
  fitted as a line over them, does not close before the run's last step.

`drafter-lab watch RUN --baseline RUN` prints the verdict (exit status 3 for "stop", so a script can
kill the run); `train --stop-if-behind RUN` applies it at every validation of its own run.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from drafter_lab.errors import LabError
from drafter_lab.train.metrics_log import METRICS, read_metrics

STOP_EXIT = 3
"""`drafter-lab watch` exit status when the verdict is "stop" (0: keep training)."""


@dataclass
class WatchConfig:
    """What the watch compares and how far behind is too far."""

    watch_metric: str = "cond_acc_0"
    """Validation metric compared (a metrics.jsonl key). Higher is better, except for losses."""
    watch_margin: float = 0.01
    """The run is behind at a step when it trails the baseline by more than this (0.01 = 1 point of
    accuracy, the study's "transfer pays" margin; the tiny pair's 28 held-out sequences put about a
    point of noise on each validation). In the metric's own units: with simulated_accept_len or a
    loss, set one that fits it (e.g. 0.05 tokens)."""
    watch_window: int = 3
    """Consecutive matched validations that must all be behind before the watch says stop. With these
    defaults, on the `seeds-finetune` study (README, "Stopping such a run early"), the transfer at 0.1x
    the rate stopped at step 333 of 2000 and every one of its 62 later validations was behind; the
    one at the full rate, a tie with scratch, was never stopped (two validations over a point behind,
    not three in a row)."""


@dataclass
class Verdict:
    """The watch's answer at the run's latest matched validation."""

    stop: bool
    reason: str
    rows: list[dict] = field(default_factory=list)
    """Matched validations: step, run, baseline, gap (run - baseline, signed so that > 0 is better)."""
    parity_step: float | None = None
    """Where the fitted gap over the window reaches zero (None: it is not closing)."""

    def to_json(self) -> dict:
        return {"stop": self.stop, "reason": self.reason, "parity_step": self.parity_step, "rows": self.rows}


def lower_is_better(metric: str) -> bool:
    return "loss" in metric


def val_curve(rows: list[dict], metric: str, where) -> list[tuple[int, float]]:
    """(step, value) of the validation rows, by step; one line naming `where` when the metric is absent."""
    val = [r for r in rows if r.get("split") == "val"]
    if val and not any(metric in r for r in val):
        have = ", ".join(k for k in val[0] if isinstance(val[0][k], float) and k not in ("lr", "elapsed_s"))
        raise LabError(f"no validation metric {metric!r} (it has: {have})", where)
    out = {r["step"]: float(r[metric]) for r in val if metric in r and math.isfinite(r[metric])}
    return sorted(out.items())


def value_at(curve: list[tuple[int, float]], step: int) -> float | None:
    """The curve at `step`, linear between its points; None outside them."""
    for (s0, v0), (s1, v1) in zip(curve, curve[1:]):
        if s0 <= step <= s1:
            return v0 + (v1 - v0) * (step - s0) / (s1 - s0)
    if curve and curve[-1][0] == step:
        return curve[-1][1]
    return None


def matched(run: list[tuple[int, float]], base: list[tuple[int, float]], metric: str) -> list[dict]:
    sign = -1.0 if lower_is_better(metric) else 1.0
    rows = []
    for step, value in run:
        ref = value_at(base, step)
        if step > 0 and ref is not None:
            rows.append({"step": step, "run": value, "baseline": ref, "gap": sign * (value - ref)})
    return rows


def _gap_text(gaps: list[float], metric: str) -> str:
    """Signed gaps as the metric reads: points of an accuracy, else plain values."""
    if "acc" in metric:
        return " / ".join(f"{100 * g:+.1f}" for g in gaps) + " points"
    return " / ".join(f"{g:+.3g}" for g in gaps)


def _parity(rows: list[dict]) -> float | None:
    """Step where the least-squares line through (step, gap) reaches 0, if it rises toward it."""
    n = len(rows)
    xs, ys = [r["step"] for r in rows], [r["gap"] for r in rows]
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx > 0 else 0.0
    if slope <= 0:
        return None
    return mx - my / slope


def judge(run_rows: list[dict], base_rows: list[dict], cfg: WatchConfig, total_steps: int | None,
          run_where=None, base_where=None) -> Verdict:
    """The verdict on `run_rows` (a metrics.jsonl, possibly still growing) against `base_rows`.
    `total_steps`: the run's planned length (None: unknown, so only a gap that is not closing at
    all counts). The `*_where` name the files in errors."""
    if cfg.watch_window < 1:
        raise LabError(f"watch_window must be >= 1, got {cfg.watch_window}")
    m = cfg.watch_metric
    rows = matched(val_curve(run_rows, m, run_where), val_curve(base_rows, m, base_where), m)
    if len(rows) < cfg.watch_window:
        return Verdict(False, f"too early: {len(rows)} of {cfg.watch_window} validations matched with the "
                              "baseline", rows)
    window = rows[-cfg.watch_window:]
    last = window[-1]
    head = f"{m} {_gap_text([last['gap']], m)} against the baseline at step {last['step']}"
    if any(r["gap"] >= -cfg.watch_margin for r in window):
        return Verdict(False, f"{head}: not behind at each of the last {cfg.watch_window} validations", rows)
    parity = _parity(window) if len(window) > 1 else None
    behind = (f"behind at steps {' / '.join(str(r['step']) for r in window)} "
              f"({_gap_text([r['gap'] for r in window], m)})")
    if parity is not None and (total_steps is None or parity <= total_steps):
        return Verdict(False, f"{head}: {behind} but closing, parity near step {parity:.0f}", rows, parity)
    closing = ("not closing" if parity is None
               else f"closing too slowly (parity near step {parity:.0f}, after the run's {total_steps})")
    return Verdict(True, f"{head}: {behind}, {closing}", rows, parity)


def replay(run_rows: list[dict], base_rows: list[dict], cfg: WatchConfig, total_steps: int | None) -> Verdict | None:
    """The first verdict "stop" the watch would have given along a finished run, or None."""
    val = [r for r in run_rows if r.get("split") == "val"]
    for i in range(1, len(val) + 1):
        v = judge(val[:i], base_rows, cfg, total_steps)
        if v.stop:
            return v
    return None


def read_run(run_dir) -> tuple[list[dict], dict]:
    """A run directory's metrics (a half-written last line is skipped: the run may be training) and its
    run.json (empty for a run that has not written it yet)."""
    run_dir = Path(run_dir)
    path = run_dir / METRICS
    if not path.exists():
        raise LabError(f"no {METRICS}: not a training run directory", run_dir)
    try:
        rows = read_metrics(path)
    except json.JSONDecodeError as e:
        raise LabError(f"not a metrics log ({e})", path) from None
    info = run_dir / "run.json"
    return rows, json.loads(info.read_text()) if info.exists() else {}


def unequal_batches(run_info: dict, base_info: dict) -> str | None:
    """Equal steps mean equal data only when both runs draw batches alike: a note when they do not."""
    a, b = run_info.get("config", {}), base_info.get("config", {})
    diff = [f"{k} {a.get(k)} vs {b.get(k)}" for k in ("batch_size", "batch_tokens") if a.get(k) != b.get(k)]
    return f"the runs' batches differ ({', '.join(diff)}): equal steps are not equal data" if diff else None
