"""The seeds' study as one command: build the pair, regenerate data, train a source drafter, probe,
then train every arm on the new target with equal budgets, and write the report.

Arms on `tuned` ("K2.5") data, same seed, same steps:
    (a) scratch             a fresh drafter
    (b) transfer+remap      init from the source ("K2") drafter, lm_head re-indexed row by row
    (c) transfer, no remap  init from the source drafter with its lm_head rows as they were
    (d) transfer+L2-SP      (b) regularised toward its initial weights (when cfg.l2sp > 0)

Targets, features and the source drafter are cached under the cache root by what made them, so a
second run starts at the arms. Each arm trains with `resume=True`, so a killed study picks up
where it stopped when re-run with the same `--run-dir`.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from drafter_lab import atomic
from drafter_lab.config import flags_named, to_dict
from drafter_lab.data.capture import prepare_features
from drafter_lab.data.regenerate import SAMPLER
from drafter_lab.data.shards import Manifest
from drafter_lab.errors import LabError
from drafter_lab.experiments import plots, report
from drafter_lab.experiments.config import ExperimentConfig, ProbeConfig, level_name
from drafter_lab.experiments.manifest import build_manifest, device_state, git_state, write_manifest
from drafter_lab.experiments.probe import VERDICTS, probe
from drafter_lab.locks import building
from drafter_lab.progress import log
from drafter_lab.spec.costmodel import PRESETS, CostModel
from drafter_lab.spec.ngram_config import NgramConfig
from drafter_lab.targets.build import build_pair
from drafter_lab.targets.hf import resolve_device
from drafter_lab.targets.presets import resolve as resolve_target
from drafter_lab.threads import check_threads, torch_threads
from drafter_lab.train.config import RESULT_FREE_FIELDS, UNKEYED_DEFAULTS, TrainConfig
from drafter_lab.train.loop import train
from drafter_lab.train.metrics_log import TRANSFER_FILE, read_metrics


@dataclass
class Arm:
    """One training arm of the study and what it produced."""

    key: str
    label: str
    init_from: bool = False
    remap: bool = True
    l2sp: float = 0.0
    history: list = field(default_factory=list)
    final: dict = field(default_factory=dict)
    served: dict | None = None
    transfer: dict | None = None


def arms_for(cfg: ExperimentConfig) -> list[Arm]:
    """The arms `cfg.arms` names (ExperimentConfig checked them: a and b, among a, b, c), d with l2sp."""
    arms = [
        Arm("a", "(a) scratch"),
        Arm("b", "(b) transfer + remap", init_from=True, remap=True),
        Arm("c", "(c) transfer, no remap", init_from=True, remap=False),
    ]
    arms = [a for a in arms if a.key in cfg.arms]
    if cfg.l2sp > 0:
        arms.append(Arm("d", f"(d) transfer + remap + L2-SP {cfg.l2sp:g}", init_from=True, l2sp=cfg.l2sp))
    return arms


def _train_config(cfg: ExperimentConfig, steps: int) -> TrainConfig:
    return TrainConfig(
        ttt_steps=cfg.ttt_steps,
        draft_vocab_size=cfg.draft_vocab_size,
        lr=cfg.lr,
        batch_size=cfg.batch_size,
        max_length=cfg.max_length,
        max_steps=steps,
        epochs=10_000,
        eval_every=cfg.eval_every,
        eval_at_start=True,
        seed=cfg.seed,
        device=cfg.device,
        threads=cfg.threads,
    )


def _source_key(base_feats: Path, cfg: ExperimentConfig) -> str:
    """Cache key of the source drafter: its data and training config, less RESULT_FREE_FIELDS (and
    UNKEYED_DEFAULTS at their defaults)."""
    train_cfg = {k: v for k, v in to_dict(_train_config(cfg, cfg.source_steps)).items()
                 if k not in RESULT_FREE_FIELDS and (k not in UNKEYED_DEFAULTS or UNKEYED_DEFAULTS[k] != v)}
    return atomic.sha256_json([base_feats.name, train_cfg])[:16]


CUT_ANSWERS = {"cut_answers": "end token untrained"}
"""In the features' cache key: features captured before answers recorded their finish_reason
(2026-12-05) trained the end-of-turn token after an answer cut at max_new_tokens, which the target
never wrote. The same settings capture other masks now, so those are not reused."""


def _features(target_dir: Path, prompts: Path, cache: Path, cfg: ExperimentConfig) -> Path:
    """Let the target regenerate its own conversations on the study's device, then capture them (cached
    by settings). Another device type samples from other RNG streams and rounds otherwise, so a non-CPU
    one is in the key; the CPU's key is the one features had before the study ran them on its device."""
    from drafter_lab.targets.fingerprint import fingerprint, legacy_fingerprint

    device = resolve_device(cfg.device)
    settings = dict(max_length=cfg.max_length, regenerate=True, temperature=cfg.regen_temperature,
                    max_new_tokens=cfg.max_new_tokens, regen_batch_size=cfg.regen_batch_size, seed=cfg.seed)
    prompts_sha = atomic.sha256_file(prompts)
    on = [] if device.type == "cpu" else [device.type]
    dirs = [cache / "features" / atomic.sha256_json([name(target_dir), prompts_sha, settings, SAMPLER, CUT_ANSWERS,
                                                     *on])[:16]
            for name in (fingerprint, legacy_fingerprint)]
    out = next((d for d in dirs if d.exists()), dirs[0])  # one a lab naming targets the older way began
    with building(out, f"{target_dir.name} features"):
        prepare_features(target_dir, prompts, out, **settings, device=str(device))
    return out


