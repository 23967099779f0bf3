"""Benchmark: the fused draft step against PyTorch, all measured in the same run (DESIGN section 5).

    python -m drafter_lab.kernels.bench_draft_forward [--json PATH]          (H200: the README table)
    python -m drafter_lab.kernels.bench_draft_forward --device cpu           (CPU op vs eager, small shapes)

One EAGLE-3 draft step with fc at context 1024, weights and KV caches rotated over several copies
so that they do not sit in L2, median of event-timed single calls. For each shape and batch it
prints the fused op's time (CUDA-graph replay; eager too), the achieved GB/s, the % of the floor
((weight + KV bytes) / device-copy bandwidth, measured in this run) and the speedup over PyTorch
eager, CUDA-graph replay of the eager reference, and torch.compile of the reference. It also times
the fused op on a step without fc (the drafter's own hidden state in, as at depth >= 1). The JSON
(`--json`) is a cost-model inputs file (drafter_lab/spec/costinputs.py) for one shape, Kimi-K2 when
measured (the seeds' deployment), else the first: "draft_step_us_by_batch" is its step without fc
at every batch measured, "draft_step_us" that at batch 1 (else the smallest batch), and
"draft_extend_us_by_batch" its step with fc, which is a cycle's first draft (the extend over one
accepted token per row); "meta" (every row) sits beside them.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import time
from collections.abc import Callable

import torch

from drafter_lab import atomic
from drafter_lab.drafter.config import DrafterConfig
from drafter_lab.drafter.model import Eagle3Drafter
from drafter_lab.errors import LabError, run_module
from drafter_lab.kernels import _ext
from drafter_lab.kernels import draft_step as ds
from drafter_lab.kernels.bench_allreduce import host_available_bytes
from drafter_lab.progress import log
from drafter_lab.targets.hf import resolve_device

SHAPES = {
    "llama3.1-8b": dict(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                        intermediate_size=14336, draft_vocab_size=32000, target_hidden_size=4096),
    "kimi-k2": dict(hidden_size=7168, num_attention_heads=64, num_key_value_heads=64, head_dim=128,
                    intermediate_size=18432, draft_vocab_size=32000, target_hidden_size=7168),
    # CPU-sized shapes, so that the script itself is exercised without a GPU.
    "tiny": dict(hidden_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                 intermediate_size=704, draft_vocab_size=2000, target_hidden_size=256),
    "small": dict(hidden_size=1024, num_attention_heads=8, num_key_value_heads=2, head_dim=128,
                  intermediate_size=2816, draft_vocab_size=8000, target_hidden_size=1024),
}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
TITLES = {"llama3.1-8b": "Llama-3.1-8B", "kimi-k2": "Kimi-K2"}


def make_drafter(name: str, dtype, device, seed: int) -> Eagle3Drafter:
    """A drafter of the named shape with random weights (the embedding table is kept small), made in
    `dtype`: a float32 drafter cast down held both for a moment, more than check_memory counts."""
    shape = SHAPES[name]
    cfg = DrafterConfig(target_vocab_size=shape["draft_vocab_size"], rope_theta=500000.0, **shape)
    torch.manual_seed(seed)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            drafter = Eagle3Drafter(cfg)
    finally:
        torch.set_default_dtype(default)
    with torch.no_grad():
        for pname, p in drafter.named_parameters():
            if pname.endswith("weight") and p.dim() == 1:
                p.uniform_(0.5, 1.5)
    return drafter.eval()


def step_bytes(drafter: Eagle3Drafter, batch: int, context: int, fc: bool = True) -> tuple[int, int]:
    """Bytes one step must move: every weight it reads (fc's only with `fc`), and the KV cache it
    reads plus writes."""
    skip = {"embed_tokens.weight"} | (set() if fc else {"fc.weight"})
    weights = sum(p.numel() * p.element_size() for n, p in drafter.named_parameters() if n not in skip)
    c = drafter.config
    elem = drafter.fc.weight.element_size()
    kv = 2 * batch * c.num_key_value_heads * (context + 1) * c.head_dim * elem
    return weights, kv


class Timer:
    """Median microseconds of single calls, cycling through one callable per weight copy."""

    def __init__(self, device: torch.device, reps: int, warmup: int):
        self.cuda = device.type == "cuda"
        self.reps, self.warmup = reps, warmup

    def __call__(self, fns: list[Callable]) -> float:
        for i in range(self.warmup):
            fns[i % len(fns)]()
        if not self.cuda:
            times = []
            for i in range(self.reps):
                t0 = time.perf_counter()
                fns[i % len(fns)]()
                times.append(time.perf_counter() - t0)
            return statistics.median(times) * 1e6
        torch.cuda.synchronize()
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(self.reps)]
        for i, (start, end) in enumerate(events):
            start.record()
            fns[i % len(fns)]()
            end.record()
        torch.cuda.synchronize()
        return statistics.median(s.elapsed_time(e) for s, e in events) * 1e3


def copy_bandwidth(device: torch.device, timer: Timer, nbytes: int) -> float:
    """Device-to-device copy bandwidth in GB/s, counting bytes read plus written."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    us = timer([lambda: dst.copy_(src)])
    return 2 * nbytes / us / 1e3


def graphed(fn: Callable) -> Callable:
    """Capture fn into a CUDA graph (after a warm-up on a side stream); returns its replay."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def step_inputs(drafters, batch: int, args, device, fc: bool = True) -> list[tuple]:
    """One set of step inputs per copy: every row at cache_lens = context (the cache holds context+1),
    with the aux states through fc (`fc`) or the drafter's own hidden state."""
    dtype, cfg = DTYPES[args.dtype], drafters[0].config
    gen = torch.Generator(device=device).manual_seed(batch)

    def rand(*shape):  # drawn in dtype: a float32 draw cast down is a moment past what check_memory counts
        return torch.randn(shape, generator=gen, device=device, dtype=dtype)

    cache = (batch, cfg.num_key_value_heads, args.context + 1, cfg.head_dim)
    lens = torch.full((batch,), args.context, dtype=torch.int64, device=device)
    width = 3 * cfg.target_hidden_size if fc else cfg.hidden_size
    return [(rand(batch, cfg.hidden_size), rand(batch, width), lens.clone(), rand(*cache), rand(*cache), lens.clone())
            for _ in drafters]


def step_calls(drafters, inputs, topk: int, fused: bool) -> list[Callable]:
    return [lambda d=d, a=a: ds.draft_step(d, *a, topk, use_fused=fused) for d, a in zip(drafters, inputs)]


def bench_shape(name: str, batches: list[int], args, device: torch.device, timer: Timer, copy_gbs: float) -> list[dict]:
    drafters = [make_drafter(name, DTYPES[args.dtype], device, seed) for seed in range(args.copies)]
    rows = []
    for batch in batches:
        inputs = step_inputs(drafters, batch, args, device)
        row = {"shape": name, "batch": batch}
        weights, kv = step_bytes(drafters[0], batch, args.context)
        row["floor_us"] = (weights + kv) / copy_gbs / 1e3
        with torch.no_grad():
            row["eager_us"] = timer(step_calls(drafters, inputs, args.topk, True))
            row["ref_eager_us"] = timer(step_calls(drafters, inputs, args.topk, False))
            if device.type == "cuda":
                row["us"] = timer([graphed(f) for f in step_calls(drafters, inputs, args.topk, True)])
                row["ref_graph_us"] = timer([graphed(f) for f in step_calls(drafters, inputs, args.topk, False)])
                if args.compile_mode != "none":
                    row["ref_compile_us"] = timer(compiled_calls(drafters, inputs, args))
            else:
                row["us"] = row["eager_us"]
            plain = step_calls(drafters, step_inputs(drafters, batch, args, device, fc=False), args.topk, True)
            row["no_fc_us"] = timer([graphed(f) for f in plain] if device.type == "cuda" else plain)
        weights_no_fc, _ = step_bytes(drafters[0], batch, args.context, fc=False)
        row["no_fc_pct_floor"] = 100 * (weights_no_fc + kv) / copy_gbs / 1e3 / row["no_fc_us"]
        row["gbs"] = (weights + kv) / row["us"] / 1e3
        row["pct_floor"] = 100 * row["floor_us"] / row["us"]
        rows.append(row)
        print_row(row)
        if args.breakdown and device.type == "cuda":
            with torch.no_grad():
                row["kernels_us"] = kernel_breakdown(step_calls(drafters, inputs, args.topk, True), 20)
            print("      kernels (eager, us): " + "  ".join(f"{n} {us:.1f}" for n, us in row["kernels_us"]), flush=True)
        # freed before the next batch's are built, so a run holds the two sets check_memory counts, not three
        del inputs, plain
    return rows


def kernel_breakdown(fns: list[Callable], reps: int) -> list[tuple[str, float]]:
    """Device time of each kernel of one eager call, in launch order (us, mean over reps), from the
    profiler's CUDA activity: where the step's time goes, kernel by kernel."""
    from torch.profiler import ProfilerActivity, profile

    for f in fns:
        f()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(reps):
            fns[i % len(fns)]()
        torch.cuda.synchronize()
    kernels = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                     key=lambda e: e.time_range.start)
    per_call = len(kernels) // reps
    if per_call == 0 or len(kernels) % reps:
        return []
    out = []
    for j in range(per_call):
        name = kernels[j].name.replace("(anonymous namespace)::", "").split("(")[0].split("<")[0].split("::")[-1]
        out.append((name, statistics.mean(kernels[i * per_call + j].time_range.elapsed_us() for i in range(reps))))
    return out


