"""All-reduce benchmark: our shared-memory communicator against torch.distributed in the same run.

    python -m drafter_lab.kernels.bench_allreduce                 latency table, 1 KB..1 MB, 2 and 4 ranks
                                                    (printed; `--json FILE` writes it too)
    python -m drafter_lab.kernels.bench_allreduce --tp-sim        verify-step simulator (JSON for the cost model)
    python -m drafter_lab.kernels.bench_allreduce --gpu-streams   CUDA backends, ranks as streams of one process

Ranks are processes on this host (spawned here), joined by one FileStore: our backends ("cpu";
"cuda-host" and "cuda-ipc" when CUDA is built, one GPU per rank, skipped with fewer GPUs than
ranks) and torch.distributed ("gloo"; "nccl" with CUDA). Latency = median over calls of one
rank's per-call time, then the max over ranks; the baseline is measured in the same processes,
interleaved size by size, so machine load hits both alike.

`--gpu-streams` measures the CUDA backends on a single GPU: the ranks are streams of one process
(processes sharing a GPU are time-sliced, which stalls kernels spinning on a peer), each replaying
a CUDA graph of 20 calls, event-timed, each algorithm forced in turn (LL up to its capacity). It
writes `allreduce_gpu_streams_<blocks>ctas.json` beside `--json`, and beside that, per backend and
rank count, `<stem>.costmodel-<backend>-<N>ranks.json`: each size at its fastest algorithm, the flat
form `drafter-lab costmodel --inputs FILE` reads (`fastest_tables` makes them from the JSON too).

The simulator runs a tensor-parallel verify step at Kimi-like shapes: `--layers` (61) layers, each
with two row-parallel GEMV pairs (hidden 7168 -> `--inner` -> 7168, a stand-in for attention and
MLP shards) followed by an all-reduce of the [tokens, 7168] bfloat16 partial plus the residual add
and RMSNorm (our fused op; torch ops after the baseline's all-reduce) = 122 all-reduces per step.
"none" runs the same step without all-reduces: the compute floor. Its JSON (`--json`, default
runs/bench/allreduce_tp_sim.json):

    {"allreduce_us": {"<backend>": {"<message bytes>": us}},   isolated all-reduce latency
     "verify_ms":    {"<backend>": {"<tokens>": ms}},          one simulated verify step
     "meta":         {ranks, layers, hidden, inner, tokens, dtype, iters, host, torch, date, ...}}

Beside it, `<stem>.costmodel-<backend>.json` = {"allreduce_us": {"<bytes>": us}} per backend:
the flat form `drafter-lab costmodel --inputs FILE` reads.

The latency table with `--json FILE` writes {"allreduce_us": {"<N> ranks, <backend>": {"<bytes>": us}},
"algos": {"<N> ranks, <backend>": {"<bytes>": algorithm}} (ours only), "meta": {...}} and, beside it
as `--gpu-streams` does, `<stem>.costmodel-<backend>-<N>ranks.json` per backend and rank count.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import platform
import socket
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from drafter_lab.atomic import refuse_unwritable, write_json
from drafter_lab.errors import LabError, run_module
from drafter_lab.kernels import _ext
from drafter_lab.kernels.allreduce import BACKENDS as OURS
from drafter_lab.kernels.allreduce import Communicator
from drafter_lab.progress import log

SIZES = [1 << k for k in range(10, 21)]  # 1 KB .. 1 MB
BACKENDS = (*OURS, "gloo", "nccl")
MAX_RANKS = 16  # the communicator's segment has room for 16 ranks (csrc/allreduce/layout.h kMaxRanks)
HIDDEN = 7168
FAILED_RANKS_GRACE_S = 5.0
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
DEFAULT_JSON = "runs/bench/allreduce_tp_sim.json"  # the tp-sim report; gpu-streams writes beside it


def _cuda_backends() -> list[str]:
    if not (torch.cuda.is_available() and _ext.available() and _ext.load().allreduce.with_cuda):
        return []
    return ["cuda-host", "cuda-ipc"]


def default_backends() -> list[str]:
    return ["cpu", "gloo"] + (_cuda_backends() + ["nccl"] if torch.cuda.is_available() else [])


def _for_world(args, world: int) -> argparse.Namespace:
    """args with the GPU backends dropped when there are fewer GPUs than ranks: ranks as processes
    sharing a GPU are time-sliced, so a kernel spinning on a peer would wait for the next slice
    (measure those with --gpu-streams instead)."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    keep = [b for b in args.backends if b in ("cpu", "gloo") or gpus >= world]
    if not keep:  # it would print an empty table, or write a simulator JSON without an all-reduce
        raise LabError(f"{world} ranks: none of {', '.join(args.backends)} can run here ({gpus} GPU(s) visible)")
    if keep != args.backends:
        log(f"{world} ranks: skipping {', '.join(sorted(set(args.backends) - set(keep)))} ({gpus} GPU(s) visible)")
    return argparse.Namespace(**{**vars(args), "backends": keep})


