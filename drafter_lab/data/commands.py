"""CLI: `data prepare` (features from conversations), `data regenerate` (the target's own answers,
locally or through a server), and `data import-specforge` (features SpecForge captured)."""

from __future__ import annotations

import argparse
import contextlib
import os
from pathlib import Path

from drafter_lab.config import cli_flags, field_docs, flags_named, listed
from drafter_lab.errors import LabError
from drafter_lab.httpjson import add_client_args, server_url


def aux_ids_arg(text: str) -> list[int]:
    try:
        ids = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        ids = []
    if not ids:  # an empty one was refused only after the target loaded
        raise argparse.ArgumentTypeError(f"expected comma-separated integers like 2,4,5, got {text!r}")
    return ids


def register(subparsers) -> None:
    from drafter_lab.data.capture_config import DTYPE_NAMES, TURNS, CaptureConfig, template_kwargs_arg

    docs, d = field_docs(CaptureConfig), CaptureConfig()
    data = subparsers.add_parser("data", help="turn conversations into target features")
    data_sub = data.add_subparsers(dest="data_command", metavar="ACTION", required=True)
    p = data_sub.add_parser("prepare", help="run the target over conversations and write feature shards")
    p.add_argument("--target", required=True, help="local HF causal-LM directory")
    p.add_argument("--conversations", required=True, help="SpecForge/ShareGPT jsonl")
    p.add_argument("--out", required=True, help="feature directory (resumes if it holds a manifest)")
    p.add_argument("--regenerate", action="store_true", help=docs["regenerate"])
    # None until typed: a sampling flag typed without --regenerate is refused, at its default too
    p.add_argument("--temperature", type=float, help=f"{docs['temperature']} (default {d.temperature})")
    p.add_argument("--max-new-tokens", type=int, help=f"{docs['max_new_tokens']} (default {d.max_new_tokens})")
    p.add_argument("--regen-batch-size", type=int, help=f"{docs['regen_batch_size']} (default {d.regen_batch_size})")
    p.add_argument("--seed", type=int, help=f"{docs['seed']} (default {d.seed})")
    p.add_argument("--token-exact", action="store_true", help=docs["token_exact"])
    p.add_argument("--chat-template-kwargs", type=template_kwargs_arg, metavar="JSON",
                   help=docs["chat_template_kwargs"])
    p.add_argument("--turns", default=d.turns, choices=TURNS, help=docs["turns"])
    p.add_argument("--max-length", type=int, default=d.max_length, help=docs["max_length"])
    p.add_argument("--aux-layer-ids", type=aux_ids_arg, default=None, metavar="I,J,K", help=docs["aux_layer_ids"])
    p.add_argument("--dtype", default=d.dtype, choices=DTYPE_NAMES, help=docs["dtype"])
    p.add_argument("--batch-size", type=int, default=d.batch_size, help=docs["batch_size"])
    p.add_argument("--shard-size", type=int, default=d.shard_size, help=docs["shard_size"])
    p.add_argument("--val-fraction", type=float, default=d.val_fraction, help=docs["val_fraction"])
    p.add_argument("--tokenize-workers", type=int, default=d.tokenize_workers, help=docs["tokenize_workers"])
    p.add_argument("--strict", action="store_true", help=docs["strict"])
    p.add_argument("--device", default=d.device, help=docs["device"])
    p.set_defaults(func=_prepare)
    r = data_sub.add_parser("regenerate", help="have the target rewrite the assistant turns: locally, or "
                                                "through an OpenAI-compatible server (SGLang, vLLM)")
    r.add_argument("--conversations", required=True, help="SpecForge/ShareGPT jsonl")
    r.add_argument("--out", required=True, help="regenerated jsonl (a killed run resumes from <out>.partial)")
    who = r.add_mutually_exclusive_group(required=True)
    who.add_argument("--target", help="local HF causal-LM directory, run here with transformers")
    who.add_argument("--server", metavar="URL", type=server_url, help="base URL of a server with /v1/chat/completions")
    r.add_argument("--model", default=None, help="with --server: the model name to request (default: the first "
                                                 "the server's /v1/models lists)")
    r.add_argument("--concurrency", type=int, default=None, help="with --server: conversations in flight (default 8)")
    add_client_args(r)
    r.add_argument("--temperature", type=float, default=d.temperature, help=docs["temperature"])
    r.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens, help=docs["max_new_tokens"])
    r.add_argument("--batch-size", type=int, default=None,
                   help=f"with --target: {docs['regen_batch_size']} (default {d.regen_batch_size})")
    r.add_argument("--seed", type=int, default=d.seed, help=docs["seed"])
    r.add_argument("--device", default=None, help=f"with --target: {docs['device']} (default {d.device})")
    r.add_argument("--chat-template-kwargs", type=template_kwargs_arg, metavar="JSON",
                   help="variables for the chat template (here, or the server's: its requests carry them), e.g. "
                        "'{\"enable_thinking\": false}' for a hybrid thinking model served with its thinking off")
    r.set_defaults(func=_regenerate)
    i = data_sub.add_parser("import-specforge", help="SpecForge offline hidden states (*.ckpt, *.ckpt.gz) -> feature shards")
    i.add_argument("--hidden-states", required=True, help="directory SpecForge's prepare_hidden_states wrote")
    i.add_argument("--target", required=True, help="the target they were captured from (only config, "
                                                   "embedding and lm_head are read)")
    i.add_argument("--out", required=True, help="feature directory (resumes if it holds a manifest)")
    i.add_argument("--aux-layer-ids", type=aux_ids_arg, default=None, metavar="I,J,K",
                   help="SpecForge's ids (output of layer k), as in its draft config; default [1, L//2-1, L-4]")
    i.add_argument("--shard-size", type=int, default=d.shard_size, help=docs["shard_size"])
    i.add_argument("--val-fraction", type=float, default=d.val_fraction, help=docs["val_fraction"])
    i.set_defaults(func=_import_specforge)


