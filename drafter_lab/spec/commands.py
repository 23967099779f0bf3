"""CLI: `drafter-lab eval` (speculative decoding measured for real) and `drafter-lab costmodel`."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from drafter_lab import atomic
from drafter_lab import config as labconfig
from drafter_lab.data.capture_config import (
    DTYPE_NAMES,
    as_recorded,
    template_kwargs_arg,
)
from drafter_lab.errors import LabError
from drafter_lab.httpjson import add_client_args, server_url
from drafter_lab.spec.ngram_config import NgramConfig

# Flags of the lab's own decoding, with their defaults: a served eval (--server) refuses them.
LOCAL_ONLY = {"steps": [4], "topk": [1], "draft_tokens": None, "batch": [1], "schedule": "static",
              "device": "auto", "dtype": "float32", "threads": 0, "fused": "auto", "allow_other_target": False,
              "ngram_min": None, "ngram_max": None, "ngram_across_prompts": False, "plot": None}
# Flags of an EAGLE-3 drafter's decoding: n-gram drafting (--ngram) refuses them.
DRAFTER_ONLY = ("fused", "allow_other_target")


def positive_int(text: str) -> int:
    """argparse type of a count: one integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def int_list(text: str) -> list[int]:
    """argparse type of a sweepable flag: positive integers separated by commas, each once (a value given
    twice was timed or run twice, the second result replacing the first)."""
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers separated by commas, got {text!r}") from None
    if min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return list(dict.fromkeys(values))


def rate_list(text: str) -> list[float]:
    """argparse type of --request-rate: positive requests per second separated by commas."""
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers separated by commas, got {text!r}") from None
    if not all(0 < v < float("inf") for v in values):
        raise argparse.ArgumentTypeError(f"expected positive finite requests per second, got {text!r}")
    return values


