"""`drafter-lab reproduce RUN_DIR`: re-run a study from its manifest and list every metric that differs."""

from __future__ import annotations

import math
from pathlib import Path

from drafter_lab import atomic
from drafter_lab.config import from_dict
from drafter_lab.errors import LabError
from drafter_lab.experiments.config import ExperimentConfig, level_name
from drafter_lab.experiments.study import check_study, new_run_dir, run_study


def _load(run_dir: Path) -> tuple[dict, dict]:
    def read(name: str):
        return atomic.read_json(run_dir / name, f"not a finished run: {name} is missing", run_dir)

    manifest, results = read("manifest.json"), read("results.json")
    if not isinstance(manifest, dict):
        raise LabError(f"a JSON {type(manifest).__name__}, not an object: not a run's manifest",
                       run_dir / "manifest.json")
    if not isinstance(results, dict) or not isinstance(results.get("levels"), list):
        raise LabError('no "levels" list: not a study\'s results', run_dir / "results.json")
    return manifest, results


# Served-evaluation fields that a re-run must match; speeds and seconds are left out on purpose.
SERVED_KEYS = ("served_accept_len", "verify_steps", "spec_tokens", "baseline_tokens", "lossless_check")


def _real(v) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _undefined(v) -> bool:
    """A metric with nothing to measure (a loss over no position, a CKA without variance): NaN, which
    results.json holds as null since its writer keeps to strict JSON (atomic.finite)."""
    return v is None or (isinstance(v, float) and math.isnan(v))


def _numbers(prefix: str, d: dict | None, out: dict) -> None:
    for k, v in (d or {}).items():
        if _real(v) or v is None:  # None: a NaN metric (atomic.finite), read as one
            out[f"{prefix} / {k}"] = math.nan if v is None else v  # an int stays one: counts compare exactly


def _served(prefix: str, served: dict | None, out: dict) -> None:
    if not served:
        return
    for k in SERVED_KEYS:
        if k in served:
            out[f"{prefix} / {k}"] = served[k]
    for n, count in (served.get("accept_histogram") or {}).items():
        out[f"{prefix} / accepted {n}"] = count


def flat_metrics(results: dict) -> dict[str, object]:
    """Every deterministic result of a study, keyed by where it sits (level / part / name): the
    targets' fingerprints and drift figures, the probe, each arm's final validation and served
    evaluation, and the measured outcome. Timings and paths are not results."""
    out: dict[str, object] = {}
    for lv in results["levels"]:
        prefix = f"drift {level_name(lv['drift_knob'])}"
        pair = lv.get("pair") or {}
        # The corpus is a pinned snapshot (targets/corpus.py): its hash changes only with the snapshot.
        if "hash" in (pair.get("corpus") or {}):
            out[f"{prefix} / pair / corpus hash"] = pair["corpus"]["hash"]
        for side in ("base", "tuned"):
            if "fingerprint" in (pair.get(side) or {}):
                out[f"{prefix} / pair / {side} fingerprint"] = pair[side]["fingerprint"]
        for text, fig in (pair.get("drift_figures") or {}).items():
            _numbers(f"{prefix} / pair / drift {text}", {k: v for k, v in fig.items() if k != "cka"}, out)
            for i, c in enumerate(fig.get("cka") or []):
                out[f"{prefix} / pair / drift {text} / cka {i}"] = math.nan if c is None else float(c)
        for arm in lv["arms"]:
            _numbers(f"{prefix} / arm {arm['key']}", arm["final"], out)
            _served(f"{prefix} / arm {arm['key']} / served", arm.get("served"), out)
        _served(f"{prefix} / source drafter zero-shot / served", lv.get("source_served_zero_shot"), out)
        _served(f"{prefix} / n-gram lookup / served", lv.get("ngram_served"), out)
        _served(f"{prefix} / n-gram lookup across prompts / served", lv.get("ngram_across_served"), out)
        probe = lv["probe"]
        _numbers(f"{prefix} / probe zero-shot", probe["zero_shot"], out)
        _numbers(f"{prefix} / probe home", probe.get("home"), out)
        for i, c in enumerate(probe.get("aux_cka") or []):
            out[f"{prefix} / probe / aux cka {i}"] = math.nan if c is None else float(c)
        for row in (probe.get("pilot") or {}).get("curve", []):
            _numbers(f"{prefix} / probe / pilot step {row['step']}", {k: v for k, v in row.items() if k != "step"}, out)
        out[f"{prefix} / probe verdict"] = probe["verdict"]
        if "measured_outcome" in lv:
            out[f"{prefix} / measured outcome"] = lv["measured_outcome"]
    return out


