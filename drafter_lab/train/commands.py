"""`drafter-lab train`: parse arguments, build the TrainConfig, call train()."""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import time
from pathlib import Path

from drafter_lab import atomic
from drafter_lab import config as labconfig
from drafter_lab.data.capture_config import DTYPE_NAMES, TURNS, CaptureConfig, template_kwargs_arg
from drafter_lab.data.commands import aux_ids_arg
from drafter_lab.errors import LabError
from drafter_lab.train.config import TrainConfig, check_config
from drafter_lab.train.watch import STOP_EXIT, WatchConfig


def register(sub) -> None:
    p = sub.add_parser("train", help="train an EAGLE-3 drafter with training-time test (TTT)")
    p.add_argument("--target", required=True, help="target model directory (HF layout)")
    data = p.add_mutually_exclusive_group(required=True)
    data.add_argument("--data", help="feature directory captured from that target (`data prepare`)")
    data.add_argument("--conversations", metavar="FILE",
                      help="train online: ShareGPT/SpecForge jsonl whose states the whole target computes per batch")
    p.add_argument("--target-dtype", choices=DTYPE_NAMES,
                   help=f"with --conversations: dtype the target runs in (default {CaptureConfig.dtype})")
    p.add_argument("--aux-layer-ids", type=aux_ids_arg, metavar="I,J,K",
                   help="with --conversations: three HF hidden_states indices (default 2,L//2,L-3)")
    p.add_argument("--val-fraction", type=float,
                   help="with --conversations: fraction held out for validation (capture's hash split; default "
                        f"{CaptureConfig.val_fraction})")
    p.add_argument("--token-exact", action="store_true",
                   help="with --conversations: keep each answer as the token_ids it carries (`data regenerate`), as "
                        "data prepare --token-exact does; val answers all sampled at --val-temperature then replay "
                        "the sampled server")
    p.add_argument("--chat-template-kwargs", type=template_kwargs_arg, metavar="JSON",
                   help="with --conversations: variables for the target's chat template, as data prepare takes them "
                        "(e.g. '{\"enable_thinking\": false}')")
    p.add_argument("--turns", choices=TURNS,
                   help="with --conversations: which assistant turns train, as data prepare's --turns (default "
                        f"{CaptureConfig.turns})")
    p.add_argument("--tokenize-workers", type=int,
                   help="with --conversations: processes that render and tokenize them, as data prepare's (default "
                        f"{CaptureConfig.tokenize_workers})")
    p.add_argument("--val-data", metavar="PATH",
                   help="validate on this set instead of the data's val split: every sequence of a feature directory "
                        "captured from the same target, or (with --conversations) of a conversations file")
    p.add_argument("--out", required=True, help="output drafter directory (SGLang layout + train_state/)")
    p.add_argument("--config", help="TOML file with TrainConfig fields (top level or a [train] table)")
    p.add_argument("--draft-config", metavar="CONFIG.json",
                   help="a SpecForge/SGLang (LlamaForCausalLMEagle3) or speculators draft-model config: sets the "
                        "drafter's shape and draft vocab size (over --config, under the field flags)")
    p.add_argument("--vocab", metavar="PATH",
                   help="train with this draft vocab (d2t/t2d): a `vocab build` file, or a drafter directory of any "
                        "layout export reads (e.g. the drafter moved to a new target); it sets the draft vocab size, "
                        "over --config and --draft-config (default: the top --draft-vocab-size tokens of the train "
                        "split)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out exactly where it stopped (starts fresh if it has no train state)")
    p.add_argument("--init-from", metavar="DRAFTER", help="initialise from another drafter (any supported layout)")
    p.add_argument("--no-remap", action="store_true",
                   help="with --init-from: copy lm_head rows as they are (the seeds' naive path)")
    # None where not given (the defaults are train()'s), so that giving one without --init-from is refused.
    p.add_argument("--l2sp", type=float, metavar="LAMBDA",
                   help="with --init-from: add LAMBDA * sum ||w - w_init||^2 over transferred weights (default 0)")
    p.add_argument("--transfer-lr-scale", type=float, metavar="X",
                   help="with --init-from: learning-rate multiplier for transferred weights (default 1)")
    p.add_argument("--source-target", metavar="DIR",
                   help="with --init-from: the target the source drafter was trained for; where its tokenizer "
                        "differs from --target's, lm_head rows are remapped by token string, not id (default: the "
                        "target the source's run.json names, if it is still there)")
    p.add_argument("--stop-if-behind", metavar="BASELINE_RUN",
                   help="the watch: stop (checkpointed, exit status 3) once this run trails the baseline run "
                        "(e.g. a from-scratch one, finished or training) at equal steps and is not catching up")
    labconfig.add_cli_args(p, TrainConfig)
    labconfig.add_cli_args(p, WatchConfig)
    p.set_defaults(func=run)
    register_watch(sub)