def register(sub) -> None:
    e = sub.add_parser(
        "eval",
        help="served accept length, tok/s with and without speculation, lossless check",
        description="Decode each conversation's first prompt with the target alone and with the drafter "
        "(same prompts, same max_new_tokens, same run); report the served accept length (tokens per "
        "verify step, bonus included), its histogram, both tok/s and their ratio. Greedy outputs must be "
        "identical: any difference is an error naming the prompt and position. With --server instead of "
        "--drafter, a running SGLang or vLLM server decodes (with its own speculative settings), and "
        "--baseline-server (the target served without speculation) gives the other tok/s. With --ngram, "
        "drafts come from n-gram lookup in each prompt and its output (vLLM's `ngram` method): the "
        "drafter-free baseline. Several values for --steps, --topk, --draft-tokens "
        "or --batch sweep the settings (one decode each, a row each), as SGLang's bench_speculative does.",
    )
    who = e.add_mutually_exclusive_group(required=True)
    who.add_argument("--drafter", help="drafter checkpoint directory (decoded here, by the lab's engine)")
    who.add_argument("--server", metavar="URL", type=server_url, help="base URL of an SGLang or vLLM server with speculative decoding")
    who.add_argument("--ngram", action="store_true",
                     help="no drafter: draft chains by n-gram lookup in each row's own tokens (prompt lookup)")
    e.add_argument("--target", required=True, help="target model directory (any local HF causal LM; with "
                                                    "--server only its tokenizer and chat template are read)")
    e.add_argument("--prompts", required=True, action="append",
                   help="ShareGPT/SpecForge jsonl conversations, each decoded from its first prompt (user turns "
                        "without answers, as MT-bench's, will do); repeat for several prompt sets (chat, code, "
                        "math, ...): each is decoded and reported apart, then pooled")
    e.add_argument("--baseline-server", metavar="URL", type=server_url, default=None,
                   help="with --server: the same target served without speculation")
    e.add_argument("--engine", default="sglang", choices=("sglang", "vllm"),
                   help="with --server: the serving engine (SGLang: per-request meta_info; vLLM: /metrics counters, "
                        "so nothing else may use the server meanwhile)")
    e.add_argument("--model", default=None, help="with --server --engine vllm: the served model name "
                                                 "(default: the first one /v1/models lists)")
    e.add_argument("--concurrency", type=int_list, default=[1],
                   help="with --server: requests in flight at most; a list (1,4,16) sweeps, as bench_speculative's "
                        "batch sizes")
    e.add_argument("--request-rate", type=rate_list, default=[None], metavar="RATE",
                   help="with --server: requests per second, arriving as a seeded Poisson process (bench_serving's "
                        "--request-rate; default: all at once); a list (1,4,16) sweeps")
    add_client_args(e)
    e.add_argument("--steps", type=int_list, default=LOCAL_ONLY["steps"],
                   help="draft depth S (drafter steps per cycle); a list (2,4,6) sweeps")
    e.add_argument("--topk", type=int_list, default=LOCAL_ONLY["topk"],
                   help="children per expanded node: 1 = chain, > 1 = tree; a list sweeps")
    e.add_argument("--draft-tokens", type=int_list, default=LOCAL_ONLY["draft_tokens"],
                   help="tree: draft tokens verified per cycle (default steps * topk), the root not counted (SGLang's "
                        "--speculative-num-draft-tokens minus 1); a chain verifies its steps; a list sweeps")
    e.add_argument("--batch", type=int_list, default=LOCAL_ONLY["batch"],
                   help="prompts decoded together (a server's concurrency); a list (1,4,16) sweeps")
    e.add_argument("--schedule", default=LOCAL_ONLY["schedule"], choices=("static", "continuous"),
                   help="static: batch after batch, each until its last row ends; continuous: --batch rows in "
                        "flight, a waiting prompt takes each finished row's place (as a server batches)")
    e.add_argument("--max-new-tokens", type=int, default=64, help="tokens generated per prompt")
    e.add_argument("--max-prompts", type=positive_int, default=None, help="use only the first N conversations")
    e.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (lossless check); > 0 sampling")
    e.add_argument("--seed", type=int, default=0, help="sampling seed (with --server: of the request arrivals)")
    e.add_argument("--chat-template-kwargs", type=template_kwargs_arg, metavar="JSON",
                   help="variables for the chat template that renders the prompts, as the served requests would "
                        "carry them (e.g. '{\"enable_thinking\": false}')")
    e.add_argument("--device", default=LOCAL_ONLY["device"], help="auto (cuda when available), cpu or cuda")
    e.add_argument("--dtype", default=LOCAL_ONLY["dtype"], choices=DTYPE_NAMES, help="target and drafter dtype")
    e.add_argument("--threads", type=int, default=LOCAL_ONLY["threads"],
                   help="CPU threads for torch (0 = torch's default); tiny models time best and steadiest with 1")
    e.add_argument("--fused", default=LOCAL_ONLY["fused"], choices=("auto", "on", "off"),
                   help="draft step: fused op (on), PyTorch reference (off), or fused when built on CUDA (auto)")
    e.add_argument("--ngram-min", type=int, default=LOCAL_ONLY["ngram_min"],
                   help=f"with --ngram: shortest suffix that may match (default {NgramConfig.min_n})")
    e.add_argument("--ngram-max", type=int, default=LOCAL_ONLY["ngram_max"],
                   help=f"with --ngram: longest suffix, tried first (default {NgramConfig.max_n})")
    e.add_argument("--ngram-across-prompts", action="store_true",
                   help="with --ngram: also look up the prompts decoded before and their outputs (SGLang's NGRAM "
                        "cache), after the row's own tokens")
    e.add_argument("--allow-other-target", action="store_true",
                   help="decode with a drafter recorded as trained on another target (zero-shot transfer)")
    e.add_argument("--json", default=None, help="write every number to this JSON file")
    e.add_argument("--plot", default=None, metavar="FILE.png",
                   help="draw where each setting's time goes: a speculative cycle and a target-only step, by phase")
    e.set_defaults(func=run_eval)

    c = sub.add_parser(
        "costmodel",
        help="verify-step cost model: spec tok/s, break-even accept length, all-reduce what-ifs",
        description="spec tok/s = A / (steps x draft step + verify + overhead), verify = layers x compute + "
        "all-reduces x latency. Unset fields keep the preset's values. Prints the break-even served accept length and what-if tables over "
        "all-reduce latency and accept length; with a chain eval's accept histogram (or --accept-by-steps), "
        "tok/s per draft depth and the best one; with --batches 1,8,32, the same drafting at each batch size.",
    )
    from drafter_lab.spec.costmodel import PRESETS, CostModelConfig

    c.add_argument("--preset", default="seeds-kimi-k2.5-8x-pcie", choices=sorted(PRESETS))
    c.add_argument("--inputs", action="append", default=[],
                   help="measured inputs JSON: a benchmark's (allreduce_us, draft_step_us, verify_ms, decode_ms, "
                        "accept_length) or an `eval --json` (served accept length, and from a chain eval the "
                        "draft-steps table; from a sweep, a row per setting and the best), or a `train` run directory "
                        "(or its best/): the accept length its validation predicts at each depth; repeat to combine several")
    c.add_argument("--sampled", action="store_true",
                   help="a train run's prediction for a sampled chain (from `train --val-temperature T`: its "
                        "replay_accept_len_k where it replayed the target's own tokens, else its sampled_acc_k) "
                        "instead of the greedy one")
    c.add_argument("--json", default=None, help="write the model's numbers to this JSON file")
    c.add_argument("--plot", default=None, metavar="FILE.png",
                   help="draw tok/s against accept length (and draft depth) per all-reduce latency")
    labconfig.add_cli_args(c, CostModelConfig, skip=("draft_step_us_by_batch", "draft_extend_us_by_batch",
                                                             "pass_ms_by_tokens"))  # tables: --inputs
    c.set_defaults(func=run_costmodel)


