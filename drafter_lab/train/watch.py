"""The watch: compare a training run with a baseline run at equal steps and say when to stop it.

The seeds let a transfer fine-tune train for an epoch after it fell behind a from-scratch run at the
same progress, then killed it by hand (38 % val cond_acc_0 against 74.7 %, flat across epochs).
The probe's pilot cannot make that call: it sees the first ~50 steps, where a transfer's head start
hides the deficit that comes later (README, "The seeds' negative transfer, reproduced"). The watch
makes it while the run trains, by rule:

- each validation of the run after step 0 is matched with the baseline's value at the same step
  (linear between the baseline's validations; steps the baseline has not reached yet are skipped,
  so the baseline may still be training), or at the same count of training tokens read when the
  two runs' batches differ (`watch_axis = "train_tokens"`);
- the run is *behind* at a step when it trails the baseline there by more than `watch_margin`;
- it is told to stop when its last `watch_window` matched validations are all behind and the gap,
  fitted as a line over them, does not close before the run's last step.

`drafter-lab watch RUN --baseline RUN` prints the verdict (exit status 3 for "stop", so a script can
kill the run); `train --stop-if-behind RUN` applies it at every validation of its own run.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from drafter_lab import atomic
from drafter_lab.data.capture_config import ENCODED_HASH, TEMPLATE_HASH, TOKENIZER_HASH, unrecorded
from drafter_lab.errors import LabError
from drafter_lab.train.metrics_log import METRICS, RUN_FILE, read_metrics

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
    watch_axis: str = "step"
    """What equal progress means: "step" (optimizer steps, for runs that draw the same batches) or
    "train_tokens" (training tokens read, for runs whose batch size or batch_tokens differ)."""
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
    """Matched validations: the run's step, `at` (its position on the watch's axis), run, baseline,
    gap (run - baseline, signed so that > 0 is better)."""
    parity: float | None = None
    """Where on the axis the fitted gap over the window reaches zero (None: it is not closing)."""

    def to_json(self) -> dict:
        return {"stop": self.stop, "reason": self.reason, "parity": self.parity, "rows": self.rows}


AXES = {"step": "total_steps", "train_tokens": "total_tokens"}
"""Watch axis -> the run.json key holding the run's planned length on it."""


def lower_is_better(metric: str) -> bool:
    return "loss" in metric


