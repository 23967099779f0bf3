"""CLI: `vocab build` / `vocab compare` (the draft vocabulary, d2t/t2d, which travels with a drafter's
lm_head) and `export` (a drafter checkpoint re-written in the SGLang or speculators layout)."""

from __future__ import annotations

import argparse
from pathlib import Path

from drafter_lab.config import flags_named
from drafter_lab.data.capture_config import DTYPE_NAMES
from drafter_lab.drafter.config import FORMATS


def register(sub) -> None:
    vocab = sub.add_parser("vocab", help="draft vocabulary (d2t/t2d): build, compare")
    vocab_sub = vocab.add_subparsers(dest="vocab_command", metavar="ACTION", required=True)
    b = vocab_sub.add_parser("build", help="top-N assistant tokens of the train split -> d2t/t2d safetensors")
    b.add_argument("--data", required=True, help="feature directory from `data prepare`")
    b.add_argument("--size", type=int, required=True, help="draft vocabulary size N")
    b.add_argument("--out", required=True, help="output .safetensors file")
    b.set_defaults(func=_build)
    c = vocab_sub.add_parser("compare", help="how far two draft vocabularies agree")
    c.add_argument("a", help="vocab .safetensors, or a drafter directory of any layout export reads")
    c.add_argument("b", help="vocab .safetensors, or a drafter directory of any layout export reads")
    c.add_argument("--top", type=_rows, default=10, help="rows in the disagreement tables (0: none)")
    c.add_argument("--tokenizer", default=None, help="model directory whose tokenizer shows token text")
    c.set_defaults(func=_compare)

    p = sub.add_parser("export", help="write a drafter in the SGLang or speculators layout")
    p.add_argument("--drafter", required=True, help="drafter directory (any supported layout)")
    p.add_argument("--format", required=True, choices=FORMATS)
    p.add_argument("--out", required=True, help="output directory (written whole or not at all)")
    p.add_argument("--dtype", choices=DTYPE_NAMES,
                   help="weight dtype of the export (default: the target's, from --target or the run.json beside "
                        "the drafter, else the source's)")
    p.add_argument("--target", metavar="DIR",
                   help="the target the drafter is served with: its config's dtype is the export's default "
                        "(default: the target run.json names, where it still is)")
    p.add_argument("--speculative-tokens", type=int, metavar="K",
                   help="speculators: draft tokens per step vLLM uses unless --speculative-config sets "
                        "num_speculative_tokens (default: the drafter's TTT depth from its run.json, else 5)")
    p.add_argument("--verifier", metavar="NAME_OR_PATH",
                   help="speculators: the target `vllm serve DRAFTER` serves the drafter with")
    p.set_defaults(func=_export)


def _rows(text: str) -> int:
    """argparse type of --top: a count of rows (a negative one printed every row)."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number of rows >= 0, got {text!r}")
    return value


def _export(args) -> int:
    import torch

    from drafter_lab.drafter.checkpoint import export
    from drafter_lab.progress import log

    # --target is read even beside --dtype, so that a mistyped path is refused, not passed over
    named, target = _target_dtype(args.target, args.drafter) if args.target or not args.dtype else (None, None)
    if args.dtype:
        dtype, target = args.dtype, None
    elif named in DTYPE_NAMES:
        dtype = named
    else:
        if named is not None:
            log(f"note: {target}'s config.json names dtype {named}, which export does not write: the weights "
                "keep the drafter's own dtype (--dtype picks one)")
        dtype, target = None, None
    with flags_named({"speculative_tokens": "--speculative-tokens"}):  # checked before the drafter is read
        out = export(args.drafter, args.format, args.out, getattr(torch, dtype) if dtype else None,
                     args.speculative_tokens, args.verifier)
    log(f"exported {args.drafter} as {args.format} -> {out}" + (f" in {dtype}, {target}'s dtype" if target else ""))
    return 0


def _target_dtype(target, drafter) -> tuple[str | None, Path | None]:
    """The dtype the target's config.json names (None where it names none), and the target (None, None
    where none is known).

    SGLang's `--dtype auto` loads each model in its own config's dtype, a float32 one as float16: a
    float32 drafter beside a bfloat16 target then runs in another dtype than the hidden states it is
    fed, and fails. Written in the target's dtype, both load alike."""
    from drafter_lab import atomic
    from drafter_lab.drafter.checkpoint import recorded_target
    from drafter_lab.errors import LabError
    from drafter_lab.targets.hf import text_model_fields

    if target is None:
        recorded = recorded_target(drafter, "path")
        if not (recorded and (Path(recorded) / "config.json").is_file()):
            return None, None
        target = recorded
    path = Path(target) / "config.json"
    config = atomic.read_json(path, "not a model directory: config.json is missing", target)
    if not isinstance(config, dict):
        raise LabError("config.json is not a JSON object", path)
    text = text_model_fields(config) or {}
    # transformers 5 writes `dtype`, 4 `torch_dtype`
    name = next((c.get(k) for c in (config, text) for k in ("dtype", "torch_dtype") if c.get(k) is not None), None)
    return (name if isinstance(name, str) else None), Path(target)