def _read_history(path: Path) -> list[dict]:
    # read_metrics: a NaN metric is null in the file, and the report and the watch's replay compare NaN
    return read_metrics(path) if path.exists() else []


SERVED_FLAGS = {"steps": "served_steps"}
"""A served evaluation's refusals name `steps` (its argument): the study's field is served_steps
(`experiment --served-steps`)."""


def _check_served(cfg: ExperimentConfig, target_dir: Path, prompts: Path) -> None:
    """Refuse, once the pair is built, served evaluations that would run past the target's positions:
    each would be refused at its start, after the arms' training."""
    if not cfg.served_eval:
        return
    from drafter_lab.data.conversations import read_conversations
    from drafter_lab.spec.engine import SpecConfig, SpecEngine
    from drafter_lab.spec.eval import render_prompts
    from drafter_lab.targets.hf import load_target

    target = load_target(target_dir, device="cpu")
    convs, _ = read_conversations(prompts, prompts=True)
    engine = SpecEngine(target, None, SpecConfig(steps=cfg.served_steps, max_new_tokens=cfg.max_new_tokens))
    with flags_named(SERVED_FLAGS):
        engine.check_positions(render_prompts(target.tokenizer, convs[: cfg.served_prompts], prompts))


def _served(cfg: ExperimentConfig, drafter: Path | NgramConfig, target_dir: Path, prompts: Path) -> dict | None:
    """The served evaluation of a drafter checkpoint, or of n-gram lookup with these settings."""
    if not cfg.served_eval:
        return None
    from drafter_lab.data.conversations import read_conversations
    from drafter_lab.drafter.checkpoint import load_drafter
    from drafter_lab.spec.eval import evaluate as served_eval
    from drafter_lab.spec.ngram import NgramDrafter
    from drafter_lab.targets.hf import load_target

    target = load_target(target_dir, device=cfg.device)  # the study's device, as its arms trained on
    drafter = (NgramDrafter(drafter) if isinstance(drafter, NgramConfig)
               else load_drafter(drafter, target=target, device=target.device))
    convs, _ = read_conversations(prompts, prompts=True)
    with flags_named(SERVED_FLAGS):
        return served_eval(
            target, drafter, convs[: cfg.served_prompts], steps=cfg.served_steps, topk=1,
            draft_tokens=cfg.served_steps, batch=1, max_new_tokens=cfg.max_new_tokens, temperature=0.0,
            seed=cfg.seed,
        )