def register_watch(sub) -> None:
    w = sub.add_parser("watch", help="compare a training run with a baseline run at equal steps: keep training or stop")
    w.add_argument("run", help="the run directory watched (its metrics.jsonl may still be growing)")
    w.add_argument("--baseline", required=True, help="the run directory it is compared with")
    w.add_argument("--follow", type=float, default=0.0, metavar="SECONDS",
                   help="check again every SECONDS until the verdict is stop or the run has finished")
    w.add_argument("--json", action="store_true", help="print the verdict as JSON")
    labconfig.add_cli_args(w, WatchConfig)
    w.set_defaults(func=watch)


def load_config(path) -> TrainConfig:
    """TrainConfig from TOML: fields at top level, or under a [train] table (then nothing else at top level)."""
    return labconfig.load_toml(TrainConfig, path, section="train")


def checked(cfg: TrainConfig, path) -> TrainConfig:
    """`cfg`, made from the --config file `path` (None: no file) and the flags, through check_config. A
    complaint the file's values draw names the file: the value came from there."""
    try:
        check_config(cfg)
    except LabError as e:
        if path is not None and _drawn_by_file(e, cfg, load_config(path)):
            raise LabError(str(e), path) from None
        raise
    return cfg


def _drawn_by_file(e: LabError, cfg: TrainConfig, own: TrainConfig) -> bool:
    """Whether the --config file's values (`own`: the file's config) draw `cfg`'s complaint `e`, asked of the
    other values alone (each field the file set put back to its default): where they pass, the file's draw
    it; where they draw this same complaint, not; where another, the file's if the file alone is refused
    (its complaint checked first). Not `e` compared with the file's own complaint: a flag mending the file's
    first bad value left its second one named by no file."""
    def same(a, b) -> bool:
        return a == b or (a != a and b != b)  # nan, which a file and a flag may both give

    default = TrainConfig()
    from_file = {f.name for f in dataclasses.fields(cfg) if same(getattr(cfg, f.name), getattr(own, f.name))
                 and not same(getattr(own, f.name), getattr(default, f.name))}
    others = _complaint(dataclasses.replace(cfg, **{name: getattr(default, name) for name in from_file}))
    if others is None:
        return True
    return others != str(e) and _complaint(own) is not None


def _complaint(cfg: TrainConfig) -> str | None:
    """check_config's complaint about `cfg`, None where it passes."""
    try:
        check_config(cfg)
    except LabError as e:
        return str(e)
    return None


ONLINE_FLAGS = {"dtype": "--target-dtype", "aux_layer_ids": "--aux-layer-ids", "val_fraction": "--val-fraction",
                "token_exact": "--token-exact", "chat_template_kwargs": "--chat-template-kwargs", "turns": "--turns",
                "tokenize_workers": "--tokenize-workers"}
"""train's flags that set the online capture (CaptureConfig field -> flag)."""