def _is_number(value) -> bool:
    """A JSON number (true and false are ints to Python): what a hand-edited record may have broken."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def val_curve(rows: list[dict], metric: str, where, axis: str = "step") -> list[tuple[int, float, int]]:
    """(position on `axis`, value, step) of the validation rows that scored something, in axis order;
    one line naming `where` when the metric or the axis is absent."""
    val = [r for r in rows if r.get("split") == "val"]
    if val and not any(metric in r for r in val):
        have = ", ".join(k for k in val[0] if isinstance(val[0][k], float) and k not in ("lr", "elapsed_s"))
        raise LabError(f"no validation metric {metric!r} (it has: {have})", where)
    if not all(axis in r for r in val):
        raise LabError(f"its validations do not record {axis!r} (logged before it was kept): use the step axis",
                       where)
    for r in val:  # a hand-edited value: a TypeError in the sort or the interpolation below
        for key in (axis, metric):
            # Positions Infinity or NaN (Python's json reads them): the baseline interpolated at Infinity is NaN,
            # and a NaN gap counted as behind.
            if key in r and not (_is_number(r[key]) and (key != axis or math.isfinite(r[key]))):
                raise LabError(f"its validation at step {r.get('step')} has {key} {json.dumps(r[key])}, "
                               "not a number", where)
    # A validation that scored no position measured nothing: its accuracies read 0, not NaN.
    out = {r[axis]: (float(r[metric]), r["step"]) for r in val
           if metric in r and math.isfinite(r[metric]) and r.get("positions") != 0}
    return [(x, v, step) for x, (v, step) in sorted(out.items())]


def value_at(curve: list[tuple], x: float) -> float | None:
    """The curve (points (x, value, ...)) at `x`, linear between its points; None outside them."""
    for (x0, v0, *_), (x1, v1, *_) in zip(curve, curve[1:]):
        if x0 <= x <= x1:
            return v0 + (v1 - v0) * (x - x0) / (x1 - x0)
    if curve and curve[-1][0] == x:
        return curve[-1][1]
    return None


def matched(run: list[tuple], base: list[tuple], metric: str) -> list[dict]:
    sign = -1.0 if lower_is_better(metric) else 1.0
    rows = []
    for x, value, step in run:
        ref = value_at(base, x)
        if x > 0 and ref is not None:
            rows.append({"step": step, "at": x, "run": value, "baseline": ref, "gap": sign * (value - ref)})
    return rows


def _gap_text(gaps: list[float], metric: str) -> str:
    """Signed gaps as the metric reads: points of an accuracy (acc_k, cond_acc_k, sampled_acc_k),
    tokens of an accept length, else plain values."""
    if re.search(r"(^|_)acc_\d+$", metric):
        return " / ".join(f"{100 * g:+.1f}" for g in gaps) + " points"
    return " / ".join(f"{g:+.3g}" for g in gaps) + (" tokens" if "accept_len" in metric else "")


def _parity(rows: list[dict]) -> float | None:
    """Where on the axis the least-squares line through (at, gap) reaches 0, if it rises toward it (one
    point, a window of one, has no line: None)."""
    n = len(rows)
    xs, ys = [r["at"] for r in rows], [r["gap"] for r in rows]
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx > 0 else 0.0
    if slope <= 0:
        return None
    return mx - my / slope


def _at_text(values: list[float], axis: str) -> str:
    if axis == "step":
        return f"step{'s' if len(values) > 1 else ''} " + " / ".join(str(v) for v in values)
    return " / ".join(f"{v:,.0f}" for v in values) + " training tokens"


def check_watch(cfg: WatchConfig) -> None:
    """Settings that mean nothing, refused before any run is read."""
    if cfg.watch_window < 1:
        raise LabError(f"watch_window must be >= 1, got {cfg.watch_window}")
    if not 0 <= cfg.watch_margin < math.inf:  # nan and inf too
        raise LabError(f"watch_margin must be >= 0, got {cfg.watch_margin}")
    if cfg.watch_axis not in AXES:
        raise LabError(f"watch_axis must be one of {', '.join(AXES)}, got {cfg.watch_axis!r}")


def judge(run_rows: list[dict], base_rows: list[dict], cfg: WatchConfig, total: float | None,
          run_where=None, base_where=None) -> Verdict:
    """The verdict on `run_rows` (a metrics.jsonl, possibly still growing) against `base_rows`.
    `total`: the run's planned length on the watch's axis (None: unknown, so only a gap that is not
    closing at all counts). The `*_where` name the files in errors."""
    check_watch(cfg)
    m, axis = cfg.watch_metric, cfg.watch_axis
    rows = matched(val_curve(run_rows, m, run_where, axis), val_curve(base_rows, m, base_where, axis), m)
    if len(rows) < cfg.watch_window:
        return Verdict(False, f"too early: {len(rows)} of {cfg.watch_window} validations matched with the "
                              "baseline", rows)
    window = rows[-cfg.watch_window:]
    last = window[-1]
    head = f"{m} {_gap_text([last['gap']], m)} against the baseline at {_at_text([last['at']], axis)}"
    if any(r["gap"] >= -cfg.watch_margin for r in window):
        return Verdict(False, f"{head}: not behind at each of the last {cfg.watch_window} validations", rows)
    parity = _parity(window)
    behind = f"behind at {_at_text([r['at'] for r in window], axis)} ({_gap_text([r['gap'] for r in window], m)})"
    if parity is not None and (total is None or parity <= total):
        return Verdict(False, f"{head}: {behind} but closing, parity near {_at_text([round(parity)], axis)}",
                       rows, parity)
    closing = ("not closing" if parity is None
               else f"closing too slowly (parity near {_at_text([round(parity)], axis)}, after the run's "
                    f"{total:,.0f})")
    return Verdict(True, f"{head}: {behind}, {closing}", rows, parity)


def replay(run_rows: list[dict], base_rows: list[dict], cfg: WatchConfig, total: float | None) -> Verdict | None:
    """The first verdict "stop" the watch would have given along a finished run, or None. Like train's,
    it judges no validation at the run's last step (`total` on the watch's axis): the run is over there."""
    val = [r for r in run_rows if r.get("split") == "val"]
    for i in range(1, len(val) + 1):
        if total is not None and val[i - 1].get(cfg.watch_axis, 0) >= total:
            continue
        v = judge(val[:i], base_rows, cfg, total)
        if v.stop:
            return v
    return None


def read_run(run_dir) -> tuple[list[dict], dict]:
    """A run directory's metrics (a half-written last line is skipped: the run may be training) and its
    run.json (empty for a run that has not written it yet)."""
    run_dir = Path(run_dir)
    path, info = run_dir / METRICS, run_dir / RUN_FILE
    # Unreadable (permissions, I/O) or removed since the checks: one line, not an OSError's traceback
    # (under train's watch, rank 0's alone, which left the other ranks waiting in its sum). exists() raises
    # too where it cannot look (a directory it may not search, a name too long): named where it looked.
    try:
        if not path.exists():
            raise LabError(f"no {METRICS}: not a training run directory", run_dir)
        record = atomic.read_json(info, "removed as it was read") if info.exists() else {}
    except OSError as e:
        raise LabError(f"cannot be read ({e.strerror or e})", e.filename or info) from None
    if not isinstance(record, dict):
        raise LabError("not a run record (a JSON object)", info)
    # Hand-edited: the watch's TypeError comparing steps with a total, or AttributeError comparing settings.
    for key in AXES.values():
        if key in record and not _is_number(record[key]):
            raise LabError(f"not a run record: its {key} {json.dumps(record[key])} is not a number", info)
    for key in ("config", "features"):
        if not isinstance(record.get(key, {}), dict):
            raise LabError(f"not a run record: its {key} is not a JSON object", info)
    if not isinstance(record.get("features", {}).get("val", {}), dict):  # unequal_validation looks inside it
        raise LabError("not a run record: its features.val is not a JSON object", info)
    try:
        return read_metrics(path), record
    except OSError as e:
        raise LabError(f"cannot be read ({e.strerror or e})", path) from None


def unequal_batches(run_info: dict, base_info: dict) -> str | None:
    """Equal steps mean equal data only when both runs draw batches alike: a note when they do not."""
    a, b = run_info.get("config", {}), base_info.get("config", {})
    diff = [f"{k} {a.get(k)} vs {b.get(k)}" for k in ("batch_size", "batch_tokens") if a.get(k) != b.get(k)]
    return f"the runs' batches differ ({', '.join(diff)}): equal steps are not equal data; --watch-axis train_tokens compares equal data" if diff else None


SPLIT_OF = ("manifest_sha256", "sha256", "val_fraction", "max_length")
"""The identity keys that fix a run's val split: captured features (their manifest), or an online
run's conversations file, its split and the length that decides which conversations it skips."""