def run_level(cfg: ExperimentConfig, drift: float, level_dir: Path, cache: Path) -> dict:
    """One drift level: pair, data, source drafter, probe, arms. Returns the level's results."""
    t0 = time.time()
    timings = {}
    pair_dir = cache / "pairs" / f"{cfg.target_preset}-drift{level_name(drift)}"
    with building(pair_dir, "target pair"):
        pair = build_pair(cfg.target_preset, pair_dir, drift=drift, cache_dir=cache / "targets")
    _check_served(cfg, pair_dir / "tuned", pair_dir / "prompts-eval.jsonl")
    timings["pair_s"] = time.time() - t0

    t = time.time()
    log(f"[bold]data[/]: regenerating and capturing base and tuned conversations ({pair_dir})")
    base_feats = _features(pair_dir / "base", pair_dir / "prompts-train.jsonl", cache, cfg)
    tuned_feats = _features(pair_dir / "tuned", pair_dir / "prompts-train.jsonl", cache, cfg)
    timings["features_s"] = time.time() - t

    t = time.time()
    source_dir = cache / "source-drafters" / _source_key(base_feats, cfg)
    done = source_dir / "study-final.json"  # written last: its presence means the drafter is complete
    with building(source_dir, "source drafter"):
        if done.exists():
            log(f"[bold]source drafter[/] (the \"K2 drafter\"): cached ({source_dir})")
        else:
            log(f"[bold]source drafter[/] (the \"K2 drafter\") on base data -> {source_dir}")
            final = train(_train_config(cfg, cfg.source_steps), pair_dir / "base", base_feats, source_dir,
                          resume=True)
            atomic.write_json(done, final)
    timings["source_s"] = time.time() - t

    t = time.time()
    log("[bold]probe[/]: source drafter on the tuned target")
    probe_result = probe(
        source_dir, pair_dir / "tuned", tuned_feats, pair_dir / "base",
        # The arms' recipe; the probe cuts it to the pilot's steps.
        cfg=ProbeConfig(pilot_steps=cfg.probe_pilot_steps, ttt_steps=cfg.ttt_steps, device=cfg.device),
        pilot_recipe=_train_config(cfg, cfg.arm_steps),
        pilot_dir=level_dir / "probe-pilot", transfer_lr_scale=cfg.transfer_lr_scale,
    )
    atomic.write_json(level_dir / "probe.json", probe_result)
    timings["probe_s"] = time.time() - t

    arms = arms_for(cfg)
    for arm in arms:
        t = time.time()
        out = level_dir / "arms" / arm.key
        log(f"[bold]arm {arm.label}[/]: {cfg.arm_steps} steps on tuned data -> {out}")
        arm.final = train(
            _train_config(cfg, cfg.arm_steps), pair_dir / "tuned", tuned_feats, out, resume=True,
            init_from=source_dir if arm.init_from else None, remap=arm.remap, l2sp=arm.l2sp,
            transfer_lr_scale=cfg.transfer_lr_scale if arm.init_from else 1.0,  # scratch has no transferred weight
        )
        arm.history = _read_history(out / "metrics.jsonl")
        if (out / TRANSFER_FILE).exists():
            arm.transfer = json.loads((out / TRANSFER_FILE).read_text())
        arm.served = _served(cfg, out, pair_dir / "tuned", pair_dir / "prompts-eval.jsonl")
        timings[f"arm_{arm.key}_s"] = time.time() - t
    source_served = _served(cfg, source_dir, pair_dir / "tuned", pair_dir / "prompts-eval.jsonl")
    ngram = {"ngram_served": None, "ngram_across_served": None}
    if cfg.ngram_baseline:  # the bar without a drafter: lookup in each row's own tokens, and across prompts
        for key, across in (("ngram_served", False), ("ngram_across_served", True)):
            ngram[key] = _served(cfg, NgramConfig(across_prompts=across), pair_dir / "tuned",
                                 pair_dir / "prompts-eval.jsonl")

    by_key = {a.key: a for a in arms}
    plots.learning_curves(arms, level_dir / "curves.png", math.log(cfg.draft_vocab_size),
                          report.watch_stop(by_key["a"], by_key["b"])[0])
    plots.cond_acc_bars(arms, level_dir / "cond_acc_k.png", cfg.ttt_steps)
    speed = report.speed_tables({"arms": arms, "source_served_zero_shot": source_served, **ngram})
    if speed:
        model = CostModel(PRESETS[report.SPEED_PRESET])
        plots.speed_by_depth(speed, {x: model.baseline_tok_s(x) for x in speed[0]["tables"]}, level_dir / "speed.png")
    return {
        "drift_knob": drift,
        "pair": pair,
        "pair_dir": str(pair_dir),
        "features": {"base": str(base_feats), "tuned": str(tuned_feats)},
        "feature_manifests": {
            "base": Manifest.load(base_feats).to_json()["counts"],
            "tuned": Manifest.load(tuned_feats).to_json()["counts"],
        },
        "source_drafter": str(source_dir),
        "source_served_zero_shot": source_served,
        **ngram,
        "probe": probe_result,
        "arms": arms,
        "timings": timings,
    }


