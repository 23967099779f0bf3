"""`drafter-lab export`: re-write a drafter checkpoint in the SGLang or speculators layout."""

from __future__ import annotations

from drafter_lab.data.capture_config import DTYPE_NAMES
from drafter_lab.drafter.config import FORMATS


def register(sub) -> None:
    p = sub.add_parser("export", help="write a drafter in the SGLang or speculators layout")
    p.add_argument("--drafter", required=True, help="drafter directory (any supported layout)")
    p.add_argument("--format", required=True, choices=FORMATS)
    p.add_argument("--out", required=True, help="output directory (written whole or not at all)")
    p.add_argument("--dtype", choices=DTYPE_NAMES,
                   help="weight dtype of the export (default: the source's)")
    p.set_defaults(func=run)


def run(args) -> int:
    import torch

    from drafter_lab.drafter.checkpoint import export
    from drafter_lab.progress import log

    out = export(args.drafter, args.format, args.out, getattr(torch, args.dtype) if args.dtype else None)
    log(f"exported {args.drafter} as {args.format} -> {out}")
    return 0