RENDERED_BY = (TEMPLATE_HASH, "chat_template_kwargs", TOKENIZER_HASH)
"""How an online run renders and tokenizes its conversations, its validation set's too: one file
rendered with another chat template, other variables or another tokenizer is other text (captured
features hold it in their manifest)."""

ENCODED_BY = ("turns", "token_exact", "max_length")
"""Settings that change which sequences an online run's conversations encode to (turns and token_exact
absent: every turn in one sequence, as text); `encoded_sha256` names the sequences themselves."""


def _differences(a: dict, b: dict, keys) -> str:
    def shown(v):
        return "none" if v is None else json.dumps(v) if isinstance(v, dict) else v
    return ", ".join(f"{k} {shown(a.get(k))} vs {shown(b.get(k))}" for k in keys if a.get(k) != b.get(k))


def unequal_validation(run_info: dict, base_info: dict) -> str | None:
    """Metrics compare only on one validation set: a note when one run validates on a set of its own
    (`--val-data`) and the other on its data's val split, both on sets of their own that differ, both
    on the val splits of different data of one kind (two feature directories, two online files, one
    file split otherwise), or two online runs validating on conversations render or encode them otherwise."""
    a, b = (info.get("features", {}) for info in (run_info, base_info))
    if "val" in a or "val" in b:
        if a.get("val") != b.get("val"):
            where = [f.get("val_data", "its data's val split") for f in (a, b)]
            return f"the runs validate on different sets ({where[0]} vs {where[1]}): their metrics do not compare"
    elif all((k in a) == (k in b) for k in SPLIT_OF) and any(a.get(k) != b.get(k) for k in SPLIT_OF):
        where = [f.get("dir", f.get("online")) for f in (a, b)]
        what = f"{where[0]} vs {where[1]}" if where[0] != where[1] else f"{where[0]}: {_differences(a, b, SPLIT_OF)}"
        return f"the runs validate on the val splits of different data ({what}): their metrics do not compare"
    if "manifest_sha256" in a.get("val", {}):  # both on one held-out feature set, whatever text they train on
        return None
    # Online runs name their template (captured ones, in their manifest); those from before 2026-12-02 do not,
    # nor their tokenizer before 2026-12-03: what one run does not record is not compared.
    keys = [k for k in RENDERED_BY if k not in unrecorded(a, b) + unrecorded(b, a)]
    if all(TEMPLATE_HASH in f for f in (a, b)) and any(a.get(k) != b.get(k) for k in keys):
        return (f"the runs render their conversations otherwise ({_differences(a, b, keys)}): they validate "
                "on other text, and their metrics do not compare")
    # Rendered alike, encoded otherwise: other --turns, --token-exact or --max-length, or another lab or
    # transformers version. The hash covers the training sequences too: for runs on other training files
    # validating on one held-out file, only the settings tell.
    if all(ENCODED_HASH in f for f in (a, b)) and a[ENCODED_HASH] != b[ENCODED_HASH]:
        why = _differences(a, b, ENCODED_BY)
        if why or a.get("sha256") == b.get("sha256"):
            why = why or "the same settings: another lab or transformers version"
            return (f"the runs' conversations encode to other sequences ({why}): they validate on other sequences, "
                    "and their metrics do not compare")
    return None