def compiled_calls(drafters, inputs, args) -> list[Callable]:
    """torch.compile of the reference, one compiled callable per copy; captured in a CUDA graph
    unless the mode brings its own (reduce-overhead, max-autotune)."""
    own_graphs = args.compile_mode in ("reduce-overhead", "max-autotune")
    out = []
    for d, a in zip(drafters, inputs):
        fn = torch.compile(d.draft_step, mode=None if args.compile_mode == "default" else args.compile_mode)
        call = lambda fn=fn, a=a: fn(*a, args.topk)  # noqa: E731
        out.append(call if own_graphs else graphed(call))
    return out


def print_row(r: dict) -> None:
    def ratio(key):
        return f"{r[key] / r['us']:.2f}x" if key in r else "n/a"

    print(f"{r['shape']:>12} B={r['batch']:<3} {r['us']:9.1f} us (eager {r['eager_us']:8.1f})  "
          f"{r['gbs']:7.1f} GB/s  {r['pct_floor']:5.1f}% of floor ({r['floor_us']:.1f} us)  "
          f"vs eager {ratio('ref_eager_us')}  graph {ratio('ref_graph_us')}  compile {ratio('ref_compile_us')}  "
          f"| no fc {r['no_fc_us']:.1f} us ({r['no_fc_pct_floor']:.1f}% of floor)", flush=True)