def _prepare(args) -> int:
    import torch

    from drafter_lab.data.capture import CaptureConfig, check_config, prepare_features

    sampling = {k: getattr(args, k) for k in ("temperature", "max_new_tokens", "regen_batch_size", "seed")
                if getattr(args, k) is not None}
    if sampling and not args.regenerate:  # else sampling settings given for answers that are never sampled, unsaid
        given = [f"--{k.replace('_', '-')}" for k in sampling]
        raise LabError(f"{listed(given)} {'applies' if len(given) == 1 else 'apply'} with --regenerate (the "
                       "target's own answers); without it the recorded answers are captured as they are")
    cfg = CaptureConfig(
        aux_layer_ids=args.aux_layer_ids,
        max_length=args.max_length,
        dtype=args.dtype,
        batch_size=args.batch_size,
        shard_size=args.shard_size,
        val_fraction=args.val_fraction,
        regenerate=args.regenerate,
        **sampling,
        token_exact=args.token_exact,
        chat_template_kwargs=args.chat_template_kwargs,
        turns=args.turns,
        tokenize_workers=args.tokenize_workers,
        strict=args.strict,
        device=args.device,
    )
    with flags_named(cli_flags(args, *vars(cfg))):  # each field is the option of its name: the check names it so
        check_config(cfg)
    with _one_writer(Path(args.out)):
        manifest = prepare_features(args.target, args.conversations, args.out, cfg)
    if torch.distributed.is_initialized():  # under torchrun: rank 0 reports, every rank leaves the group
        rank = torch.distributed.get_rank()
        torch.distributed.destroy_process_group()
        if rank:
            return 0
    _print_manifest(manifest, args.out)
    return 0


