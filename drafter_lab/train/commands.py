"""`drafter-lab train`: parse arguments, build the TrainConfig, call train()."""

from __future__ import annotations

import json

from drafter_lab import config as labconfig
from drafter_lab.data.capture import DTYPES, CaptureConfig
from drafter_lab.data.commands import aux_ids_arg
from drafter_lab.errors import LabError
from drafter_lab.train.config import TrainConfig


def register(sub) -> None:
    p = sub.add_parser("train", help="train an EAGLE-3 drafter with training-time test (TTT)")
    p.add_argument("--target", required=True, help="target model directory (HF layout)")
    data = p.add_mutually_exclusive_group(required=True)
    data.add_argument("--data", help="feature directory captured from that target (`data prepare`)")
    data.add_argument("--conversations", metavar="FILE",
                      help="train online: ShareGPT/SpecForge jsonl whose states the whole target computes per batch")
    p.add_argument("--target-dtype", choices=DTYPES, default=CaptureConfig.dtype,
                   help="with --conversations: dtype the target runs in")
    p.add_argument("--aux-layer-ids", type=aux_ids_arg, metavar="I,J,K",
                   help="with --conversations: three HF hidden_states indices (default 2,L//2,L-3)")
    p.add_argument("--val-fraction", type=float, default=CaptureConfig.val_fraction,
                   help="with --conversations: fraction held out for validation (capture's hash split)")
    p.add_argument("--out", required=True, help="output drafter directory (SGLang layout + train_state/)")
    p.add_argument("--config", help="TOML file with TrainConfig fields (top level or a [train] table)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out exactly where it stopped (starts fresh if it has no train state)")
    p.add_argument("--init-from", metavar="DRAFTER", help="initialise from another drafter (any supported layout)")
    p.add_argument("--no-remap", action="store_true",
                   help="with --init-from: copy lm_head rows as they are (the seeds' naive path)")
    p.add_argument("--l2sp", type=float, default=0.0, metavar="LAMBDA",
                   help="with --init-from: add LAMBDA * sum ||w - w_init||^2 over transferred weights")
    p.add_argument("--transfer-lr-scale", type=float, default=1.0, metavar="X",
                   help="with --init-from: learning-rate multiplier for transferred weights")
    labconfig.add_cli_args(p, TrainConfig)
    p.set_defaults(func=run)


def load_config(path) -> TrainConfig:
    """TrainConfig from TOML: fields at top level, or under a [train] table."""
    import tomllib
    from pathlib import Path

    try:
        data = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError):
        data = {}  # load_toml reports the problem with the file's name
    section = "train" if isinstance(data.get("train"), dict) else None
    return labconfig.load_toml(TrainConfig, path, section=section)


def run(args) -> int:
    from drafter_lab.train.loop import train

    cfg = load_config(args.config) if args.config else TrainConfig()
    cfg = labconfig.apply_cli_args(cfg, args)
    online = None
    if args.conversations is not None:
        online = CaptureConfig(dtype=args.target_dtype, aux_layer_ids=args.aux_layer_ids, val_fraction=args.val_fraction)
    elif (args.target_dtype, args.aux_layer_ids, args.val_fraction) != (CaptureConfig.dtype, None, CaptureConfig.val_fraction):
        raise LabError("--target-dtype, --aux-layer-ids and --val-fraction apply to --conversations (online) runs only")
    result = train(
        cfg, args.target, args.data or args.conversations, args.out, resume=args.resume, init_from=args.init_from,
        remap=not args.no_remap, l2sp=args.l2sp, transfer_lr_scale=args.transfer_lr_scale, online=online,
    )
    print(json.dumps(result))
    return 0