def _prompt_sets(args) -> dict[str, tuple[str, list]]:
    """Each --prompts file's conversations (cut to --max-prompts), named by the file's stem."""
    from drafter_lab.data.conversations import read_conversations
    from drafter_lab.progress import log

    sets = {}
    for i, path in enumerate(args.prompts):
        # decoded again and pooled twice, and a fourth `p.jsonl` replaced the second's set
        if any(atomic.same_file(path, earlier) for earlier in args.prompts[:i]):
            raise LabError("--prompts names this file twice: give each prompt set once", path)
        convs, skipped = read_conversations(path, prompts=True)
        if skipped:
            log(f"{path}: skipped {skipped}")
        convs = convs[: args.max_prompts] if args.max_prompts is not None else convs  # never empty: one is kept
        name = Path(path).stem
        sets[name if name not in sets else str(path)] = (path, convs)
    return sets


def _pooled(results: dict[str, dict]) -> dict:
    """The one result of a run over prompt sets: the set's own, or their pool."""
    from drafter_lab.spec.eval import pool

    if len(results) == 1:
        return next(iter(results.values()))
    return {**pool(results), "prompts_file": [r["prompts_file"] for r in results.values()]}


def _finish(results: dict[str, dict], args, fmt) -> list[dict]:
    """Print (each set, then the pool) and write the JSON; returns [the pooled result]."""
    result = _pooled(results)
    if len(results) > 1:
        print("\n".join(_set_line(name, r) for name, r in results.items()) + "\npooled over the sets:")
    print(fmt(result))
    if args.json:
        atomic.write_json(args.json, result)
    return [result]


