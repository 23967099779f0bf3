"""Mutation audit (review s65): `bench replay`'s table puts each path's time in its column, a time is the
median of --reps calls after a warm-up, and bad shapes and seeds are refused up front."""

from __future__ import annotations

import types

import pytest
import torch

from drafter_lab.cli import main
from drafter_lab.errors import LabError
from drafter_lab.train import bench_replay


def test_the_table_reads_loop_then_blocks_then_the_loops_multiple(monkeypatch, capsys):
    fixed = {bench_replay.replay_roots_reference: 6.0, bench_replay.replay_roots: 2.0}
    monkeypatch.setattr(bench_replay, "median_ms", lambda fn, inputs, reps, device: fixed[fn])
    assert main(["bench", "replay", "--steps", "2", "--shapes", "1x16", "--reps", "1", "--device", "cpu"]) == 0
    assert "| 1 x 16 | 6.00 | 2.00 | 3.0x |" in capsys.readouterr().out.splitlines()


def test_a_time_is_the_median_of_the_timed_calls_after_one_warm_up(monkeypatch):
    ticks = iter([0.0, 0.001, 1.0, 1.005, 2.0, 2.002])  # 1, 5 and 2 ms
    monkeypatch.setattr(bench_replay, "time", types.SimpleNamespace(perf_counter=lambda: next(ticks)))
    calls = []
    ms = bench_replay.median_ms(lambda: calls.append(1), (), 3, torch.device("cpu"))
    assert ms == pytest.approx(2.0) and len(calls) == 4


def test_a_shape_of_three_sizes_is_refused(capsys):
    with pytest.raises(SystemExit) as e:
        main(["bench", "replay", "--shapes", "1x2x3"])
    assert e.value.code == 2 and "expected BxT" in capsys.readouterr().err


def test_a_seed_torch_cannot_take_is_one_line():
    with pytest.raises(LabError, match=r"^--seed must be in -2\*\*63\.\.2\*\*64-1"):
        bench_replay.parse(["--device", "cpu", "--seed", str(2**64)])