def _shards_hash(feature_dir: Path) -> str:
    """The feature set's content: its manifest's shard list (names, counts, sha256 of each file).
    The whole manifest would also hash the absolute paths it was captured from."""
    shards = json.loads((feature_dir / "manifest.json").read_text())["shards"]
    return hashlib.sha256(json.dumps(shards, sort_keys=True).encode()).hexdigest()


def data_record(level: dict) -> dict:
    """What the level's data is, by hash: corpus, both targets' weights, prompts, captured features."""
    pair, pair_dir = level["pair"], Path(level["pair_dir"])
    return {
        "pair": {
            "key": pair.get("key"),
            "base_key": pair.get("base_key"),
            "corpus_sha256": pair.get("corpus", {}).get("hash"),
            "base_fingerprint": pair.get("base", {}).get("fingerprint"),
            "tuned_fingerprint": pair.get("tuned", {}).get("fingerprint"),
            "prompts_sha256": {name: atomic.sha256_file(pair_dir / name)
                               for name in ("prompts-train.jsonl", "prompts-eval.jsonl")},
        },
        "features": {
            split: {"key": Path(d).name, "shards_sha256": _shards_hash(Path(d))}
            for split, d in level["features"].items()
        },
        "counts": level["feature_manifests"],
    }


def new_run_dir(runs_root: Path, name: str, sep: str = "-") -> Path:
    """The first of `name`, `name<sep>2`, ... under `runs_root` that this call creates: two studies started
    in the same second (or two reproductions of one run) would otherwise share one and train each other's arms."""
    runs_root.mkdir(parents=True, exist_ok=True)
    for n in itertools.count(1):
        run_dir = runs_root / (name if n == 1 else f"{name}{sep}{n}")
        try:
            run_dir.mkdir()
            return run_dir
        except FileExistsError:
            continue


def check_study(cfg: ExperimentConfig) -> None:
    """What the config cannot judge alone (this machine's CPUs and devices, the target preset), refused before
    a run directory or cache entry is made: each would otherwise stop the study at its first use, minutes in."""
    check_threads(cfg.threads, "threads")
    resolve_device(cfg.device)
    vocab = resolve_target(cfg.target_preset).vocab_size
    if cfg.draft_vocab_size > vocab:
        raise LabError(f"draft_vocab_size must be at most {vocab} (target preset {cfg.target_preset}'s vocab size), "
                       f"got {cfg.draft_vocab_size}")


RESUME_FREE = ("name", "threads", "arms", "served_eval", "served_prompts", "served_steps", "ngram_baseline")
"""ExperimentConfig fields a --run-dir resume may change: the name names only a new run directory, threads
change the speed, an arm added trains and one dropped is left out of the report, and the served
evaluations are run again on every resume."""

OPTIONAL_STAGES = ("l2sp", "probe_pilot_steps")
"""Fields whose 0 leaves a stage out (arm d, the probe's pilot): a resume may add the stage or drop it,
not change one that ran."""


def config_changes(recorded: dict, cfg: ExperimentConfig, recorded_device: str | None) -> list[str]:
    """The fields of `cfg` that make a study other than the one `recorded` (a run's manifest config, made
    on a `recorded_device` type): a resume with any of them would retrain or refuse in an arm, after the
    data and probe stages. A field the manifest lacks (a run older than the field) is not judged."""
    now = to_dict(cfg)
    changed = [k for k in now if k in recorded and k not in RESUME_FREE and recorded[k] != now[k]]
    return [k for k in changed if not (
        (k in OPTIONAL_STAGES and 0 in (recorded[k], now[k]))
        # each level of a sweep has its own directory: a level added trains, one dropped is left out
        # (a hand-edited manifest's levels that are no list differ: len() of one was a TypeError, or a string's)
        or (k == "drift_levels" and isinstance(recorded[k], list) and len(recorded[k]) > 1 and len(now[k]) > 1)
        # features differ by the device type alone (see _features)
        or (k == "device" and recorded_device in (None, resolve_device(now[k]).type))
    )]