def run(args) -> int:
    from drafter_lab.data.capture import check_config as check_capture
    from drafter_lab.train.config import check_metric
    from drafter_lab.train.loop import check_transfer, train
    from drafter_lab.train.watch import check_watch, stopped_at

    cfg = load_config(args.config) if args.config is not None else TrainConfig()
    if args.draft_config:
        cfg = with_draft_config(cfg, args.draft_config, Path(args.target))
    # Every setting checked before the run reads its inputs (a long features scan, a whole target); a complaint
    # about a field the command line set names the flag typed (a --config file's own value, the file).
    flags = labconfig.cli_flags(args, "val_fraction", "tokenize_workers", "l2sp", "transfer_lr_scale")
    with labconfig.flags_named(flags):
        cfg = checked(labconfig.apply_cli_args(cfg, args), args.config)
        if args.vocab is not None:
            cfg = with_vocab(cfg, args.vocab, args.cfg__draft_vocab_size is not None)
        # Flags given at their defaults count too: a flag given is one the user meant to take effect.
        online, given = None, {field: value for field, value in (
            ("dtype", args.target_dtype), ("aux_layer_ids", args.aux_layer_ids), ("val_fraction", args.val_fraction),
            ("token_exact", args.token_exact or None), ("chat_template_kwargs", args.chat_template_kwargs),
            ("turns", args.turns), ("tokenize_workers", args.tokenize_workers)) if value is not None}
        if args.conversations is not None:
            online = CaptureConfig(**given)
            check_capture(online)
        elif given:
            raise LabError(f"{labconfig.listed([ONLINE_FLAGS[f] for f in given])} appl{'ies' if len(given) == 1 else 'y'} "
                           "to --conversations (online) runs only")
        check_transfer(args.l2sp, args.transfer_lr_scale, not args.no_remap, args.source_target, args.init_from)
        transfer = {k: v for k, v in (("l2sp", args.l2sp), ("transfer_lr_scale", args.transfer_lr_scale))
                    if v is not None}
        watch_cfg = labconfig.apply_cli_args(WatchConfig(), args)
        typed = [flag for field, flag in labconfig.cli_flags(args).items() if field in WatchConfig.__dataclass_fields__]
        if args.stop_if_behind is None and typed:
            raise LabError(f"{labconfig.listed(typed)} appl{'ies' if len(typed) == 1 else 'y'} with --stop-if-behind only")
        if args.stop_if_behind is not None:
            check_watch(watch_cfg)
            check_metric(cfg, "watch_metric", watch_cfg.watch_metric)
    result = train(
        cfg, args.target, args.data or args.conversations, args.out, resume=args.resume, init_from=args.init_from,
        remap=not args.no_remap, **transfer,
        source_target=args.source_target, online=online,
        stop_if_behind=args.stop_if_behind, watch=watch_cfg, val_data=args.val_data, vocab=args.vocab,
    )
    if int(os.environ.get("RANK", "0")) == 0:  # under torchrun every rank returns it: one line for a script
        print(atomic.dumps(result))  # an undefined metric (a loss with no position) is NaN: null there
    if cfg.drafter_norm_before_residual and int(os.environ.get("RANK", "0")) == 0:  # SGLang's layout has no such switch
        from drafter_lab.progress import log

        log(f"note: {args.out} is a norm_before_residual drafter: vLLM serves it (this directory, or `export "
            "--format speculators`); SGLang would serve it with the plain residual")
    return STOP_EXIT if args.stop_if_behind and stopped_at(Path(args.out)) == result["step"] else 0


def with_draft_config(cfg: TrainConfig, path, target_dir: Path) -> TrainConfig:
    """`cfg` with the drafter shape, residual variant, RoPE scaling and draft vocab size of a draft-model
    config.json (SpecForge's `--draft-model-config`, an SGLang or speculators checkpoint's config). RoPE
    theta and norm settings always come from the target, so a config made for another target is refused,
    not half used."""
    from drafter_lab.drafter.config import target_rope_theta
    from drafter_lab.drafter.formats import parse_config, rope_scaling_text
    from drafter_lab.targets.hf import load_target_config

    d, _ = parse_config(atomic.read_json(path, "draft model config not found"), path)
    _, target = load_target_config(target_dir)  # the text model's, as the drafter is built from it
    for what, mine, theirs in (("vocab_size", d.target_vocab_size, getattr(target, "vocab_size", None)),
                               ("rope_theta", d.rope_theta, target_rope_theta(target))):
        if mine != theirs:
            raise LabError(f"made for another target: {what} {mine}, the target {target_dir} has {theirs}", path)
    return labconfig.replace(cfg, drafter_hidden_size=d.hidden_size, drafter_intermediate_size=d.intermediate_size,
                             drafter_heads=d.num_attention_heads, drafter_kv_heads=d.num_key_value_heads,
                             drafter_head_dim=d.head_dim, drafter_norm_before_residual=d.norm_before_residual,
                             drafter_rope_scaling=rope_scaling_text(d.rope_scaling), draft_vocab_size=d.draft_vocab_size)


def with_vocab(cfg: TrainConfig, path, size_typed: bool) -> TrainConfig:
    """`cfg` with the draft vocab size of the --vocab at `path` (read now, refused naming it, before the run
    reads its inputs), so that run.json records the N the drafter has (train() ignores the field then).
    `size_typed`: --draft-vocab-size was given too; a size other than the vocab's is refused, not ignored."""
    from drafter_lab.drafter.checkpoint import read_vocab

    n = read_vocab(path).size
    if size_typed and cfg.draft_vocab_size != n:
        raise LabError(f"--vocab {path} holds {n} draft tokens, --draft-vocab-size asks for {cfg.draft_vocab_size}: "
                       "give one of the two")
    return dataclasses.replace(cfg, draft_vocab_size=n)


