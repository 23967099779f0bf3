"""`drafter-lab targets ...` subcommands."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from drafter_lab.config import add_cli_args, apply_cli_args, cli_flags, flags_named, load_toml, replace
from drafter_lab.targets.presets import PRESETS, TargetConfig, resolve


def register(subparsers) -> None:
    targets = subparsers.add_parser("targets", help="build the offline target pair (base 'K2', tuned 'K2.5')")
    sub = targets.add_subparsers(dest="targets_command", metavar="ACTION", required=True)
    build = sub.add_parser(
        "build", help="train base and tuned on the stdlib corpus, print how far tuned drifted"
    )
    build.add_argument(
        "--preset", default="tiny-cpu", help=f"one of: {', '.join(PRESETS)} (default: tiny-cpu)"
    )
    build.add_argument(
        "--config", default=None, help="TOML file with TargetConfig fields (replaces the preset)"
    )
    build.add_argument(
        "--out", required=True, help="output directory (base/, tuned/, prompts-*.jsonl, pair.json)"
    )
    build.add_argument("--force", action="store_true", help="retrain even when cached")
    build.add_argument(
        "--cache-dir", default=None, help="stage cache (default $DRAFTER_LAB_CACHE/targets or ~/.cache)"
    )
    build.add_argument("--drift", type=float, default=None, help="override the config's drift (>= 0; 1 = the preset's fine-tune)")
    add_cli_args(build, TargetConfig, skip=("drift",))
    build.set_defaults(func=_build)


def _build(args) -> int:
    from drafter_lab.targets.build import build_pair

    cfg = load_toml(TargetConfig, args.config) if args.config is not None else resolve(args.preset)
    overridden = apply_cli_args(cfg, args)
    if args.drift is not None:  # build_pair applies it (pair.json names the preset it varies): checked here as typed
        with flags_named(cli_flags(args, "drift")):
            replace(overridden, drift=args.drift)
    target = args.preset if overridden is cfg and args.config is None else overridden
    pair = build_pair(target, args.out, drift=args.drift, force=args.force, cache_dir=args.cache_dir)
    print_drift(pair)
    return 0


def print_drift(pair: dict) -> None:
    """Print pair.json's drift figures as a table (stdout)."""
    figs = pair["drift_figures"]
    cols = [("all", "all"), ("base_text", "base text"), ("shifted_text", "shifted text")]
    table = Table(title=f"tuned vs base, drift {pair['drift']:g} ({figs['all']['tokens']} held-out tokens)")
    table.add_column("hidden_states", justify="right")
    for _, name in cols:
        table.add_column(f"CKA {name}", justify="right")
    for i in range(len(figs["all"]["cka"])):
        label = f"{i} (embeddings)" if i == 0 else str(i)
        table.add_row(label, *(f"{figs[k]['cka'][i]:.4f}" for k, _ in cols))
    table.add_section()
    for key, label in (("kl", "KL(base||tuned)"), ("base_nll", "base NLL"), ("tuned_nll", "tuned NLL")):
        table.add_row(label, *(f"{figs[k][key]:.4f}" for k, _ in cols))
    console = Console(width=None if Console().is_terminal else 100)
    console.print(table)
    secs = pair["build_seconds"]
    console.print(
        f"base: {pair['base']['fingerprint']} ({pair['base']['params']:,} params, "
        f"{'cached' if pair['base']['cached'] else 'built'}), tuned: {pair['tuned']['fingerprint']} "
        f"({'cached' if pair['tuned']['cached'] else 'built'}); this call {secs['this_call']} s",
        highlight=False,
        soft_wrap=True,
    )