def markdown_table(rows: list[dict]) -> str:
    """The README's table of a run (us); "vs best" is ours against the better of the reference's
    CUDA graph and torch.compile, n/a where neither was measured."""
    def cell(r, key):
        return f"{r[key]:.0f}" if key in r else "n/a"

    lines = ["| drafter shape | batch | floor | ours (% of floor) | ours eager | ref eager | ref CUDA graph "
             "| ref torch.compile | vs best |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        best = min((r[k] for k in ("ref_graph_us", "ref_compile_us") if k in r), default=None)
        vs = "n/a" if best is None else f"{best / r['us']:.2f}x"
        lines.append(f"| {TITLES.get(r['shape'], r['shape'])} | {r['batch']} | {r['floor_us']:.0f} "
                     f"| **{r['us']:.0f}** ({r['pct_floor']:.0f} %) | {cell(r, 'eager_us')} | {cell(r, 'ref_eager_us')} "
                     f"| {cell(r, 'ref_graph_us')} | {cell(r, 'ref_compile_us')} "
                     f"| {vs} |")
    return "\n".join(lines) + "\n"


def parse(argv) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="drafter-lab bench draft-forward", description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--shapes", nargs="+", default=None, choices=sorted(SHAPES),
                    help="default: llama3.1-8b kimi-k2 on CUDA, tiny small on CPU")
    ap.add_argument("--batch", nargs="+", type=int, default=None, help="default: 1 8 32 (CUDA), 1 4 (CPU)")
    ap.add_argument("--context", type=int, default=None, help="KV entries before this step (default 1024; CPU 128)")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default=None, help="default bf16 (CUDA), fp32 (CPU)")
    ap.add_argument("--topk", type=int, default=4)
    ap.add_argument("--copies", type=int, default=4, help="weight/KV copies rotated through (defeats L2)")
    ap.add_argument("--reps", type=int, default=None, help="timed calls per measurement (default 200; CPU 10)")
    ap.add_argument("--warmup", type=int, default=None)
    ap.add_argument("--compile-mode", default=None,
                    choices=["default", "max-autotune-no-cudagraphs", "max-autotune", "reduce-overhead", "none"],
                    help="torch.compile mode for the reference baseline on CUDA (default: default; none: skip it)")
    ap.add_argument("--breakdown", action="store_true", help="also print each kernel's device time (CUDA profiler)")
    ap.add_argument("--json", default=None, help="write the cost model's draft tables and every row (meta) here")
    ap.add_argument("--markdown", default=None, help="write the README's table of this run here")
    args = ap.parse_args(argv)
    atomic.refuse_outputs([("--json", args.json), ("--markdown", args.markdown)])  # written after every shape is timed
    if args.device == "auto":  # resolve_device takes it: pick the defaults of the device it means
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    cpu = args.device.partition(":")[0] == "cpu"  # "cpu:0" too
    if args.breakdown and cpu:  # it printed nothing: the per-kernel times are the CUDA profiler's
        ap.error("--breakdown: per-kernel device times come from the CUDA profiler; not on the CPU")
    if cpu and args.compile_mode not in (None, "none"):  # the header named a mode that never ran
        ap.error("--compile-mode: the torch.compile baseline is timed on CUDA only")
    args.compile_mode = args.compile_mode or ("none" if cpu else "default")
    args.shapes = args.shapes or (["tiny", "small"] if cpu else ["llama3.1-8b", "kimi-k2"])
    args.batch = args.batch or ([1, 4] if cpu else [1, 8, 32])
    # a value given twice was timed twice and printed as two rows (bench allreduce keeps each once too)
    args.shapes, args.batch = list(dict.fromkeys(args.shapes)), list(dict.fromkeys(args.batch))
    args.context = 128 if cpu and args.context is None else (1024 if args.context is None else args.context)
    args.dtype = args.dtype or ("fp32" if cpu else "bf16")
    args.reps = 10 if cpu and args.reps is None else (200 if args.reps is None else args.reps)
    args.warmup = args.warmup if args.warmup is not None else (2 if cpu else 20)
    counts = [(f"--{k}", getattr(args, k), 1) for k in ("context", "topk", "copies", "reps")]
    counts += [("--batch", b, 1) for b in args.batch] + [("--warmup", args.warmup, 0)]
    for flag, value, least in counts:  # each was a traceback deep in the op, or silently replaced by its default
        if value < least:
            ap.error(f"{flag} {value}: must be >= {least}")
    # Both were a traceback deep in the op: past the draft vocab, or past what the CUDA kernels take.
    most = min([SHAPES[s]["draft_vocab_size"] for s in args.shapes] + ([] if cpu else [ds.CUDA_MAX_TOPK]))
    if args.topk > most:
        ap.error(f"--topk {args.topk}: must be <= {most} (the draft vocab{'' if cpu else ', and the CUDA kernels'})")
    return args


