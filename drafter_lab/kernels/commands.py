"""CLI: `bench allreduce|draft-forward|verify|replay [ARGS]`, the benchmarks (same as `nox -s bench -- NAME`): the
two kernels', the target's verify pass and the replay's solve (spec- and train-level benchmarks, listed here so
that one command runs them all)."""

from __future__ import annotations

import argparse
import importlib

BENCHES = {
    "allreduce": "drafter_lab.kernels.bench_allreduce",
    "draft-forward": "drafter_lab.kernels.bench_draft_forward",
    "verify": "drafter_lab.spec.bench_verify",
    "replay": "drafter_lab.train.bench_replay",
}


def _bench(args) -> int:
    return importlib.import_module(BENCHES[args.name]).main(args.rest)


def register(sub) -> None:
    b = sub.add_parser("bench", help="benchmarks: allreduce (--tp-sim for the verify step) | draft-forward | "
                                      "verify (the target's pass by batch and tokens) | replay (validation's replay solve)")
    b.add_argument("name", choices=sorted(BENCHES))
    b.add_argument("rest", nargs=argparse.REMAINDER, help="arguments for the benchmark (see its --help)")
    b.set_defaults(func=_bench)