def _set_line(name: str, r: dict) -> str:
    ratio = f", {r['speedup']:.2f}x" if "speedup" in r else ""
    return (f"set {name}: {r['prompts']} prompts, served accept {r['served_accept_len']:.3f} over "
            f"{r['verify_steps']} verify steps, spec {r['spec_tok_s']:.1f} tok/s{ratio}")


def _refuse_plot_suffix(plot) -> None:
    """--plot draws a PNG, as every plot the lab writes (plotting.save_png): another suffix would name a
    file of PNG bytes that its viewer reads as something else."""
    if plot and Path(plot).suffix.lower() != ".png":
        raise LabError("--plot writes a PNG: name a .png file", plot)


def run_eval(args) -> int:
    import torch

    from drafter_lab.spec.engine import SpecConfig, SpecEngine
    from drafter_lab.spec.eval import evaluate, render_prompts
    from drafter_lab.spec.pairing import load_for_target
    from drafter_lab.spec.sweep import grid
    from drafter_lab.targets.hf import load_target
    from drafter_lab.threads import check_threads

    _check_decoding(args)
    sets = _prompt_sets(args)
    # written last, after the decoding's minutes; a sweep's journal (--json's .partial) as it goes
    journal = f"{args.json}.partial" if args.json else None
    atomic.refuse_outputs([("--json", args.json), ("--json's journal", journal), ("--plot", args.plot)],
                          [("--prompts", p) for p in args.prompts] + [("--drafter", args.drafter), ("--target", args.target)])
    _refuse_plot_suffix(args.plot)
    if args.server is not None:
        return _run_served_eval(args, sets)
    if (args.baseline_server is not None or args.concurrency != [1] or args.request_rate != [None]
            or args.engine != "sglang" or args.model or args.timeout is not None or args.retries is not None):
        raise LabError("--baseline-server, --engine, --model, --concurrency, --timeout, --retries and --request-rate "
                       "apply to a served eval (--server)")
    if args.threads < 0:
        raise LabError(f"--threads must be >= 0, got {args.threads}")
    check_threads(args.threads)
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    with labconfig.flags_named(labconfig.cli_flags(args, "draft_tokens")):  # refused before the target loads
        settings = grid(args.steps, args.topk, args.draft_tokens, args.batch)
    if args.ngram:
        drafter = _ngram_drafter(args)  # its flags are checked before the target loads
    elif (args.ngram_min, args.ngram_max, args.ngram_across_prompts) != (None, None, False):
        raise LabError("--ngram-min, --ngram-max and --ngram-across-prompts apply to n-gram drafting (--ngram)")
    target = load_target(args.target, device=args.device, dtype=dtype)
    _pin_template_date(args, target.tokenizer)
    if not args.ngram:
        drafter = load_for_target(args.drafter, target, args.allow_other_target).to(dtype)

    rendered = {}  # per prompts file, rendered once for every setting's check

    def check(setting: dict) -> None:
        """What each setting's decode refuses before it decodes (past the target's positions), for a sweep's
        every setting before its first decodes."""
        cfg = SpecConfig(steps=setting["steps"], topk=setting["topk"], draft_tokens=setting["draft_tokens"],
                         max_new_tokens=args.max_new_tokens)
        for name, (path, convs) in sets.items():
            if name not in rendered:
                rendered[name] = render_prompts(target.tokenizer, convs, path, args.chat_template_kwargs)
            with labconfig.flags_named(labconfig.cli_flags(args, "steps", "topk", "max_new_tokens")):
                SpecEngine(target, drafter, cfg).check_positions(rendered[name])

    def decode(setting: dict) -> dict[str, dict]:
        results = {}
        for name, (path, convs) in sets.items():
            with labconfig.flags_named(labconfig.cli_flags(args, "steps", "topk", "max_new_tokens")):
                results[name] = evaluate(
                    target, drafter, convs, **setting, continuous=args.schedule == "continuous",
                    max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=args.seed,
                    use_fused={"auto": None, "on": True, "off": False}[args.fused],
                    template_kwargs=args.chat_template_kwargs, where=path,
                )
            results[name].update(drafter=str(args.drafter or "ngram"), prompts_file=str(path))
        return results

    return _run_settings(settings, decode, format_eval, args, lambda: _sweep_journal(args, target, drafter, sets),
                         check)


