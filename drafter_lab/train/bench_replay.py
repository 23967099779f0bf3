"""Benchmark: the replay's roots solved in blocks against the position loop, on this device.

    drafter-lab bench replay [--steps 7] [--shapes 1x2048,8x2048,1x8192] [--device auto]

A validation that replays a sampled server (`train --val-temperature` on the target's own tokens)
runs `ttt.replay_roots` once per batch. Its reference, `replay_roots_reference`, walks the positions
one by one: a few small ops each, which a GPU launches one at a time. This times both on random
rates over B x T positions (a prompt, then answer tokens with gaps), median of `--reps` synchronised
calls, prints the ratio, and refuses to report a fast path that disagrees with the loop.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from drafter_lab.config import check_seed
from drafter_lab.errors import LabError, run_module
from drafter_lab.targets.hf import resolve_device
from drafter_lab.train.ttt import replay_roots, replay_roots_reference


def shape_list(text: str) -> list[tuple[int, int]]:
    try:
        shapes = [tuple(int(n) for n in s.split("x")) for s in text.split(",")]
    except ValueError:
        shapes = []
    if not shapes or any(len(s) != 2 or min(s) < 1 for s in shapes):
        raise argparse.ArgumentTypeError(f"expected BxT[,BxT...] with positive sizes, got {text!r}")
    return shapes


def parse(argv) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="drafter-lab bench replay", description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=7, help="draft depths replayed (the run's TTT steps K)")
    ap.add_argument("--shapes", type=shape_list, default=[(1, 2048), (8, 2048), (1, 8192)],
                    help="validation batches as rows x positions")
    ap.add_argument("--device", default="auto", help="auto (cuda when available), cpu or cuda")
    ap.add_argument("--reps", type=int, default=9, help="timed calls per shape and path (median)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    for name in ("steps", "reps"):  # the flag typed and its value
        if getattr(args, name) < 1:
            raise LabError(f"--{name} must be >= 1, got {getattr(args, name)}")
    check_seed(args.seed, "--seed")
    args.device = resolve_device(args.device)  # no GPU, or a typo: was torch's traceback, not one line
    return args


def median_ms(fn, inputs: tuple, reps: int, device: torch.device) -> float:
    fn(*inputs)  # warm-up: allocator, solver workspaces
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        fn(*inputs)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def main(argv=None) -> int:
    args = parse(argv)
    device = args.device
    gen = torch.Generator().manual_seed(args.seed)
    K = args.steps
    print(f"replay roots, K = {K}, {device}, torch {torch.__version__}, median of {args.reps} (ms)")
    print("| rows x positions | position loop | blocks | speedup |\n|---|---|---|---|")
    for B, T in args.shapes:
        rates = torch.rand(K, B, T, dtype=torch.float64, generator=gen).to(device)
        mask = torch.rand(B, T, generator=gen) < 0.9
        mask[:, :T // 5] = False  # the prompt
        mask = mask.to(device)
        got, want = replay_roots(rates, mask), replay_roots_reference(rates, mask)
        if not all(torch.allclose(g, w, rtol=1e-9, atol=0) for g, w in zip(got, want)):
            raise LabError(f"the blocked solve disagrees with the position loop at {B}x{T}")
        loop = median_ms(replay_roots_reference, (rates, mask), args.reps, device)
        fast = median_ms(replay_roots, (rates, mask), args.reps, device)
        print(f"| {B} x {T} | {loop:.2f} | {fast:.2f} | {loop / fast:.1f}x |")
    return 0


if __name__ == "__main__":
    run_module(main)
