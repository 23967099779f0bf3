"""CLI: `bench allreduce|draft-forward [ARGS]`, the kernel benchmarks (same as `nox -s bench -- NAME`)."""

from __future__ import annotations

import argparse
import importlib

BENCHES = {
    "allreduce": "drafter_lab.kernels.bench_allreduce",
    "draft-forward": "drafter_lab.kernels.bench_draft_forward",
}


def _bench(args) -> int:
    return importlib.import_module(BENCHES[args.name]).main(args.rest)


def register(sub) -> None:
    b = sub.add_parser("bench", help="kernel benchmarks: allreduce (--tp-sim for the verify step) | draft-forward")
    b.add_argument("name", choices=sorted(BENCHES))
    b.add_argument("rest", nargs=argparse.REMAINDER, help="arguments for the benchmark (see its --help)")
    b.set_defaults(func=_bench)