def _check_decoding(args) -> None:
    """The settings every eval decodes with, refused as the engine refuses them but naming the flags, and
    before the prompts are read (a served eval's were refused at its first request)."""
    from drafter_lab.spec.engine import SpecConfig

    flags = labconfig.cli_flags(args, "max_new_tokens", "temperature", "retries")
    with labconfig.flags_named(flags):
        SpecConfig(max_new_tokens=args.max_new_tokens, temperature=args.temperature)
    if args.server is None:  # it seeds torch's generators here (a server's, the request arrivals)
        labconfig.check_seed(args.seed, "--seed")
        return
    from drafter_lab.spec.served import ServedConfig, check_settings

    # as each setting's decode checks them (--concurrency and --request-rate, which vary, by their argparse
    # types), but before the prompts are read: a negative --retries was refused once the tokenizer had loaded
    with labconfig.flags_named(flags):
        check_settings(ServedConfig(url=args.server, engine=args.engine, baseline_url=args.baseline_server,
                                    max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                                    **({} if args.retries is None else {"retries": args.retries})))


def _run_settings(settings: list[dict], decode, fmt, args, make_journal, check=None) -> int:
    """One setting: printed and written as an eval; several: a sweep, a row each, journaled while it
    runs when it writes JSON, each setting `check`ed before the first decodes."""
    from drafter_lab.spec.sweep import format_sweep, run_sweep

    if len(settings) == 1:
        results = _finish(decode(settings[0]), args, fmt)
    else:
        journal = make_journal() if args.json else None
        results = run_sweep(settings, lambda s: _pooled(decode(s)), journal, check)
        print(format_sweep(results))
        if journal:
            atomic.write_json(args.json, {"sweep": results})
            journal.discard()
    if args.plot:
        from drafter_lab.spec.phaseplot import plot

        plot(results, args.plot)
    return 0


def _pin_template_date(args, tokenizer) -> None:
    """`args.chat_template_kwargs` with the day a template that reads the clock renders every prompt of
    the eval (chat.pinned): a resumed sweep's, else today's; its results record it."""
    from drafter_lab.data.chat import pinned
    from drafter_lab.journal import Journal

    before = Journal.settings_of(f"{args.json}.partial") if args.json else None
    args.chat_template_kwargs = pinned(tokenizer, args.chat_template_kwargs, [before])


def _journal(args, tokenizer, settings: dict):
    """A sweep's journal (`--json`'s `.partial`): its finished settings, kept until the JSON lands."""
    from drafter_lab.data.chat import rendered_with
    from drafter_lab.journal import Journal

    path = f"{args.json}.partial"
    settings = {**settings, **rendered_with(tokenizer, args.chat_template_kwargs)}
    return Journal(path, as_recorded(Journal.settings_of(path), settings, path), flag="--json")


def _sweep_journal(args, target, drafter, sets):
    """What a sweep decoded with: target and drafter by fingerprint, or by the legacy names a journal
    begun before them holds; and where it timed them (the device `auto` chose, the torch threads), as its
    rows' tok/s ratios only compare within one machine setting."""
    import torch

    from drafter_lab.journal import Journal
    from drafter_lab.targets.fingerprint import recorded_name

    before = Journal.settings_of(f"{args.json}.partial") or {}
    same = {k: getattr(args, k) for k in ("schedule", "max_prompts", "max_new_tokens", "temperature", "seed", "device",
                                         "dtype", "fused")}
    timed_on = {"timed_on": {"device": str(target.device), "threads": torch.get_num_threads()}}
    return _journal(args, target.tokenizer, {
        "target": before["target"] if target.known_as(before.get("target")) else target.fingerprint,
        "drafter": drafter.cfg.describe() if args.ngram else recorded_name(args.drafter, before.get("drafter")),
        "prompts": {name: atomic.sha256_file(path) for name, (path, _) in sets.items()}, **same,
        **(timed_on if not before or "timed_on" in before else {}),  # a journal begun before it resumes as it was
    })