def check_resume(cfg: ExperimentConfig, run_dir: Path) -> None:
    """Refuse, before any stage runs, a --run-dir whose manifest records a study `cfg` cannot resume: its
    arms would refuse `cfg` only after the data and probe stages (minutes), as a --resume never passed."""
    path = run_dir / "manifest.json"
    if not path.exists():
        return
    recorded = atomic.read_json(path, "manifest not found", run_dir)
    config = recorded.get("config") if isinstance(recorded, dict) else None
    if not isinstance(config, dict):
        raise LabError("manifest.json records no study config: not a study's run directory", run_dir)
    device = recorded.get("device")
    changed = config_changes(config, cfg, device.get("type") if isinstance(device, dict) else None)
    if changed:
        raise LabError(f"holds a study made with another config ({', '.join(changed)} differ): give another "
                       f"--run-dir for this one, or resume with the config its manifest.json records "
                       f"(--config {config.get('name')} and the options it ran with)", run_dir)


def run_study(cfg: ExperimentConfig, runs_root: Path, cache: Path, run_dir: Path | None = None,
              command: list[str] | None = None) -> Path:
    check_study(cfg)
    resuming = run_dir is not None
    run_dir = run_dir or new_run_dir(runs_root, f"{cfg.name}-{datetime.now().strftime('%Y%m%d-%H%M%S')}")
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):  # the CLI refuses these first; a Python caller gets here
        raise LabError("is a file or lies below one, not a directory", run_dir) from None
    # a second study here (a --run-dir resume beside the run it resumes) would train the same arms at once;
    # a resume is checked under the lock, so a study still running there is refused as running
    with building(run_dir / "study", "run directory", wait=False):
        if resuming:
            check_resume(cfg, run_dir)
        return _run_study(cfg, run_dir, cache, command)


def _manifest(cfg: ExperimentConfig, command: list[str] | None, code: dict, data: dict) -> dict:
    return build_manifest(command=command or [], config=to_dict(cfg), seeds={"seed": cfg.seed}, data=data,
                          device=device_state(cfg.device), git=code)


def _run_study(cfg: ExperimentConfig, run_dir: Path, cache: Path, command: list[str] | None) -> Path:
    started = time.time()
    code = git_state()  # the code this process imported: a commit or checkout during the hours it runs is not it
    if not (run_dir / "manifest.json").exists():
        # its config now, without data yet: a resume of the run if it is killed is checked against it
        write_manifest(run_dir, _manifest(cfg, command, code, {}))
    levels = []
    with torch_threads(cfg.threads):
        for i, drift in enumerate(cfg.drift_levels):
            level_dir = run_dir if len(cfg.drift_levels) == 1 else run_dir / f"drift-{level_name(drift)}"
            level_dir.mkdir(parents=True, exist_ok=True)
            log(f"[bold]level {i + 1}/{len(cfg.drift_levels)}[/]: drift knob {level_name(drift)} -> {level_dir}")
            levels.append(run_level(cfg, drift, level_dir, cache))
    elapsed = time.time() - started

    for level in levels:
        level_dir = run_dir if len(levels) == 1 else run_dir / f"drift-{level_name(level['drift_knob'])}"
        for arm in level["arms"]:
            atomic.write_text(level_dir / f"metrics-{arm.key}.jsonl",
                              "".join(atomic.dumps(r) + "\n" for r in arm.history))
    sweep = report.sweep_points(levels) if len(levels) > 1 else None
    if sweep:
        plots.drift_sweep(sweep, run_dir / "drift_sweep.png")
    atomic.write_text(run_dir / "report.md", report.render(cfg, levels, sweep, elapsed))
    write_manifest(run_dir, _manifest(cfg, command, code,
                                      {f"drift-{level_name(lv['drift_knob'])}": data_record(lv) for lv in levels}))
    atomic.write_json(run_dir / "results.json", report.results_json(levels, sweep, elapsed))
    log(f"[bold green]done[/] in {elapsed / 60:.1f} min: {run_dir / 'report.md'}")
    return run_dir


__all__ = ["run_study", "VERDICTS"]
