"""`drafter-lab reproduce RUN_DIR`: re-run a study from its manifest and list every metric that differs."""

from __future__ import annotations

import json
import math
from pathlib import Path

from drafter_lab.config import from_dict
from drafter_lab.errors import LabError
from drafter_lab.experiments.config import ExperimentConfig
from drafter_lab.experiments.study import run_study


def _load(run_dir: Path) -> tuple[dict, dict]:
    try:
        manifest = json.loads((run_dir / "manifest.json").read_text())
        results = json.loads((run_dir / "results.json").read_text())
    except FileNotFoundError as e:
        raise LabError(f"not a finished run: {Path(e.filename).name} is missing", run_dir) from None
    except json.JSONDecodeError as e:
        raise LabError(f"run files are not valid JSON ({e})", run_dir) from None
    return manifest, results


def flat_metrics(results: dict) -> dict[str, float]:
    """Every number a study reports, keyed by where it sits (level / arm / metric)."""
    out = {}
    for lv in results["levels"]:
        prefix = f"drift {lv['drift_knob']:g}"
        for arm in lv["arms"]:
            for k, v in arm["final"].items():
                if isinstance(v, int | float):
                    out[f"{prefix} / arm {arm['key']} / {k}"] = float(v)
            for k, v in (arm.get("served") or {}).items():
                if k == "served_accept_len":
                    out[f"{prefix} / arm {arm['key']} / served_accept_len"] = float(v)
        for k, v in lv["probe"]["zero_shot"].items():
            if isinstance(v, int | float):
                out[f"{prefix} / probe zero-shot / {k}"] = float(v)
        out[f"{prefix} / probe verdict"] = lv["probe"]["verdict"]
    return out


def compare(a: dict, b: dict, rel_tol: float = 0.0) -> list[tuple[str, object, object]]:
    diffs = []
    for key in sorted(set(a) | set(b)):
        x, y = a.get(key), b.get(key)
        if isinstance(x, float) and isinstance(y, float):
            if not math.isclose(x, y, rel_tol=rel_tol, abs_tol=0.0 if rel_tol == 0 else 1e-12):
                diffs.append((key, x, y))
        elif x != y:
            diffs.append((key, x, y))
    return diffs


def reproduce(run_dir, runs_root: Path, cache: Path, rel_tol: float = 0.0) -> tuple[Path, list]:
    run_dir = Path(run_dir)
    manifest, before = _load(run_dir)
    cfg = from_dict(ExperimentConfig, manifest["config"], str(run_dir / "manifest.json"))
    new_dir = run_study(cfg, runs_root, cache, run_dir=runs_root / f"{run_dir.name}-repro",
                        command=["drafter-lab", "reproduce", str(run_dir)])
    _, after = _load(new_dir)
    return new_dir, compare(flat_metrics(before), flat_metrics(after), rel_tol)