def _ngram_drafter(args):
    from drafter_lab.spec.ngram import NgramDrafter

    given = [f"--{k.replace('_', '-')}" for k in DRAFTER_ONLY if getattr(args, k) != LOCAL_ONLY[k]]
    if given:
        raise LabError(f"{labconfig.listed(given)} {'applies' if len(given) == 1 else 'apply'} to an EAGLE-3 "
                       "drafter, not to n-gram drafting (--ngram)")
    sizes = {k: v for k, v in (("min_n", args.ngram_min), ("max_n", args.ngram_max)) if v is not None}
    with labconfig.flags_named({"min_n": "--ngram-min", "max_n": "--ngram-max"}):  # the flags that set them
        return NgramDrafter(NgramConfig(**sizes, across_prompts=args.ngram_across_prompts))


def _run_served_eval(args, sets) -> int:
    from drafter_lab.spec.served import ServedConfig, served_evaluate
    from drafter_lab.targets.hf import load_tokenizer

    given = [f"--{k.replace('_', '-')}" for k, v in LOCAL_ONLY.items() if getattr(args, k) != v]
    if given:
        raise LabError(f"{labconfig.listed(given)} {'applies' if len(given) == 1 else 'apply'} to the lab's own decoding; a server drafts with its own "
                       "settings (--speculative-num-steps and the like)")
    tokenizer = load_tokenizer(args.target)
    _pin_template_date(args, tokenizer)

    def decode(setting: dict) -> dict[str, dict]:
        cfg = ServedConfig(url=args.server, engine=args.engine, baseline_url=args.baseline_server, model=args.model,
                           max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=args.seed, **setting,
                           **({} if args.timeout is None else {"timeout_s": args.timeout}),
                           **({} if args.retries is None else {"retries": args.retries}))
        results = {}
        for name, (path, convs) in sets.items():
            results[name] = served_evaluate(tokenizer, convs, cfg, where=path, template_kwargs=args.chat_template_kwargs)
            results[name]["prompts_file"] = str(path)
        return results

    settings = [{"concurrency": c, "request_rate": r} for c in dict.fromkeys(args.concurrency)
                for r in dict.fromkeys(args.request_rate)]
    return _run_settings(settings, decode, format_served, args, lambda: _served_journal(args, sets, tokenizer))


def _served_journal(args, sets, tokenizer):
    """What a served sweep decoded, against which servers."""
    return _journal(args, tokenizer, {
        "server": args.server, "baseline_server": args.baseline_server, "engine": args.engine, "model": args.model,
        "prompts": {name: atomic.sha256_file(path) for name, (path, _) in sets.items()},
        **{k: getattr(args, k) for k in ("max_prompts", "max_new_tokens", "temperature", "seed")},
    })


def _histogram_lines(hist: dict) -> list[str]:
    total = max(sum(hist.values()), 1)
    return ["histogram (served accept length: share of verify steps):"] + [
        f"  {k:>2}: {n / total:6.1%} {'#' * round(40 * n / total)}" for k, n in hist.items()]


