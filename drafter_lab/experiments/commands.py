"""CLI: `probe`, `experiment` and `reproduce`."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
from pathlib import Path

from drafter_lab.config import add_cli_args, apply_cli_args, cli_flags, flags_named
from drafter_lab.errors import LabError


def _cache_root(args) -> Path:
    return Path(args.cache or os.environ.get("DRAFTER_LAB_CACHE") or Path.home() / ".cache" / "drafter_lab")


def _cache_given_by(args) -> str:
    """What set the cache root, for a refusal to name: not --cache where the user typed none."""
    return "$DRAFTER_LAB_CACHE" if not args.cache and os.environ.get("DRAFTER_LAB_CACHE") else "--cache"


def _directories(*flags: tuple[str, str | Path | None]) -> None:
    """Refuse, before a study's minutes of work, a directory option (flag, path) that names a file or lies
    below one (mkdir's traceback for --runs and --run-dir; for --cache, an error minutes in)."""
    from drafter_lab.atomic import refuse_below_file

    for flag, path in flags:
        if path is None:
            continue
        if Path(path).exists() and not Path(path).is_dir():
            raise LabError("not a directory", path)
        refuse_below_file(Path(path), flag)


def _probe(args) -> int:
    from rich.console import Console
    from rich.table import Table

    from drafter_lab import atomic
    from drafter_lab.experiments.config import ProbeConfig, ProbeThresholds
    from drafter_lab.experiments.probe import probe
    from drafter_lab.threads import check_threads
    from drafter_lab.train.commands import checked, load_config
    from drafter_lab.train.config import TrainConfig

    th, cfg = apply_cli_args(ProbeThresholds(), args), apply_cli_args(ProbeConfig(), args)
    if args.threads < 0:  # was taken as 0, torch's default
        raise LabError(f"--threads must be >= 0 (0: torch's default), got {args.threads}")
    if not 0 <= args.transfer_lr_scale < math.inf:  # the pilot refused it only after the signals' minutes
        raise LabError(f"--transfer-lr-scale must be >= 0 and finite, got {args.transfer_lr_scale}")
    check_threads(args.threads)
    # written last, after the pilot's minutes (and never over the recipe it read)
    atomic.refuse_outputs([("--json", args.json)], [("--pilot-config", args.pilot_config)])
    _directories(("--pilot-dir", args.pilot_dir))  # else refused after the signals, as the pilot's `--out`
    recipe = TrainConfig() if args.pilot_config is None else checked(load_config(args.pilot_config), args.pilot_config)
    if args.threads > 0:
        import torch

        torch.set_num_threads(args.threads)
        recipe = dataclasses.replace(recipe, threads=args.threads)
    result = probe(args.drafter, args.target, args.data, args.source_target, cfg=cfg, thresholds=th,
                   pilot_recipe=recipe, pilot_dir=args.pilot_dir, transfer_lr_scale=args.transfer_lr_scale,
                   val_data=args.val_data)
    if args.json:
        atomic.write_json(args.json, result)
    con = Console()
    table = Table(title="Phase-0 probe (held-out data of the new target)")
    table.add_column("signal")
    table.add_column("value", justify="right")
    z = result["zero_shot"]
    table.add_row("zero-shot simulated accept length", f"{z['simulated_accept_len']:.2f}")
    for k in range(len([key for key in z if key.startswith("cond_acc_")])):
        table.add_row(f"zero-shot cond_acc_{k}", f"{z[f'cond_acc_{k}']:.3f}")
    if result["home"]:
        table.add_row("home simulated accept length (source target)", f"{result['home']['simulated_accept_len']:.2f}")
    v = result["vocab"]
    table.add_row("draft positions that agree", f"{v['same_positions']} / {v['size_a']}")
    table.add_row("tokens shared", f"{v['shared_tokens']}")
    table.add_row("vocabularies compared by", "token string" if v["by"] == "token" else "token id")
    if v["drafter_target_vocab_size"] != result["target"]["vocab_size"]:  # served as engines serve it there
        table.add_row("target vocab size (the drafter's / this one)",
                      f"{v['drafter_target_vocab_size']} / {result['target']['vocab_size']}")
    for i, c in enumerate(result["aux_cka"] or []):
        table.add_row(f"aux layer {i} CKA (source vs new)", f"{c:.4f}")
    for row in (result["pilot"] or {}).get("curve", []):
        table.add_row(f"pilot step {row['step']}: val cond_acc_0 transfer / scratch",
                      f"{row['transfer_cond_acc_0']:.3f} / {row['scratch_cond_acc_0']:.3f}")
    con.print(table)
    con.print(f"[bold]verdict: {result['verdict']}[/] — {result['reason']}", soft_wrap=True)
    return 0


def _experiment(args) -> int:
    from drafter_lab.experiments.config import get_config
    from drafter_lab.experiments.study import run_study

    cfg = apply_cli_args(get_config(args.config), args)
    cache = _cache_root(args)
    _directories(("--runs", args.runs), ("--run-dir", args.run_dir), (_cache_given_by(args), cache))
    with flags_named(cli_flags(args)):  # a stage's refusal of a field the command line set names its flag
        run_dir = run_study(cfg, Path(args.runs), cache, Path(args.run_dir) if args.run_dir else None,
                            command=["drafter-lab", *sys.argv[1:]])
    print(json.dumps({"run_dir": str(run_dir), "report": str(run_dir / "report.md")}))
    return 0


def register(sub) -> None:
    from drafter_lab.experiments.config import PRESETS, ExperimentConfig, ProbeConfig, ProbeThresholds

    p = sub.add_parser("probe", help="tell in minutes whether an existing drafter will pay on a new target")
    p.add_argument("--drafter", required=True, help="drafter checkpoint (any format we import)")
    p.add_argument("--target", required=True, help="the new target (HF model dir)")
    p.add_argument("--data", required=True, help="features of the new target (`data prepare` output)")
    p.add_argument("--source-target", help="the target the drafter was trained for (enables aux CKA)")
    p.add_argument("--val-data", metavar="DIR",
                   help="measure every signal on this feature directory of the new target (e.g. the prompts it will "
                        "serve) instead of --data's val split")
    p.add_argument("--json", help="also write the result here")
    p.add_argument("--threads", type=int, default=0,
                   help="torch CPU threads (0 = torch's default); tiny models run best on 1 when cores are shared")
    p.add_argument("--pilot-config", metavar="F.toml",
                   help="the training recipe the pilot cuts to --pilot-steps (TrainConfig TOML, as `train --config`)")
    p.add_argument("--pilot-dir", help="keep the pilot's two arms here (default: a temporary directory)")
    p.add_argument("--transfer-lr-scale", type=float, default=1.0, metavar="X",
                   help="learning-rate multiplier for the pilot transfer arm's transferred weights")
    add_cli_args(p, ProbeConfig)
    add_cli_args(p, ProbeThresholds)
    p.set_defaults(func=_probe)

    e = sub.add_parser("experiment", help="the transfer-vs-scratch study end to end (report, plots, manifest)")
    e.add_argument("--config", default="tiny-cpu", help=", ".join(PRESETS) + " (default: %(default)s)")
    e.add_argument("--runs", default="runs", help="where run directories go")
    e.add_argument("--run-dir", help="resume into this run directory instead of a new one")
    e.add_argument("--cache", help="cache root for targets, features, source drafters "
                                   "(default $DRAFTER_LAB_CACHE or ~/.cache/drafter_lab)")
    add_cli_args(e, ExperimentConfig, skip=("name",))
    e.set_defaults(func=_experiment)
    register_reproduce(sub)


def _reproduce(args) -> int:
    from rich.console import Console
    from rich.table import Table

    from drafter_lab.experiments.reproduce import code_note, machine_note, package_note, reproduce

    cache = _cache_root(args)
    _directories(("--runs", args.runs), (_cache_given_by(args), cache))
    reused = cache.is_dir() and any(cache.iterdir())
    new_dir, diffs = reproduce(args.run_dir, Path(args.runs), cache, args.rel_tol)
    con = Console()
    manifests = [json.loads((Path(d) / "manifest.json").read_text()) for d in (args.run_dir, new_dir)]
    # "identical" covers what ran again: what the cache held (the pair, features, source drafter) was
    # looked up, not rebuilt
    cached = (f"the cache {cache} was not empty: the stages it held (target pair, feature sets, source "
              "drafter) were reused, not rebuilt; --cache EMPTY_DIR rebuilds them") if reused else None
    for note in (code_note(*manifests), machine_note(*manifests), package_note(*manifests), cached):
        if note:
            con.print(f"[yellow]note:[/] {note}", soft_wrap=True)
    if not diffs:
        con.print(f"[bold green]identical[/]: every metric of {args.run_dir} reproduced in {new_dir}", soft_wrap=True)
        return 0
    table = Table(title=f"metrics that differ ({len(diffs)})")
    for col in ("metric", "original", "reproduced"):
        table.add_column(col)
    for key, a, b in diffs:
        table.add_row(key, *("null" if v is None else str(v) for v in (a, b)))
    con.print(table)
    return 1


def register_reproduce(sub) -> None:
    r = sub.add_parser("reproduce", help="re-run a run directory from its manifest; report metrics that differ")
    r.add_argument("run_dir")
    r.add_argument("--runs", default="runs")
    r.add_argument("--cache", help="cache root (default $DRAFTER_LAB_CACHE or ~/.cache/drafter_lab)")
    r.add_argument("--rel-tol", type=float, default=0.0, help="relative tolerance (0 = identical)")
    r.set_defaults(func=_reproduce)