def _device(backend: str, rank: int) -> torch.device:
    if backend in ("cpu", "gloo", "none"):
        return torch.device("cpu")
    return torch.device("cuda", rank % torch.cuda.device_count())


class _Group:
    """One rank's view of every backend under test, with a gloo group for the bookkeeping."""

    def __init__(self, rank: int, world: int, store_path: str, backends: list[str], timeout_s: float):
        self.rank, self.world = rank, world
        store = dist.FileStore(store_path, world)
        dist.init_process_group("gloo", store=dist.PrefixStore("gloo", store), rank=rank, world_size=world)
        self.nccl = None
        if "nccl" in backends:
            self.nccl = dist.new_group(backend="nccl")
        self.comms = {
            b: Communicator(rank, world, store=store, name=b, backend=b, timeout_s=timeout_s, device=_device(b, rank))
            for b in backends
            if b in OURS
        }

    def all_reduce_fn(self, backend: str, t: torch.Tensor):
        if backend in self.comms:
            comm = self.comms[backend]
            return lambda: comm.all_reduce(t)
        group = self.nccl if backend == "nccl" else None
        return lambda: dist.all_reduce(t, group=group)

    def sync(self, backend: str) -> None:
        if backend not in ("cpu", "gloo", "none"):
            torch.cuda.synchronize(_device(backend, self.rank))

    def max_over_ranks(self, values: list[float]) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.tolist()

    def close(self) -> None:
        for c in self.comms.values():
            c.close()
        dist.destroy_process_group()


def _median_us(group: _Group, backend: str, fn, iters: int, warmup: int) -> float:
    for _ in range(warmup):
        fn()
    group.sync(backend)
    dist.barrier()
    samples = []
    for _ in range(iters):
        t0 = time.perf_counter_ns()
        fn()
        group.sync(backend)
        samples.append(time.perf_counter_ns() - t0)
    return statistics.median(samples) / 1000