def _regenerate(args) -> int:
    from drafter_lab.atomic import refuse_below_file, same_file
    from drafter_lab.data.conversations import read_conversations, write_conversations
    from drafter_lab.progress import log

    source, out = Path(args.conversations), Path(args.out)
    # Refused now, not when the finished file is written after all the generation.
    if out.is_dir():
        raise LabError("--out is a directory; give the path of the jsonl file to write", out)
    refuse_below_file(out)
    if same_file(out, source):
        raise LabError("--out is the --conversations file: the regenerated turns would replace the recorded ones; "
                       "choose another --out", out)
    partial = out.with_name(out.name + ".partial")
    if same_file(partial, source):  # the journal's lines would go into it
        raise LabError(f"--out's journal, {partial.name}, is the --conversations file; choose another --out", out)
    # A flag of the other mode would be ignored: the run would not be the one asked for.
    other = (("--batch-size", "--device") if args.server is not None
             else ("--model", "--concurrency", "--retries", "--timeout"))
    given = [f for f in other if getattr(args, f[2:].replace("-", "_")) is not None]
    if given:
        mode, other_mode = ("--server", "--target") if args.server is not None else ("--target", "--server")
        raise LabError(f"{listed(given)} {'is' if len(given) == 1 else 'are'} for {other_mode}, not {mode}")
    # The settings, refused before the conversations are read, naming the flags that set them
    flags = {**cli_flags(args, "max_new_tokens", "temperature", "concurrency", "retries", "seed"),
             "regen_batch_size": "--batch-size"}
    if args.server is not None:
        from drafter_lab.data.regenerate_server import ServerConfig, check_settings, regenerate_via_server

        served = {k: v for k, v in (("concurrency", args.concurrency), ("retries", args.retries),
                                    ("timeout_s", args.timeout)) if v is not None}
        cfg = ServerConfig(url=args.server, model=args.model, temperature=args.temperature,
                           max_new_tokens=args.max_new_tokens, seed=args.seed,
                           chat_template_kwargs=args.chat_template_kwargs, **served)
        with flags_named(flags):
            check_settings(cfg)
    else:
        from drafter_lab.data.capture import check_config
        from drafter_lab.data.capture_config import CaptureConfig, as_recorded

        batch_size = CaptureConfig.regen_batch_size if args.batch_size is None else args.batch_size
        with flags_named(flags):
            check_config(CaptureConfig(max_new_tokens=args.max_new_tokens, regen_batch_size=batch_size,
                                       temperature=args.temperature, seed=args.seed))
    from drafter_lab.data.regenerate import answerable

    # A file of prompts (user turns alone) is SpecForge's input for regenerating: the target writes the answers.
    convs, skipped = read_conversations(source, prompts=True)
    convs = answerable(convs, skipped, source)
    if not convs:
        raise LabError(f"no conversation with a user or assistant turn (skipped: {skipped})", source)
    if args.server is not None:
        regenerate_via_server(convs, source, out, cfg)
    else:
        from drafter_lab.data.chat import pinned
        from drafter_lab.data.regenerate import refuse_unanswering_journal, regenerate, regeneration_settings
        from drafter_lab.journal import Journal
        from drafter_lab.targets.hf import load_target

        target = load_target(args.target, device=args.device or CaptureConfig.device)
        before = Journal.settings_of(partial)
        # A template that reads the clock renders the day the journal's run began, else today's, throughout.
        gen = dict(temperature=args.temperature, max_new_tokens=args.max_new_tokens, batch_size=batch_size,
                   seed=args.seed, template_kwargs=pinned(target.tokenizer, args.chat_template_kwargs, [before]))
        now = regeneration_settings(target, source, **gen, conversations=convs)
        refuse_unanswering_journal(before, now, partial)
        if "path" in (before or {}).get("target", {}):  # begun when the path counted: resumed from any path now
            now["target"]["path"] = before["target"]["path"]
        if target.known_as(recorded := (before or {}).get("target", {}).get("fingerprint")):
            now["target"]["fingerprint"] = recorded  # begun under the target's legacy name
        settings = as_recorded(before, now, partial)
        with Journal(partial, settings) as journal:
            try:
                result = regenerate(target, convs, journal=journal, **gen)
            except LabError as e:  # a conversation's refusal names it, and this names its file
                if e.path is not None:
                    raise
                raise LabError(str(e), source) from None
        write_conversations(out, result)
        journal.discard()
    log(f"regenerated {len(convs)} conversations -> {out}" + (f" (skipped: {skipped})" if skipped else ""))
    return 0


def _import_specforge(args) -> int:
    from drafter_lab.data.specforge import check_settings, import_specforge

    with flags_named(cli_flags(args, "val_fraction", "shard_size")):  # options of the fields' names
        check_settings(args.val_fraction, args.shard_size)
    with _one_writer(Path(args.out)):
        manifest = import_specforge(args.hidden_states, args.target, args.out, aux_layer_ids=args.aux_layer_ids,
                                    val_fraction=args.val_fraction, shard_size=args.shard_size)
    _print_manifest(manifest, args.out)
    return 0


def _one_writer(out: Path):
    """Hold feature directory `out`'s lock (locks.building) on the rank that writes it: two runs on one
    directory would delete each other's half-written shards and overwrite each other's manifest. The
    second waits, then resumes the finished directory (or refuses it, made with other settings)."""
    from drafter_lab.data.capture import check_out_dir
    from drafter_lab.locks import building

    if int(os.environ.get("RANK", "0")):  # torchrun's other ranks write nothing
        return contextlib.nullcontext()
    check_out_dir(out)  # a path below a file, say, refused before the lock is made beside it
    return building(out, "feature directory")


def _print_manifest(manifest, out) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"features in {out} (target {manifest.target['fingerprint']})")
    for col in ("split", "shards", "sequences", "tokens", "loss tokens"):
        table.add_column(col, justify="right")
    for split in manifest.shards:
        n = manifest.counts(split)
        table.add_row(split, str(len(manifest.shards[split])), str(n["sequences"]), str(n["tokens"]), str(n["loss_tokens"]))
    console = Console()
    console.print(table)
    console.print(
        f"aux layer ids {manifest.aux_layer_ids} ({manifest.aux_convention}), dtype {manifest.dtype}, "
        f"skipped {manifest.skipped or 'none'}",
        highlight=False,
        soft_wrap=True,
    )