def format_served(r: dict) -> str:
    c = r["config"]
    settings = ", ".join(f"{k.removeprefix('speculative_')} {v}" for k, v in r["server_settings"].items())
    lines = [
        f"{r['engine']} server {r['server']} ({settings or 'no speculative settings reported'}): {r['prompts']} prompts x "
        f"{c['max_new_tokens']} new tokens, temperature {c['temperature']:g}, {c['concurrency']} in flight at most"
        + ("" if c["request_rate"] is None else f", arriving at {c['request_rate']:g} per second (Poisson, seed {c['seed']})"),
        f"served accept length: {r['served_accept_len']:.3f} tokens per verify step (bonus included), "
        f"{r['verify_steps']} verify steps",
    ]
    if r["accept_histogram"] is not None:
        lines += _histogram_lines(r["accept_histogram"])
    if "baseline_tok_s" in r:
        lines += [f"tok/s: speculative {r['spec_tok_s']:.1f}, baseline server {r['baseline_tok_s']:.1f}, "
                  f"ratio {r['speedup']:.2f}x",
                  f"greedy outputs against the baseline server: {r['lossless_check']}"]
    else:
        lines.append(f"tok/s: speculative {r['spec_tok_s']:.1f} (no --baseline-server to compare with)")
    chunks = {side: sum(r["requests"][side]["chunks"]) for side in ("spec", "baseline")}
    load = r["in_flight"]
    lines += [f"requests in flight on average: speculative {load['spec']:.2f}"
              + ("" if load["baseline"] is None else f", baseline server {load['baseline']:.2f}"),
              *_latency_lines(r["latency"], "baseline server"),
              f"streamed tokens per event: speculative {r['spec_tokens'] / chunks['spec']:.2f}"
              + (f", baseline server {r['baseline_tokens'] / chunks['baseline']:.2f}" if chunks["baseline"] else "")]
    return "\n".join(lines)


def format_eval(r: dict) -> str:
    c = r["config"]
    lines = [
        f"{c['drafting']} drafting: steps {c['steps']}, topk {c['topk']}, draft tokens {c['draft_tokens']}, "
        f"batch {c['batch']} ({c['schedule']}), {r['prompts']} prompts x {c['max_new_tokens']} new tokens, "
        f"temperature {c['temperature']:g}, {r['device']} {r['dtype']}, {c['drafter']}"
        + (", fused draft step" if c["fused_draft_step"] else ""),
        f"served accept length: {r['served_accept_len']:.3f} tokens per verify step (bonus included), "
        f"{r['verify_steps']} verify steps",
        *_histogram_lines(r["accept_histogram"]),
    ]
    lines += [
        f"tok/s: speculative {r['spec_tok_s']:.1f}, target only {r['baseline_tok_s']:.1f}, "
        f"ratio {r['speedup']:.2f}x",
        f"lossless check: {r['lossless_check']}",
        f"unfinished rows per target pass: speculative {r['live_rows_per_pass']['spec']:.2f}, "
        f"target only {r['live_rows_per_pass']['baseline']:.2f}",
        *_latency_lines(r["latency"]),
        *_phase_lines(r),
    ]
    return "\n".join(lines)


def _latency_lines(lat: dict, baseline: str = "target only") -> list[str]:
    """Per request, speculative / the baseline."""
    def pair(key: str, stat: str) -> str:
        return " / ".join("-" if lat[side][key][stat] is None else f"{lat[side][key][stat]:.2f}"
                          for side in ("spec", "baseline"))

    return [f"per request, ms (speculative / {baseline}): TTFT median {pair('ttft_ms', 'median')}, "
            f"p90 {pair('ttft_ms', 'p90')}; TPOT median {pair('tpot_ms', 'median')}, p90 {pair('tpot_ms', 'p90')}"
            + (f" ({lat['tpot_speedup']:.2f}x faster per token)" if lat["tpot_speedup"] else "")]


def _phase_lines(r: dict) -> list[str]:
    """Each decode's wall time per target pass, by phase (its prefill spread over the passes)."""
    from drafter_lab.spec.phases import per_pass_ms

    lines = ["where the time goes (ms per target pass):"]
    for side, label, rename in (("spec", "speculative cycle", {}), ("baseline", "target-only step", {"verify": "decode"})):
        per = {rename.get(k, k): ms for k, ms in per_pass_ms(r, side).items()}
        lines.append(f"  {label + ':':<18} " + " + ".join(f"{k} {ms:.2f}" for k, ms in per.items())
                     + f" = {sum(per.values()):.2f}")
    return lines


