"""Benchmark: the target's verify pass against the tokens it carries, on this device.

    drafter-lab bench verify --target DIR [--drafter DIR] [--tokens 1,2,4,8,16] [--batch 1,4,16] [--json FILE]

The cost model prices a verify of B rows x T tokens as per-layer compute that grows by
`verify_token_compute_us` per token; nothing measured that growth. This times the pass the engine
runs each cycle (`TargetRunner.verify` over a chain of T tokens per row, after a prefill of
`--context` tokens; with T = 1 it is a plain decode step, always measured since the baseline is
priced from it) at every (B, T), rolling the cache back after each pass, median of `--reps`
synchronised passes. With `--drafter` the passes also return the drafter's aux hidden states, as
the engine's verify does, and it also times, at each
batch and the same context, one draft step and the draft extend (the drafter's pass over
`--extend-tokens` accepted tokens per row, which also yields the next cycle's first draft). It
prints the table and (given two token counts B x T) the line ms = a + b x (B x T) fitted over every
point, with its worst error:
b per layer is the `--verify-token-compute-us` of a deployment priced per layer (a
tensor-parallel preset). `--json` writes a cost-model inputs file
that prices this device itself: the target's shape as a one-device deployment (layers, hidden
size, dtype bytes, no all-reduces, no host overhead per cycle), `decode_ms` (the T = 1 pass at the
smallest batch measured), the passes
(`verify_ms_by_tokens`, read at each setting's batch and tokens) and, with a drafter,
`draft_step_us_by_batch` and `draft_extend_us_by_batch`.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import time

import torch

from drafter_lab import atomic
from drafter_lab.config import check_seed
from drafter_lab.errors import LabError, run_module
from drafter_lab.progress import log, progress
from drafter_lab.spec.commands import int_list
from drafter_lab.spec.drafting import DrafterRunner, resolve_step
from drafter_lab.spec.target import TargetRunner
from drafter_lab.spec.tree import chain
from drafter_lab.threads import check_threads

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def parse(argv) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="drafter-lab bench verify", description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True, help="target model directory (any local HF causal LM)")
    ap.add_argument("--drafter", default=None, help="drafter checkpoint: also time its draft step at each batch")
    ap.add_argument("--tokens", type=int_list, default=[1, 2, 4, 8, 16], help="tokens per row in a pass (T)")
    ap.add_argument("--batch", type=int_list, default=[1, 4, 16], help="rows per pass (B)")
    ap.add_argument("--context", type=int, default=256, help="tokens already in each row's cache")
    ap.add_argument("--extend-tokens", type=int, default=3, help="accepted tokens per row the draft extend runs over "
                                                                 "(about the served accept length)")
    ap.add_argument("--device", default="auto", help="auto (cuda when available), cpu or cuda")
    ap.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    ap.add_argument("--threads", type=int, default=0, help="CPU threads for torch (0 = torch's default)")
    ap.add_argument("--reps", type=int, default=20, help="timed passes per point (median)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="write the cost-model inputs here")
    args = ap.parse_args(argv)
    for name, least in (("context", 1), ("reps", 1), ("extend_tokens", 1), ("warmup", 0), ("threads", 0)):
        if getattr(args, name) < least:  # the flag typed and its value, not every count's bound at once
            raise LabError(f"--{name.replace('_', '-')} must be >= {least}, got {getattr(args, name)}")
    check_seed(args.seed, "--seed")  # before the target loads
    check_threads(args.threads)
    if args.json:  # written after every pass is timed
        atomic.refuse_unwritable(args.json, "--json")
    if 1 not in args.tokens:
        args.tokens = [1, *args.tokens]
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise LabError("--device cuda: no CUDA device is visible")
    return args


def median_ms(fn, after, device: torch.device, reps: int, warmup: int) -> float:
    """Median wall time of fn() (synchronised on CUDA), with after() run untimed after each call."""
    times = []
    for i in range(warmup + reps):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
        after()
    return 1e3 * statistics.median(times)


def time_verify(target, aux_ids: list[int], batch: int, tokens: int, args, gen: torch.Generator) -> float:
    """One verify of `tokens` per row over `batch` rows of `args.context` committed tokens, returning
    the aux hidden states of `aux_ids` (none: logits only)."""
    dev = target.device
    runner = TargetRunner(target.model, aux_ids, target.path)
    ids = torch.randint(target.vocab_size, (batch, args.context + tokens), generator=gen).to(dev)
    lens = torch.full((batch,), args.context, device=dev)
    runner.prefill(ids[:, : args.context], lens, aux=False)
    tree = chain(ids[:, args.context], ids[:, args.context + 1:])
    ancestors = tree.ancestors()
    path = torch.zeros(batch, 1, dtype=torch.long, device=dev)
    none = torch.zeros(batch, dtype=torch.long, device=dev)
    return median_ms(lambda: runner.verify(tree.tokens, tree.depth, ancestors, aux=bool(aux_ids)),
                     lambda: runner.commit(path, none, tokens), dev, args.reps, args.warmup)


def time_draft_step(drafter, batch: int, args, gen: torch.Generator) -> float:
    """One draft step (the drafter's own hidden state in, as at depth >= 1) per row, in us."""
    step, _ = resolve_step(drafter, None)
    c, dev = drafter.config, drafter.fc.weight.device
    dtype = drafter.fc.weight.dtype

    def rand(*shape):
        return torch.randn(shape, generator=gen).to(device=dev, dtype=dtype)

    k, v = drafter.new_kv_cache(batch, args.context + 1)
    k.copy_(rand(*k.shape))
    v.copy_(rand(*v.shape))
    embeds, hidden = rand(batch, c.hidden_size), rand(batch, c.hidden_size)
    pos = torch.full((batch,), args.context, device=dev)
    with torch.no_grad():
        return 1e3 * median_ms(lambda: step(embeds, hidden, pos, k, v, pos, 1), lambda: None, dev, args.reps,
                               args.warmup)


def fit_verify(table: dict[int, dict[int, float]]) -> tuple[float, float, float] | None:
    """Least-squares line ms = a + b x n through passes of n = batch x tokens tokens; returns
    (a, b, the worst relative error of the line at a measured point), or None where every pass
    carried the same number of tokens."""
    points = [(b * t, ms) for b, row in table.items() for t, ms in row.items()]
    n_mean = sum(n for n, _ in points) / len(points)
    ms_mean = sum(ms for _, ms in points) / len(points)
    spread = sum((n - n_mean) ** 2 for n, _ in points)
    if spread == 0:
        return None
    slope = sum((n - n_mean) * (ms - ms_mean) for n, ms in points) / spread
    a = ms_mean - slope * n_mean
    return a, slope, max(abs(a + slope * n - ms) / ms for n, ms in points)


def time_extend(drafter, batch: int, args, gen: torch.Generator) -> float:
    """One draft extend over `args.extend_tokens` accepted tokens per row (aux states in), in us."""
    c, dev = drafter.config, drafter.fc.weight.device
    m = args.extend_tokens
    runner = DrafterRunner(drafter)
    runner.reset(batch, args.context + m, dev)
    runner.k.copy_(torch.randn(runner.k.shape, generator=gen))
    runner.v.copy_(torch.randn(runner.v.shape, generator=gen))
    context = torch.full((batch,), args.context, device=dev)
    ids = torch.randint(c.draft_vocab_size, (batch, m), generator=gen).to(dev)
    aux = torch.randn(batch, m, 3 * c.target_hidden_size, generator=gen).to(device=dev, dtype=drafter.fc.weight.dtype)
    counts = torch.full((batch,), m, device=dev)

    def rewind():
        runner.lens = context.clone()

    rewind()
    with torch.no_grad():
        return 1e3 * median_ms(lambda: runner.extend(ids, aux, counts, 1), rewind, dev, args.reps, args.warmup)


def main(argv=None) -> int:
    from drafter_lab.spec.pairing import load_for_target
    from drafter_lab.targets.hf import load_target

    args = parse(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    target = load_target(args.target, device=args.device, dtype=DTYPES[args.dtype], tokenizer=False)
    longest = args.context + max(max(args.tokens), args.extend_tokens if args.drafter else 1)
    limit = getattr(target.config, "max_position_embeddings", None)
    if limit is not None and longest > limit:  # past it: positions the model was not made for, and a dense mask
        raise LabError(f"--context {args.context} plus {longest - args.context} tokens is {longest} positions, past "
                       f"the target's max_position_embeddings {limit}", args.target)
    drafter = load_for_target(args.drafter, target, allow_other_target=True).to(DTYPES[args.dtype]) \
        if args.drafter else None
    aux_ids = drafter.config.aux_layer_ids if drafter is not None else []
    gen = torch.Generator().manual_seed(args.seed)
    table: dict[int, dict[int, float]] = {}
    draft_us: dict[int, float] = {}
    extend_us: dict[int, float] = {}
    points = len(args.batch) * (len(args.tokens) + 2 * bool(drafter))
    with progress("bench verify (batch x tokens)", total=points) as advance:
        for b in args.batch:
            table[b] = {}
            for t in args.tokens:
                table[b][t] = time_verify(target, aux_ids, b, t, args, gen)
                advance(1, batch=b, tokens=t)
            if drafter is not None:
                draft_us[b] = time_draft_step(drafter, b, args, gen)
                extend_us[b] = time_extend(drafter, b, args, gen)
                advance(2, batch=b)
    fit = fit_verify(table)
    print(format_table(table, draft_us, extend_us, fit, target.num_layers))
    if args.json:
        result = {
            "deployment": {"num_layers": target.num_layers, "hidden_size": target.hidden_size,
                           "dtype_bytes": torch.finfo(DTYPES[args.dtype]).bits // 8, "allreduces_per_layer": 0,
                           "cycle_overhead_ms": 0.0, "decode_overhead_ms": 0.0},
            "decode_ms": table[min(table)][1],
            "verify_ms_by_tokens": {str(b): {str(t): ms for t, ms in row.items()} for b, row in table.items()},
            **({"draft_step_us_by_batch": {str(b): us for b, us in draft_us.items()},
                "draft_extend_us_by_batch": {str(b): us for b, us in extend_us.items()}} if draft_us else {}),
            "meta": {
                "target": target.describe(), "drafter": args.drafter, "device": str(target.device),
                "dtype": args.dtype, "context": args.context, "extend_tokens": args.extend_tokens, "aux_layer_ids": aux_ids,
                "threads": torch.get_num_threads(), "reps": args.reps,
                "torch": torch.__version__, "date": datetime.date.today().isoformat(),
                "fit": None if fit is None else dict(zip(("ms_at_zero_tokens", "ms_per_token", "worst_relative_error"), fit)),
            },
        }
        atomic.write_json(args.json, result)
        log(f"wrote {args.json}")
    return 0


def format_table(table, draft_us, extend_us, fit: tuple[float, float, float] | None, layers: int) -> str:
    tokens = sorted({t for row in table.values() for t in row})
    head = f"{'batch':>5} | " + " ".join(f"{'T=' + str(t):>8}" for t in tokens) + (
        f" | {'draft step us':>13} {'extend us':>9}" if draft_us else "")
    lines = ["verify pass, ms (T tokens per row; T = 1 is a plain decode step)", head, "-" * len(head)]
    for b, row in table.items():
        lines.append(f"{b:>5} | " + " ".join(f"{row[t]:>8.3f}" for t in tokens)
                     + (f" | {draft_us[b]:>13.0f} {extend_us[b]:>9.0f}" if draft_us else ""))
    if fit is None:
        lines.append("fit: every pass carried the same tokens (B x T); time two token counts to fit a line")
    else:
        a, slope, worst = fit
        per_token = (f"per layer {1000 * slope / layers:.2f} us per further token (costmodel --verify-token-compute-us)"
                     if slope >= 0 else "no per-token cost to give the cost model (passes got faster with tokens: "
                     "noise; time more passes)")
        lines.append(f"fit: ms = {a:.3f} + {slope:.4f} x (B x T), worst error {100 * worst:.0f} %; {per_token}")
    return "\n".join(lines)


if __name__ == "__main__":
    run_module(main)