def _iters(nbytes: int, base: int) -> int:
    return min(base, max(50, base * (64 << 10) // nbytes))


def _algo_name(comm: Communicator, nbytes: int) -> str:
    """What `comm` runs for a sum of `nbytes` by its thresholds: a sum beyond its capacity runs as
    chunks of the capacity, each picked by its own size (named by the first, with their count)."""
    chunks = -(-nbytes // comm.capacity)
    size = min(nbytes, comm.capacity)
    name = ("LL" if size <= min(comm.ll_max_bytes, comm.ll_capacity)
            else "1-shot" if size <= comm.one_shot_max_bytes else "2-shot")
    return name if chunks == 1 else f"{chunks}x {name}"


def _latency_worker(rank, world, store_path, args, queue):
    torch.set_num_threads(1)
    group = _Group(rank, world, store_path, args.backends, args.timeout)
    dtype = DTYPES[args.dtype]
    results = {b: {} for b in args.backends}
    for nbytes in args.sizes:
        numel = max(1, nbytes // dtype.itemsize)
        for b in args.backends:
            t = torch.randn(numel, device=_device(b, rank)).to(dtype)
            results[b][nbytes] = _median_us(group, b, group.all_reduce_fn(b, t), _iters(nbytes, args.iters), 20)
        if rank == 0:
            queue.put(("progress", nbytes))
    flat = group.max_over_ranks([results[b][s] for b in args.backends for s in args.sizes])
    algos = {b: {s: _algo_name(c, s) for s in args.sizes} for b, c in group.comms.items()}
    if rank == 0:
        it = iter(flat)
        queue.put(("done", {b: {s: next(it) for s in args.sizes} for b in args.backends}, algos))
    group.close()


def _rmsnorm(r: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    rf = r.float()
    return (rf * torch.rsqrt(rf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(r.dtype)


def _verify_step(group: _Group, backend: str, x, residual, weights, norm_w, layers: int):
    """One simulated verify pass; returns the final normed hidden state."""
    comm = group.comms.get(backend)
    w_in, w_out = weights
    for _ in range(layers):
        for _half in range(2):  # attention, then MLP
            partial = ((x.float() @ w_in) @ w_out).to(x.dtype)
            if comm is not None:
                x, residual = comm.allreduce_residual_rmsnorm(partial, residual, norm_w, 1e-6, out=partial, residual_out=residual)
            else:
                if backend != "none":
                    dist.all_reduce(partial, group=group.nccl if backend == "nccl" else None)
                residual = partial + residual
                x = _rmsnorm(residual, norm_w, 1e-6)
    return x


def _tp_sim_worker(rank, world, store_path, args, queue):
    torch.set_num_threads(1)
    group = _Group(rank, world, store_path, args.backends, args.timeout)
    dtype = DTYPES[args.dtype]
    backends = ["none"] + args.backends
    gen = torch.Generator().manual_seed(1234 + rank)
    allreduce_us = {b: {} for b in args.backends}
    verify_ms = {b: {} for b in backends}
    for tokens in args.tokens:
        nbytes = tokens * HIDDEN * dtype.itemsize
        inputs = {}
        for b in backends:
            dev = _device(b, rank)
            if b != "none":
                t = torch.randn(tokens * HIDDEN, generator=gen).to(device=dev, dtype=dtype)
                allreduce_us[b][nbytes] = _median_us(group, b, group.all_reduce_fn(b, t), args.iters, 20)
            weights = (
                torch.randn(HIDDEN, args.inner, generator=gen).to(dev) / HIDDEN**0.5,
                torch.randn(args.inner, HIDDEN, generator=gen).to(dev) / args.inner**0.5,
            )
            norm_w = torch.ones(HIDDEN, dtype=dtype, device=dev)
            inputs[b] = (torch.randn(tokens, HIDDEN, generator=gen).to(device=dev, dtype=dtype), weights, norm_w)
        samples = {b: [] for b in backends}
        for rep in range(args.sim_reps + 1):  # backends interleaved, so load changes hit them alike
            for b in backends:
                x0, weights, norm_w = inputs[b]
                x, residual = x0.clone(), x0.clone()
                group.sync(b)
                dist.barrier()
                t0 = time.perf_counter()
                _verify_step(group, b, x, residual, weights, norm_w, args.layers)
                group.sync(b)
                if rep:
                    samples[b].append((time.perf_counter() - t0) * 1000)
        for b in backends:
            verify_ms[b][tokens] = statistics.median(samples[b])
        if rank == 0:
            queue.put(("progress", tokens))
    keys_ar = [(b, s) for b in args.backends for s in allreduce_us[b]]
    keys_v = [(b, t) for b in backends for t in args.tokens]
    flat = group.max_over_ranks([allreduce_us[b][s] for b, s in keys_ar] + [verify_ms[b][t] for b, t in keys_v])
    if rank == 0:
        ar = {b: {} for b in args.backends}
        vm = {b: {} for b in backends}
        for (b, s), v in zip(keys_ar, flat):
            ar[b][s] = v
        for (b, t), v in zip(keys_v, flat[len(keys_ar):]):
            vm[b][t] = v
        queue.put(("done", ar, vm))
    group.close()


def _run(worker, world: int, args, total: int, what: str):
    """Spawns `world` ranks of `worker`; returns rank 0's result, showing its progress."""
    from drafter_lab.progress import progress

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="bench_allreduce.") as tmp:
        store_path = os.path.join(tmp, "store")
        procs = [ctx.Process(target=worker, args=(r, world, store_path, args, queue)) for r in range(world)]
        for p in procs:
            p.start()
        result = None
        with progress(what, total) as advance:
            while result is None:
                try:
                    msg = queue.get(timeout=1.0)
                except Exception:
                    if any(p.exitcode not in (None, 0) for p in procs):
                        break
                    continue
                if msg[0] == "progress":
                    advance()
                else:
                    result = msg[1:]
        # After a failure the others may wait on the dead rank for their whole timeout (gloo's
        # rendezvous: 30 minutes): they get a few seconds to say why, then are killed.
        deadline = time.monotonic() + (60 if result is not None else FAILED_RANKS_GRACE_S)
        for p in procs:
            p.join(timeout=max(0.0, deadline - time.monotonic()))
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()  # reaped, so its exit code reads -9, not None
        _unlink_segments({p.pid for p in procs})
        if result is None:
            codes = [p.exitcode for p in procs]
            raise LabError(f"benchmark ranks failed (exit codes {codes}); see their tracebacks above")
    return result


def _unlink_segments(pids: set[int]) -> None:
    """Remove the segments these (dead) ranks created: one killed, or dead, before every peer had
    mapped it leaves its name in /dev/shm. Rank 0 names them "drafter_lab_ar.<its pid>.<random>"
    (csrc/allreduce/segment.cpp unique_segment_name)."""
    creators = {str(pid) for pid in pids}
    for path in Path("/dev/shm").glob("drafter_lab_ar.*"):
        if path.name.split(".")[1] in creators:
            with contextlib.suppress(OSError):
                path.unlink()


def host_available_bytes() -> int:
    """Memory a new allocation could have now: MemAvailable (free plus reclaimable cache), else the free pages."""
    with contextlib.suppress(OSError, ValueError):
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def check_sizes(args) -> None:
    """Refuse, before the ranks start, a message that cannot fit: each rank draws it in float32 on its
    device, and past the memory every rank printed its allocator's traceback."""
    nbytes = max(args.sizes)
    per_rank = nbytes + 4 * (nbytes // DTYPES[args.dtype].itemsize)
    world = max(args.ranks)
    host = not args.gpu_streams and {"cpu", "gloo"} & set(args.backends)  # the streams' ranks are on GPUs only
    if host and world * per_rank > (have := host_available_bytes()):
        raise LabError(f"--sizes {nbytes}: {world} ranks drawing the message in float32 need {_gb(world * per_rank)}, "
                       f"more than the {_gb(have)} of memory available")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus and set(args.backends) - {"cpu", "gloo"}:
        need = (-(-world // gpus) if args.gpu_streams else 1) * per_rank  # streams beyond the GPUs share them
        if need > (have := min(torch.cuda.get_device_properties(d).total_memory for d in range(gpus))):
            raise LabError(f"--sizes {nbytes}: the ranks on a GPU drawing the message in float32 need {_gb(need)}, "
                           f"more than its {_gb(have)}")


def check_tp_sim(args, world: int) -> None:
    """check_sizes for the simulator, before its ranks start: each holds, per backend on its device, the
    [max tokens, hidden] input and the float32 GEMV weights, plus a step's copies (x, residual, partial)
    and RMSNorm's float32 temporaries (the "none" backend's, or the baseline's, on the host). Past the
    memory every rank printed its allocator's traceback, or the OOM killer ended them."""
    dtype = DTYPES[args.dtype]
    tokens = max(args.tokens)
    message, weights = tokens * HIDDEN * dtype.itemsize, 2 * HIDDEN * args.inner * 4
    step = 5 * message + 3 * tokens * HIDDEN * 4 + weights // 2  # + the weights' float32 draw

    def need(backends: int) -> int:
        return backends * (message + weights) + step

    what = f"--tokens {tokens} and --inner {args.inner}"
    on_host = 1 + len({"cpu", "gloo"} & set(args.backends))  # with "none"
    if world * need(on_host) > (have := host_available_bytes()):
        raise LabError(f"{what}: {world} ranks simulating the verify step need {_gb(world * need(on_host))}, "
                       f"more than the {_gb(have)} of memory available")
    if on_gpu := len(set(args.backends) - {"cpu", "gloo"}):  # one GPU per rank (_for_world)
        have = min(torch.cuda.get_device_properties(d).total_memory for d in range(torch.cuda.device_count()))
        if need(on_gpu) > have:
            raise LabError(f"{what}: each rank simulating the verify step on its GPU needs {_gb(need(on_gpu))}, "
                           f"more than its {_gb(have)}")


def _gb(n: int) -> str:
    """Bytes to 0.1 of the largest unit they fill, so a small need does not read "0.0 GB"."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def _fmt_size(n: int) -> str:
    if n >= 1 << 20 and n % (1 << 20) == 0:
        return f"{n >> 20} MB"
    return f"{n >> 10} KB" if n % 1024 == 0 else f"{n} B"


def latency_table(args) -> dict:
    all_results, all_algos = {}, {}
    for world in args.ranks:
        wargs = _for_world(args, world)
        ours = [b for b in wargs.backends if b in OURS]
        base = [b for b in wargs.backends if b not in ours]
        results, algos = _run(_latency_worker, world, wargs, len(args.sizes), f"all-reduce, {world} ranks")
        all_results[world], all_algos[world] = results, algos
        tiles = f" ({_ext.cpu_isa()} tiles)" if ours else ""
        print(f"\nall-reduce latency, {args.dtype}, {world} ranks on this host{tiles}: median us per call (max over ranks)")
        head = f"{'size':>8} " + "".join(f"{b:>11}" for b in wargs.backends)
        head += "".join(f"{o + ' algo':>16}" for o in ours) + "".join(f"{f'{bb}/{o}':>16}" for o in ours for bb in base)
        print(head)
        for s in args.sizes:
            row = f"{_fmt_size(s):>8} " + "".join(f"{results[b][s]:>11.2f}" for b in wargs.backends)
            row += "".join(f"{algos[o][s]:>16}" for o in ours)
            row += "".join(f"{results[bb][s] / results[o][s]:>15.1f}x" for o in ours for bb in base)
            print(row)
    if args.json is not None:
        _write_latency_json(args, all_results, all_algos)
    return all_results


def _write_latency_json(args, results: dict, algos: dict) -> None:
    """The latency table keyed as --gpu-streams keys its columns ("<N> ranks, <backend>"), so the cost
    model refuses it by name and `fastest_tables` gives one flat table per backend and rank count."""
    def keyed(by_world: dict) -> dict:
        return {f"{w} ranks, {b}": {str(s): v for s, v in col.items()} for w, cols in by_world.items() for b, col in cols.items()}

    columns = keyed(results)
    out = Path(args.json)
    write_json(out, {
        "allreduce_us": columns,
        "algos": keyed(algos),
        "meta": {"dtype": args.dtype, "ranks": list(results), "iters": args.iters, "host": socket.gethostname(),
                 "cpu_count": os.cpu_count(), "machine": platform.machine(), "torch": torch.__version__,
                 "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                 "how": "ranks as processes on this host, median us per call, max over ranks"},
    })
    for name, table in fastest_tables(columns).items():
        write_json(out.with_name(f"{out.stem}.costmodel-{name}.json"), {"allreduce_us": table})
    log(f"wrote {out} (+ {out.stem}.costmodel-<backend>-<N>ranks.json)")


def tp_sim(args) -> dict:
    world = args.ranks[0]
    args = _for_world(args, world)
    check_tp_sim(args, world)
    ar, vm = _run(_tp_sim_worker, world, args, len(args.tokens), f"verify-step simulator, {world} ranks")
    dtype = DTYPES[args.dtype]
    print(f"\nsimulated verify step: {world} ranks, {args.layers} layers x 2 all-reduces, hidden {HIDDEN}, {args.dtype}")
    print(f"{'tokens':>6} {'bytes':>8} " + "".join(f"{b + ' ms':>12}" for b in vm) + "   all-reduce us: " + " ".join(ar))
    for t in args.tokens:
        nbytes = t * HIDDEN * dtype.itemsize
        print(f"{t:>6} {nbytes:>8} " + "".join(f"{vm[b][t]:>12.2f}" for b in vm) + "   " + " ".join(f"{ar[b][nbytes]:.1f}" for b in ar))
    report = {
        "allreduce_us": {b: {str(s): v for s, v in d.items()} for b, d in ar.items()},
        "verify_ms": {b: {str(t): v for t, v in d.items()} for b, d in vm.items()},
        "meta": {
            "ranks": world,
            "layers": args.layers,
            "allreduces_per_step": 2 * args.layers,
            "hidden": HIDDEN,
            "inner": args.inner,
            "tokens": args.tokens,
            "dtype": args.dtype,
            "iters": args.iters,
            "sim_reps": args.sim_reps,
            "host": socket.gethostname(),
            "cpu_count": os.cpu_count(),
            "machine": platform.machine(),
            "torch": torch.__version__,
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "note": "verify_ms['none'] is the same step without all-reduces (compute floor)",
        },
    }
    out = Path(args.json)
    write_json(out, report)
    for b, table in report["allreduce_us"].items():
        write_json(out.with_name(f"{out.stem}.costmodel-{b}.json"), {"allreduce_us": table})
    log(f"wrote {out} (+ {out.stem}.costmodel-<backend>.json)")
    return report


def _graph_latency_us(comms, numel: int, dtype: torch.dtype, reps: int, calls: int = 20) -> float:
    """Per-call latency of `calls` all-reduces captured in one CUDA graph per rank, the ranks'
    graphs replayed together on their own streams; event-timed, median over replays, max over ranks."""
    streams = [torch.cuda.Stream(device=c.device) for c in comms]
    xs = [torch.randn(numel, device=c.device).to(dtype) for c in comms]
    ys = [torch.empty_like(x) for x in xs]
    graphs = []
    for c, s, x, y in zip(comms, streams, xs, ys):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.device(c.device), torch.cuda.graph(g, stream=s):
            for _ in range(calls):
                c.all_reduce(x, out=y)
        graphs.append(g)
    samples = []
    for rep in range(reps + 3):
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in comms]
        for c, s, g, (e0, e1) in zip(comms, streams, graphs, ev):
            with torch.cuda.device(c.device), torch.cuda.stream(s):
                e0.record()
                g.replay()
                e1.record()
        for s in streams:
            s.synchronize()
        for c in comms:
            c.check()
        if rep >= 3:
            samples.append(max(e0.elapsed_time(e1) for e0, e1 in ev) * 1000 / calls)
    return statistics.median(samples)


def _best(cols: dict, backend: str, size: int) -> str:
    """The fastest algorithm of `backend` at `size` among the columns, as 'us (algo)'."""
    timed = {k.removeprefix(backend + " "): col[size] for k, col in cols.items() if k.startswith(backend + " ") and size in col}
    algo = min(timed, key=timed.get)
    return f"{timed[algo]:.2f} ({algo})"


def fastest_tables(allreduce_us: dict) -> dict[str, dict[str, float]]:
    """{"<N> ranks, <backend> <algo>": {"<bytes>": us}} (the --gpu-streams JSON) -> {"<backend>-<N>ranks":
    {"<bytes>": us of the fastest algorithm at that size}}: what the communicator picks, for the cost model."""
    fastest: dict[str, dict[str, float]] = {}
    for column, sizes in allreduce_us.items():
        ranks, _, name = column.partition(" ranks, ")
        backend = name.rsplit(" ", 1)[0]
        table = fastest.setdefault(f"{backend}-{ranks}ranks", {})
        for size, us in sizes.items():
            table[size] = min(us, table.get(size, us))
    return {k: dict(sorted(t.items(), key=lambda kv: int(kv[0]))) for k, t in fastest.items()}


def gpu_streams(args) -> dict:
    """CUDA backends with the ranks as streams of this process (one GPU is enough)."""
    from concurrent.futures import ThreadPoolExecutor

    backends = [b for b in args.backends if b in ("cuda-host", "cuda-ipc")]
    if not _cuda_backends():  # asked for by name without a GPU: was a ZeroDivisionError below
        raise LabError("--gpu-streams needs the CUDA backends: a CUDA build of drafter_lab._C and a visible GPU")
    if not backends:
        raise LabError(f"--gpu-streams needs the CUDA backends: --backends {' '.join(args.backends)} "
                       "names neither cuda-host nor cuda-ipc")
    dtype = DTYPES[args.dtype]
    gpus = torch.cuda.device_count()
    results = {}
    for world in args.ranks:
        cols = {}
        for b in backends:
            tag = f"bench-{os.getpid()}-{b}-{world}"
            with ThreadPoolExecutor(world) as pool:  # each constructor waits for all ranks
                comms = list(
                    pool.map(
                        lambda r, b=b, tag=tag, world=world: Communicator(
                            r, world, name=tag, backend=b, device=r % gpus, timeout_s=args.timeout, one_shot_max_bytes=0,
                            blocks=args.blocks,
                        ),
                        range(world),
                    )
                )
            cap, ll_cap = comms[0].capacity, comms[0].ll_capacity
            for algo, one_shot, ll in (("1-shot", cap, 0), ("2-shot", 0, 0), ("LL", cap, ll_cap)):
                for c in comms:
                    c.one_shot_max_bytes, c.ll_max_bytes = one_shot, ll
                cols[f"{b} {algo}"] = {
                    s: _graph_latency_us(comms, max(1, s // dtype.itemsize), dtype, args.sim_reps * 4)
                    for s in args.sizes
                    if algo != "LL" or s <= ll_cap
                }
            for c in comms:
                c.close()
        results[world] = cols
        print(f"\nCUDA all-reduce, {args.dtype}, {world} ranks as streams on {gpus} GPU(s), {args.blocks} CTAs: us per call (graph replays)")
        print(f"{'size':>8} " + "".join(f"{k:>18}" for k in cols) + "".join(f"{b + ' best':>22}" for b in backends))
        for s in args.sizes:
            row = "".join(f"{cols[k][s]:>18.2f}" if s in cols[k] else f"{'-':>18}" for k in cols)
            print(f"{_fmt_size(s):>8} " + row + "".join(f"{_best(cols, b, s):>22}" for b in backends))
    out = Path(args.json).with_name(f"allreduce_gpu_streams_{args.blocks}ctas.json")
    columns = {f"{w} ranks, {k}": {str(s): v for s, v in col.items()} for w, cols in results.items() for k, col in cols.items()}
    write_json(out, {
        "allreduce_us": columns,
        "meta": {"dtype": args.dtype, "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
                 "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                 "blocks": args.blocks, "how": "ranks as streams of one process, 20 calls per CUDA graph, median over replays"},
    })
    for name, table in fastest_tables(columns).items():
        write_json(out.with_name(f"{out.stem}.costmodel-{name}.json"), {"allreduce_us": table})
    log(f"wrote {out} (+ {out.stem}.costmodel-<backend>-<N>ranks.json)")
    return results


def build_parser() -> argparse.ArgumentParser:
    # The CLI's name, as bench verify and replay give theirs (`python -m` runs the same parser).
    p = argparse.ArgumentParser(prog="drafter-lab bench allreduce", description=__doc__.split("\n\n")[0])
    p.add_argument("--tp-sim", action="store_true", help="run the verify-step simulator instead of the latency table")
    p.add_argument("--gpu-streams", action="store_true", help="CUDA backends, ranks as streams of one process")
    p.add_argument("--ranks", type=int, nargs="+", default=None, help="process counts (default 2 4; tp-sim: its first, default 2)")
    p.add_argument("--backends", nargs="+", default=None, help=f"default {' '.join(default_backends())}")
    p.add_argument("--sizes", type=int, nargs="+", default=SIZES, help="message bytes (default 1 KB .. 1 MB)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    p.add_argument("--iters", type=int, default=2000, help="timed calls per size up to 64 KB (fewer above, but at least 50 unless ITERS is lower)")
    p.add_argument("--timeout", type=float, default=30.0, help="all-reduce timeout, seconds")
    p.add_argument("--blocks", type=int, default=16, help="gpu-streams: CTAs per all-reduce kernel")
    p.add_argument("--tokens", type=int, nargs="+", default=[1, 2, 4, 8], help="tp-sim: verify tokens")
    p.add_argument("--layers", type=int, default=61, help="tp-sim: layers (2 all-reduces each)")
    p.add_argument("--inner", type=int, default=32, help="tp-sim: per-rank shard width of the GEMV stand-in")
    p.add_argument("--sim-reps", type=int, default=5, help="tp-sim: timed verify steps per point")
    p.add_argument("--json", default=None,
                   help=f"output JSON (tp-sim and gpu-streams: default {DEFAULT_JSON}; the latency table is "
                        "printed, and written only when this is given)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.ranks = args.ranks or ([2] if args.tp_sim else [2, 4])
    # a value given twice was timed twice and printed as two rows (as --sizes is, each once)
    args.backends = list(dict.fromkeys(args.backends or default_backends()))
    args.ranks, args.tokens = list(dict.fromkeys(args.ranks)), list(dict.fromkeys(args.tokens))
    if bad := [r for r in args.ranks if not 1 <= r <= MAX_RANKS]:  # only those out of range: "got 2 17" hid which
        raise LabError(f"--ranks must be in 1..{MAX_RANKS}, got {' '.join(map(str, bad))}")
    if unknown := sorted(set(args.backends) - set(BACKENDS)):
        raise LabError(f"unknown backend(s) {', '.join(unknown)}; known: {', '.join(BACKENDS)}")
    counts = {"--iters": [args.iters], "--sizes": args.sizes, "--tokens": args.tokens, "--layers": [args.layers],
              "--inner": [args.inner], "--sim-reps": [args.sim_reps], "--blocks": [args.blocks]}
    for flag, values in counts.items():  # each was a rank's traceback, a silent 2-byte message or a 0-byte row
        if bad := [v for v in values if v < 1]:  # those below one, not the list they were typed in
            raise LabError(f"{flag} must be at least 1, got {' '.join(map(str, bad))}")
    if not 0 < args.timeout < float("inf"):
        raise LabError(f"--timeout must be a positive number of seconds, got {args.timeout}")
    itemsize = DTYPES[args.dtype].itemsize  # what is sent: whole elements, at least one, so label those bytes
    args.sizes = list(dict.fromkeys(max(1, s // itemsize) * itemsize for s in args.sizes))
    if not _ext.available():
        raise LabError(_ext.unavailable_reason())
    # each writes beside --json after its minutes of timing; the latency table only when --json is given
    if args.tp_sim:
        args.json = args.json or DEFAULT_JSON
        refuse_unwritable(args.json, "--json")
        tp_sim(args)
    elif args.gpu_streams:
        args.json = args.json or DEFAULT_JSON
        refuse_unwritable(Path(args.json).with_name(f"allreduce_gpu_streams_{args.blocks}ctas.json"), "--json")
        check_sizes(args)
        gpu_streams(args)
    else:
        if args.json is not None:
            refuse_unwritable(args.json, "--json")
        check_sizes(args)
        latency_table(args)
    return 0


if __name__ == "__main__":
    run_module(main)