def comparison_note(run_info: dict, base_info: dict, axis: str) -> str | None:
    """What makes a run's validations and its baseline's unequal, if anything (for the verdict)."""
    unknown = [who for who, info in (("the run", run_info), ("the baseline", base_info)) if not info]
    if unknown:  # compared field by field, its missing settings read as "batch_size 4 vs None"
        return (f"{' and '.join(unknown)} {'has' if len(unknown) == 1 else 'have'} no {RUN_FILE} yet: whether "
                "the batches and validation sets match is unknown")
    notes = [unequal_batches(run_info, base_info) if axis == "step" else None, unequal_validation(run_info, base_info)]
    return "; ".join(n for n in notes if n) or None


WATCH_FILE = "watch.json"
"""The watch's verdict where it stopped a run (in the run directory)."""


def stopped_at(out_dir: Path) -> int | None:
    """The step at which the watch stopped the run in `out_dir`, if it did."""
    path = out_dir / WATCH_FILE
    if not path.exists():
        return None
    verdict = atomic.read_json(path, "removed as it was read")
    step = verdict.get("step") if isinstance(verdict, dict) else None
    # true is an int to Python, not a step; a negative one is no step a run reaches, so never the run's own
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise LabError("not the watch's verdict (a JSON object with the step >= 0 it stopped at)", path)
    return step