def _metrics(results: dict, path: Path) -> dict[str, object]:
    """flat_metrics of a results.json, a file that is not a study's refused naming it."""
    try:
        return flat_metrics(results)
    except (KeyError, TypeError, AttributeError, ValueError) as e:
        raise LabError(f"not a study's results ({type(e).__name__}: {e})", path) from None


class _Absent:
    """`compare`'s value for a key that one run does not hold: None is a metric recorded as null."""

    def __repr__(self) -> str:
        return "absent"


ABSENT = _Absent()


def compare(a: dict, b: dict, rel_tol: float = 0.0) -> list[tuple[str, object, object]]:
    """Every key whose values differ (ABSENT where one run lacks it). `rel_tol` is for rounding, so it
    applies where a value is a float: counts (ints: steps, verify steps, tokens, accept histogram bins)
    and strings must be equal."""
    diffs = []
    for key in sorted(set(a) | set(b)):
        x, y = a.get(key, ABSENT), b.get(key, ABSENT)
        if _undefined(x) and _undefined(y):  # undefined in both runs (NaN or null)
            continue
        if _real(x) and _real(y) and (isinstance(x, float) or isinstance(y, float)):
            x, y = float(x), float(y)
            if not math.isclose(x, y, rel_tol=rel_tol, abs_tol=0.0 if rel_tol == 0 else 1e-12):
                diffs.append((key, x, y))
        elif x != y:
            diffs.append((key, x, y))
    return diffs


def flat_data(manifest: dict) -> dict[str, object]:
    """The manifest's data record (corpus, target and prompt hashes, feature keys, counts), keyed like
    the metrics: an artefact rebuilt differently in a fresh cache shows up here."""
    out = {}

    def walk(prefix: str, node):
        if isinstance(node, dict):
            for k, v in node.items():
                walk(f"{prefix} / {k}", v)
        else:
            out[prefix] = float(node) if isinstance(node, int | float) and not isinstance(node, bool) else node

    walk("data", manifest.get("data") or {})
    return out


def _record(manifest: dict, key: str) -> dict | None:
    """The manifest's `key` record, or None where it holds none or one of another shape (a hand edit): the
    notes are read after the whole re-run, which a TypeError there would throw away."""
    value = manifest.get(key)
    return value if isinstance(value, dict) and value else None


def machine_note(original: dict, again: dict) -> str | None:
    """One line when two manifests name different devices (CPU against GPU, two GPU models), else
    different CPUs or torch CPU instruction sets (digits may then differ for that reason alone); None
    when they agree or the original predates the record."""
    da, db = _record(original, "device"), _record(again, "device")
    if da and db and da != db:
        def device(d, cuda=False):
            return " ".join(filter(None, (d.get("type"), d.get("name") and f"({d['name']})",
                                          cuda and f"with CUDA {d.get('cuda')}")))
        # the same GPU model under another CUDA build would read as the same device twice
        same = device(da) == device(db)
        return (f"the original ran on {device(da, same)}, this run on {device(db, same)}: kernels round differently on "
                "another device and regeneration samples from its own random streams, so data and metrics "
                "may differ for that reason alone")
    a, b = _record(original, "cpu"), _record(again, "cpu")
    if not a or not b or a == b:
        return None

    def name(c):
        return f"{c.get('torch_capability')} ({c.get('model')})"
    return (f"the original ran on {name(a)}, this run on {name(b)}: torch's CPU kernels round differently "
            "across instruction sets, so metrics may differ for that reason alone (compare with --rel-tol)")