def run_costmodel(args) -> int:
    from drafter_lab.spec.costinputs import MEASURED_ACCEPT, fold, read_inputs
    from drafter_lab.spec.costmodel import PRESETS, check_fields
    from drafter_lab.spec.costreport import format_report, report, settings_table

    # written after the report is printed: refused before it, and before the inputs are read
    atomic.refuse_outputs([("--json", args.json), ("--plot", args.plot)], [("--inputs", p) for p in args.inputs])
    _refuse_plot_suffix(args.plot)
    cfg = PRESETS[args.preset]
    flags = labconfig.cli_flags(args)
    with labconfig.flags_named(flags):  # a flag's value is final (no input replaces it): refused before they are read
        check_fields(labconfig.apply_cli_args(cfg, args))
    measured = None
    sweeps = []
    if args.sampled and not any(Path(p).is_dir() for p in args.inputs):
        raise LabError("--sampled prices a train run's sampled prediction: give the run's directory with --inputs")
    measured_by = None  # the input whose accept lengths price the drafter
    for i, path in enumerate(args.inputs):
        if any(atomic.same_file(path, earlier) for earlier in args.inputs[:i]):  # a sweep's rows came twice
            raise LabError("--inputs names this file twice: give each input once", path)
        data = read_inputs(path, args.sampled)
        if "sweep" in data:  # priced row by row below, on the config the other inputs make
            sweeps.append((path, data["sweep"]))
            continue
        # Two drafters' measurements folded into one deployment priced neither: a later eval's accept
        # lengths replaced the earlier's, beside its n-gram lookup time and no-match share.
        if any(k in data for k in MEASURED_ACCEPT):
            if measured_by is not None:
                raise LabError(f"{measured_by} and {path} each measure a drafter's accept lengths, and one cost model "
                               "prices one drafter: give one of them (a run each to compare them)", path)
            measured_by = path
        cfg, latency = fold(cfg, data, path)
        measured = latency if latency is not None else measured
    cfg = labconfig.apply_cli_args(cfg, args)  # a flag given says what the files must not change
    if args.cfg__verify_layer_compute_us is not None and args.cfg__measured_verify_ms is None:
        cfg = dataclasses.replace(cfg, measured_verify_ms=0.0)  # the flag's compute, not a file's verify
    if args.cfg__draft_step_us is not None:  # the flag's draft step, not a file's measured tables (read first)
        cfg = dataclasses.replace(cfg, draft_step_us_by_batch={}, draft_extend_us_by_batch={})
    if args.cfg__decode_ms is not None and cfg.pass_ms_by_tokens:  # the table prices decode and verify alike
        raise LabError("--decode-ms does not apply beside a `bench verify` pass table in --inputs, which measures "
                       "the decode step: leave one out")
    priced = args.cfg__verify_allreduce_us is None  # the flag's all-reduce, and a file's only as a what-if row
    try:
        with labconfig.flags_named(flags):  # "lower verify_allreduce_us": the flag, where one set it
            r = report(cfg, measured, priced)
    except LabError as e:  # the deployment the inputs made is inconsistent: say which inputs made it
        if e.path is not None or not args.inputs:
            raise
        raise LabError(f"{e} (the deployment {' + '.join([args.preset, *args.inputs])} made)") from None
    r["settings"] = [row for path, sweep in sweeps for row in settings_table(cfg, sweep, measured if priced else None, path)]
    r["preset"] = args.preset
    print(format_report(r, " + ".join([args.preset, *args.inputs])))
    if args.json:
        atomic.write_json(args.json, r)
    if args.plot:
        from drafter_lab.spec.costplot import plot

        plot(cfg, args.plot, measured, priced=priced)
    return 0