def _build(args) -> int:
    from rich.console import Console

    from drafter_lab import atomic
    from drafter_lab.data.shards import FeatureSet
    from drafter_lab.data.vocab import (
        check_replaceable,
        check_size,
        count_train_tokens,
        recorded_vocab_size,
        vocab_from_counts,
    )

    check_size(args.size, None, "--size")  # before anything is read
    atomic.refuse_unwritable(args.out, "--out")
    check_replaceable(args.out)  # before the counting, as well as when it is written
    # past the target's vocab: refused from the manifest, before the count reads every train shard
    features = FeatureSet(args.data)
    check_size(args.size, recorded_vocab_size(features), "--size")
    counts = count_train_tokens(features)  # the same manifest: one read, as the check saw it
    vocab = vocab_from_counts(counts, args.size)
    vocab.save(args.out)
    covered = int(counts[vocab.used].sum())
    Console().print(
        f"draft vocab {vocab.size} of {vocab.target_vocab_size} target tokens -> {args.out}\n"
        f"{int((counts > 0).sum())} distinct tokens at loss positions; the vocab covers "
        f"{covered}/{int(counts.sum())} = {covered / int(counts.sum()):.2%} of them",
        highlight=False,
        soft_wrap=True,
    )
    return 0


def _compare(args) -> int:
    from rich.console import Console
    from rich.table import Table

    from drafter_lab.data.vocab import compare_vocabs
    from drafter_lab.drafter.checkpoint import read_vocab

    a, b = read_vocab(args.a), read_vocab(args.b)
    r = compare_vocabs(a, b, top=args.top)
    tok = None
    if args.tokenizer:
        from drafter_lab.targets.hf import load_tokenizer

        tok = load_tokenizer(args.tokenizer)

    def show(i: int) -> str:
        return f"{i} {tok.convert_ids_to_tokens(i)!r}" if tok is not None else str(i)

    console = Console()
    summary = Table(title="draft vocab comparison")
    summary.add_column("")
    summary.add_column("value", justify="right")
    summary.add_row("A", f"{args.a}: {r['size_a']} of {r['target_vocab_a']}")
    summary.add_row("B", f"{args.b}: {r['size_b']} of {r['target_vocab_b']}")
    summary.add_row("positions mapping to the same target token", f"{r['same_positions']} / {min(r['size_a'], r['size_b'])}")
    summary.add_row("target tokens both hold", str(r["shared_tokens"]))
    summary.add_row("tokens only in A", str(r["only_a_count"]))
    summary.add_row("tokens only in B", str(r["only_b_count"]))
    console.print(summary)
    if r["largest_gaps"]:
        gaps = Table(title="largest disagreements by position")
        for col in ("position", "A target", "B target", "|gap|"):
            gaps.add_column(col, justify="right")
        for g in r["largest_gaps"]:
            gaps.add_row(str(g["position"]), show(g["target_a"]), show(g["target_b"]), str(g["gap"]))
        console.print(gaps)
    if r["only_a"] or r["only_b"]:
        only = Table(title=f"tokens held by one side only (lowest {args.top} ids)")
        only.add_column("only in A", justify="right")
        only.add_column("only in B", justify="right")
        for i in range(max(len(r["only_a"]), len(r["only_b"]))):
            only.add_row(
                show(r["only_a"][i]) if i < len(r["only_a"]) else "",
                show(r["only_b"][i]) if i < len(r["only_b"]) else "",
            )
        console.print(only)
    return 0