def code_note(original: dict, again: dict) -> str | None:
    """One line when the lab's code differs between two manifests (another commit, or a work tree with
    changes on either side, which no commit names); None when both ran one clean commit, or either
    recorded none."""
    a, b = original.get("git"), again.get("git")
    if not (isinstance(a, dict) and isinstance(b, dict) and a.get("sha") and b.get("sha")):
        return None

    def name(g):
        return f"{str(g['sha'])[:12]}{' with uncommitted changes' if g.get('dirty') else ''}"
    if a.get("sha") == b.get("sha") and not a.get("dirty") and not b.get("dirty"):
        return None
    return (f"the original ran the lab at {name(a)}, this run at {name(b)}: results may differ for that "
            "reason alone")


def package_note(original: dict, again: dict) -> str | None:
    """One line naming the recorded packages whose versions differ between two manifests; None when
    none does (a package only one of them recorded is not a difference)."""
    a, b = _record(original, "packages") or {}, _record(again, "packages") or {}
    moved = [f"{name} {a[name]} -> {b[name]}" for name in sorted(set(a) & set(b)) if a[name] != b[name]]
    if not moved:
        return None
    return (f"package versions differ from the original's ({', '.join(moved)}): results may differ for that "
            "reason alone; `nox -s reproduce` installs the versions the run recorded")


def _fresh_dir(runs_root: Path, name: str) -> Path:
    """A directory no other reproduction used, created here (two started at once took one): the study
    resumes arms it finds, which would make a second reproduction compare a run with its own checkpoints."""
    return new_run_dir(runs_root, f"{name}-repro", sep="")


def recorded_config(manifest: dict, run_dir: Path) -> ExperimentConfig:
    """The study config a manifest recorded. Runs made before the probe had a pilot ran none, and
    runs made before the n-gram baseline decoded none, so a missing `probe_pilot_steps` is 0 and a
    missing `ngram_baseline` false, not today's defaults."""
    if not isinstance(manifest.get("config"), dict):
        raise LabError("manifest.json has no config to re-run", run_dir)
    before = {"probe_pilot_steps": 0, "ngram_baseline": False}
    try:
        return from_dict(ExperimentConfig, {**before, **manifest["config"]}, "config")
    except LabError as e:  # a bad value is the manifest's, not an option's
        raise LabError(str(e), run_dir / "manifest.json") from None


def reproduce(run_dir, runs_root: Path, cache: Path, rel_tol: float = 0.0) -> tuple[Path, list]:
    """Re-run the study recorded in `run_dir`/manifest.json into a new directory under `runs_root`;
    returns it and every (key, original, reproduced) metric or data record that differs."""
    if not 0 <= rel_tol < math.inf:  # math.isclose refuses a negative one only after the re-run
        raise LabError(f"--rel-tol must be >= 0 and finite, got {rel_tol}")
    run_dir = Path(run_dir)
    manifest, results = _load(run_dir)
    before = _metrics(results, run_dir / "results.json")
    cfg = recorded_config(manifest, run_dir)
    try:
        check_study(cfg)  # before the re-run's directory is made
    except LabError as e:  # a device or a thread count the recording machine had and this one lacks
        raise LabError(str(e), run_dir / "manifest.json") from None
    # resolved: `reproduce .` inside the run names it by its directory, not by ""
    new_dir = run_study(cfg, runs_root, cache, run_dir=_fresh_dir(runs_root, run_dir.resolve().name),
                        command=["drafter-lab", "reproduce", str(run_dir)])
    manifest_after, after = _load(new_dir)
    diffs = compare(before, _metrics(after, new_dir / "results.json"), rel_tol)
    return new_dir, diffs + compare(flat_data(manifest), flat_data(manifest_after))