def cost_inputs(rows: list[dict]) -> tuple[str, dict]:
    """The cost model's draft tables from one shape's rows: Kimi-K2's when measured, else the first
    shape's; returns (that shape, the tables)."""
    shape = "kimi-k2" if any(r["shape"] == "kimi-k2" for r in rows) else rows[0]["shape"]
    mine = sorted((r for r in rows if r["shape"] == shape), key=lambda r: r["batch"])
    return shape, {
        "draft_step_us": mine[0]["no_fc_us"],
        "draft_step_us_by_batch": {str(r["batch"]): r["no_fc_us"] for r in mine},
        "draft_extend_us_by_batch": {str(r["batch"]): r["us"] for r in mine},
    }


def check_memory(args, device: torch.device) -> None:
    """Refuse, before the timing, a run whose drafters and KV caches cannot fit (else the allocator's
    traceback, or on CPU the OOM killer): each shape holds `--copies` drafters and, at its largest
    batch, two sets of step inputs per copy (with fc and without), whose caches grow with --context."""
    batch, need = max(args.batch), {}
    for name in args.shapes:
        drafter = make_drafter(name, DTYPES[args.dtype], "meta", 0)  # shapes only, no memory
        weights = sum(p.numel() * p.element_size() for p in drafter.parameters())
        need[name] = args.copies * (weights + 2 * step_bytes(drafter, batch, args.context)[1])
    name = max(need, key=need.get)
    have = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else host_available_bytes()
    if need[name] > have:
        raise LabError(f"--context {args.context}: {args.copies} copies of {name} at batch {batch} need "
                       f"{need[name] / 1e9:.1f} GB for weights and KV caches, more than the {have / 1e9:.1f} GB "
                       f"free on {device}")


