"""`bench replay`: both paths timed on one device, and a fast path that disagrees is refused."""

from __future__ import annotations

import pytest
import torch

from drafter_lab.cli import main
from drafter_lab.train import bench_replay
from drafter_lab.train.ttt import replay_roots, replay_roots_reference


def test_bench_replay_prints_both_paths_and_their_ratio(capsys):
    assert main(["bench", "replay", "--steps", "3", "--shapes", "2x70,1x33", "--reps", "1"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert [r.split(" | ")[0] for r in rows] == ["| 2 x 70", "| 1 x 33"]
    assert all(r.endswith("x |") for r in rows) and "K = 3" in out


def test_bench_replay_refuses_a_fast_path_that_disagrees(monkeypatch, capsys):
    def off_by_a_little(rates, mask):
        tokens, cycles = replay_roots(rates, mask)
        return tokens, cycles * (1 + 1e-6)

    monkeypatch.setattr(bench_replay, "replay_roots", off_by_a_little)
    assert main(["bench", "replay", "--shapes", "1x50", "--reps", "1"]) == 2
    assert "disagrees with the position loop at 1x50" in capsys.readouterr().err


@pytest.mark.parametrize("shape", ["1x0", "2x", "x3", "a"])
def test_bench_replay_bad_shapes(shape, capsys):
    with pytest.raises(SystemExit) as e:
        main(["bench", "replay", "--shapes", shape])
    assert e.value.code == 2 and "expected BxT" in capsys.readouterr().err


@pytest.mark.gpu
def test_replay_roots_on_cuda_equals_the_loop_on_cpu():
    """On a GPU the blocked solve runs on cuSOLVER/cuBLAS: same roots as the CPU loop, fresh inputs."""
    rates = torch.rand(7, 4, 300, dtype=torch.float64)
    mask = torch.rand(4, 300) < 0.9
    got = replay_roots(rates.cuda(), mask.cuda())
    want = replay_roots_reference(rates, mask)
    for g, w in zip(got, want):
        torch.testing.assert_close(g.cpu(), w, rtol=1e-12, atol=0)