def watch(args) -> int:
    from drafter_lab.train.metrics_log import METRICS
    from drafter_lab.train.watch import AXES, check_watch, comparison_note, judge, read_run, stopped_at

    if not 0 <= args.follow < math.inf:  # else time.sleep's traceback, after the first check
        raise LabError(f"--follow must be a finite number of seconds >= 0, got {args.follow}")
    with labconfig.flags_named(labconfig.cli_flags(args)):  # before the runs are read (or waited for)
        cfg = labconfig.apply_cli_args(WatchConfig(), args)
        check_watch(cfg)
    shown, waiting = 0, False
    said = sys.stderr if args.json else sys.stdout  # with --json, stdout holds the verdict alone: a script parses it
    while True:
        # a run or baseline still starting up (the two are often started together)
        try:
            absent = [Path(d) / METRICS for d in (args.run, args.baseline) if not (Path(d) / METRICS).exists()]
        except OSError:  # a directory it may not look into: read_run names it in one line
            absent = []
        if args.follow and absent:
            if not waiting:
                print(f"waiting for {' and '.join(map(str, absent))}", file=said, flush=True)
                waiting = True
            time.sleep(args.follow)
            continue
        rows, info = read_run(args.run)
        base_rows, base_info = read_run(args.baseline)
        total = info.get(AXES.get(cfg.watch_axis, "total_steps"))
        # As train and the replay, no verdict on the validation at the run's last step (the run is over there):
        # a finished run gets the verdict at its validation before, not a "stop" train would never have said.
        at_end = [r.get("split") == "val" and r["step"] >= info.get("total_steps", math.inf) for r in rows]
        ended = any(at_end)
        verdict = judge([r for r, end in zip(rows, at_end) if not end], base_rows, cfg, total, args.run, args.baseline)
        at = stopped_at(Path(args.run))  # by its own watch: it logs nothing more (following it never ended)
        stopped = at is not None and bool(rows) and rows[-1]["step"] <= at
        if stopped:
            print(f"the run's own watch stopped it at step {at}", file=said, flush=True)
        if not args.follow or verdict.stop or ended or stopped:
            break
        if len(verdict.rows) > shown:
            shown = len(verdict.rows)
            print(f"step {verdict.rows[-1]['step']}: keep training ({verdict.reason})", file=said, flush=True)
        time.sleep(args.follow)
    note = comparison_note(info, base_info, cfg.watch_axis)
    if args.json:
        print(atomic.dumps({"run": args.run, "baseline": args.baseline, "axis": cfg.watch_axis, "total": total,
                          "note": note, "finished": ended,
                          **verdict.to_json()}))
    else:
        if ended:
            print(f"the run has finished ({info['total_steps']} steps): its last validation is not judged, as "
                  "train judges none at its last step", flush=True)
        _print_verdict(verdict, cfg, note)
    return STOP_EXIT if verdict.stop else 0


def _print_verdict(verdict, cfg: WatchConfig, note: str | None, last: int = 10) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    tokens = cfg.watch_axis != "step"
    table = Table(title=f"val {cfg.watch_metric}, run against baseline at equal {cfg.watch_axis.replace('_', ' ')} "
                        f"(last {last} matched; gap > 0: the run is ahead)")
    for col in ("step", *(["training tokens"] if tokens else []), "run", "baseline", "gap"):
        table.add_column(col, justify="right")
    for r in verdict.rows[-last:]:
        table.add_row(str(r["step"]), *([f"{r['at']:,}"] if tokens else []), f"{r['run']:.4f}",
                      f"{r['baseline']:.4f}", f"{r['gap']:+.4f}")
    con = Console()
    if verdict.rows:
        con.print(table)
    # Paths and metric names are not markup: rich dropped a path's "[old]" and raised MarkupError on a "[/]"
    if note:
        con.print(f"[yellow]note:[/] {escape(note)}", soft_wrap=True)
    con.print(("[bold red]stop[/]: " if verdict.stop else "[bold green]keep training[/]: ") + escape(verdict.reason),
              soft_wrap=True)