def main(argv=None) -> int:
    args = parse(argv)
    device = resolve_device(args.device)  # a typo or cuda:N past the GPUs was torch's traceback
    if device.type == "cuda":  # the timer's events, synchronize() and the graphs' side stream use the current one
        if device.index is None:  # a bare "cuda" is the current device; set_device wants an index
            device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)
    if not ds.available(device):
        raise LabError(f"the fused draft_step op has no {device.type} kernel: build drafter_lab._C first")
    check_memory(args, device)
    timer = Timer(device, args.reps, args.warmup)
    copy_gbs = copy_bandwidth(device, timer, (1 << 30) if device.type == "cuda" else (1 << 26))
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({_ext.cpu_isa()} loops)"
    log(f"{name}, torch {torch.__version__}, {args.dtype}, context {args.context}, {args.copies} copies, "
        f"copy bandwidth {copy_gbs:.0f} GB/s, torch.compile mode {args.compile_mode}")
    rows = []
    for shape in args.shapes:
        rows += bench_shape(shape, args.batch, args, device, timer, copy_gbs)
    if args.json:
        shape, tables = cost_inputs(rows)
        result = {
            **tables,
            "meta": {
                "draft_tables_from": shape,
                "extend_tokens": 1,
                "device": name, "torch": torch.__version__, "date": datetime.date.today().isoformat(),
                "dtype": args.dtype, "context": args.context, "topk": args.topk, "copies": args.copies,
                "copy_bandwidth_gbs": copy_gbs, "compile_mode": args.compile_mode,
                "timing": "median of event-timed single calls; us (with fc) and no_fc_us = CUDA-graph replay of "
                          "the fused op (eager on CPU)",
                "rows": rows,
            },
        }
        atomic.write_json(args.json, result)
    if args.markdown:
        atomic.write_text(args.markdown, markdown_table(rows))
    return 0


if __name__ == "__main__":
    run_module(main)
